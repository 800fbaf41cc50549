package controller

import (
	"bytes"
	"errors"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// clusterScoped are the cluster-scoped kinds kustomize gives a namespace anyway.
var clusterScoped = map[string]bool{"ValidatingAdmissionPolicy": true, "ValidatingAdmissionPolicyBinding": true}

// objects decodes a multi-document YAML stream into objects keyed kind/namespace/name.
func objects(t *testing.T, what string, stream []byte) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(stream), 4096)
	for {
		var obj map[string]any
		err := dec.Decode(&obj)
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if obj == nil {
			continue
		}
		u := unstructured.Unstructured{Object: obj}
		if clusterScoped[u.GetKind()] {
			// kubectl's kustomize does not know these kinds are cluster-scoped and sets
			// the base's namespace on them; the API server ignores it.
			u.SetNamespace("")
		}
		out[u.GetKind()+"/"+u.GetNamespace()+"/"+u.GetName()] = obj
	}
}

// With its default values the Helm chart installs exactly what deploy/base does (the
// Namespace aside: Helm installs into an existing one), so the two ways to install cannot
// drift apart; but for TLS, on by default in the chart and a component in kustomize
// (TestHelmChartTLS compares the chart's default with deploy/overlays/tls).
func TestHelmChartMatchesKustomizeBase(t *testing.T) {
	// deploy/base ships no storage keys: the chart bringing its own Secrets.
	chartMatchesKustomize(t, "base", "storage.createSecret=false", "storage.minio.createRootSecret=false", "tls.enabled=false")
}

// chartMatchesKustomize renders deploy/<kustomization> with kustomize and the chart with
// the values set, and fails t for every object one has and the other has not, or has
// otherwise. It returns the chart's objects.
func chartMatchesKustomize(t *testing.T, kustomization string, set ...string) map[string]map[string]any {
	t.Helper()
	dir := assets(t)
	kustomized, err := exec.Command(filepath.Join(dir, "kubectl"), "kustomize", filepath.Join("..", "deploy", kustomization)).Output()
	if err != nil {
		t.Fatalf("kustomize deploy/%s: %v", kustomization, err)
	}
	base, chart := objects(t, "deploy/"+kustomization, kustomized), renderChart(t, set...)
	delete(base, "Namespace//sluice-system")
	var keys []string
	for k := range base {
		keys = append(keys, k)
	}
	for k := range chart {
		if _, ok := base[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		b, inBase := base[k]
		c, inChart := chart[k]
		switch {
		case !inChart:
			t.Errorf("%s is in deploy/%s but not rendered by the chart", k, kustomization)
		case !inBase:
			t.Errorf("%s is rendered by the chart but not in deploy/%s", k, kustomization)
		case !equality.Semantic.DeepEqual(b, c):
			by, _ := yaml.Marshal(b)
			cy, _ := yaml.Marshal(c)
			t.Errorf("%s differs:\n--- deploy/%s\n%s\n--- charts/sluice\n%s", k, kustomization, by, cy)
		}
	}
	return chart
}

// renderChart renders the chart (CRDs included) into namespace sluice-system with the
// values set, as objects keyed kind/namespace/name.
func renderChart(t *testing.T, set ...string) map[string]map[string]any {
	t.Helper()
	var args []string
	for _, v := range set {
		args = append(args, "--set", v)
	}
	return objects(t, "charts/sluice", helmTemplate(t, args...))
}

// helmTemplate renders the chart as release sluice in sluice-system, CRDs included, with
// helm's further args.
func helmTemplate(t *testing.T, args ...string) []byte {
	t.Helper()
	helm, err := exec.Command(filepath.Join("..", "hack", "tools.sh"), "helm").Output()
	if err != nil {
		t.Fatalf("hack/tools.sh helm: %v", err)
	}
	args = append([]string{"template", "sluice", filepath.Join("..", "charts", "sluice"), "--namespace", "sluice-system", "--include-crds"}, args...)
	cmd := exec.Command(strings.TrimSpace(string(helm)), args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	rendered, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, stderr.String())
	}
	return rendered
}

// The controller refuses what the CSI plugins would cap: one chart value gives both the
// same per-workflow maxima, the memory maximum defaulting to the store's size.
func TestHelmChartGivesControllerAndPluginTheSameTierMaxima(t *testing.T) {
	for _, c := range []struct {
		set  []string
		want []string
	}{
		{want: []string{"--workflow-memory-max=2Gi"}},
		{set: []string{"csi.storeSize=8Gi", "csi.workflowDiskMax=20Gi"},
			want: []string{"--workflow-memory-max=8Gi", "--workflow-disk-max=20Gi"}},
		{set: []string{"csi.workflowMemoryMax=1Gi"}, want: []string{"--workflow-memory-max=1Gi"}},
	} {
		objs := renderChart(t, append([]string{"storage.trial=true"}, c.set...)...)
		for _, k := range []string{"Deployment/sluice-system/sluice-controller", "DaemonSet/sluice-system/sluice-csi"} {
			args := firstContainerArgs(t, objs, k)
			for _, w := range c.want {
				if !slices.Contains(args, w) {
					t.Errorf("%v: %s runs with %v, without %s", c.set, k, args, w)
				}
			}
		}
	}
}

// The node plugins' store servers connect to the installation's NATS, the controller's,
// never to a URL a workflow's sidecar handed over: the chart pins it for every way NATS
// is installed.
func TestHelmChartPinsTheStoreServersNATS(t *testing.T) {
	for _, c := range []struct {
		set  []string
		want string
	}{
		{want: "--nats-url=tls://sluice-nats.sluice-system.svc:4222"},
		{set: []string{"tls.enabled=false"}, want: "--nats-url=nats://sluice-nats.sluice-system.svc:4222"},
		{set: []string{"nats.bundled=false", "nats.url=tls://nats.example:4222"}, want: "--nats-url=tls://nats.example:4222"},
	} {
		objs := renderChart(t, append([]string{"storage.trial=true"}, c.set...)...)
		for _, k := range []string{"Deployment/sluice-system/sluice-controller", "DaemonSet/sluice-system/sluice-csi"} {
			args := firstContainerArgs(t, objs, k)
			if !slices.Contains(args, c.want) {
				t.Errorf("%v: %s runs with %v, without %s", c.set, k, args, c.want)
			}
		}
	}
}

// firstContainerArgs returns the args of the first container of the workload key
// ("Kind/namespace/name") among the rendered objects.
func firstContainerArgs(t *testing.T, objs map[string]map[string]any, key string) []string {
	t.Helper()
	cs, _, _ := unstructured.NestedSlice(objs[key], "spec", "template", "spec", "containers")
	if len(cs) == 0 {
		t.Fatalf("%s: no containers", key)
	}
	args, _, _ := unstructured.NestedStringSlice(cs[0].(map[string]any), "args")
	return args
}

// The node plugin's container has a memory limit, never below what the kernel charges
// it for workflow bytes: its store servers write the other nodes' files into the
// workflows' tmpfs mounts, up to csi.storeSize together. Unset, the limit is the store's
// size plus 2Gi; an operator's own limit stands.
func TestHelmChartBoundsThePluginsMemoryAboveTheStore(t *testing.T) {
	for _, c := range []struct {
		set  []string
		want string
	}{
		{want: "4Gi"},
		{set: []string{"csi.storeSize=8Gi"}, want: "10Gi"},
		{set: []string{"csi.storeSize=512Mi"}, want: "2560Mi"},
		{set: []string{"csi.storeSize=8Gi", "csi.resources.limits.memory=12Gi"}, want: "12Gi"},
	} {
		objs := renderChart(t, append([]string{"storage.trial=true"}, c.set...)...)
		cs, _, _ := unstructured.NestedSlice(objs["DaemonSet/sluice-system/sluice-csi"], "spec", "template", "spec", "containers")
		for _, ct := range cs {
			m := ct.(map[string]any)
			got, _, _ := unstructured.NestedString(m, "resources", "limits", "memory")
			if m["name"] == "csi" && got != c.want {
				t.Errorf("%v: the plugin's memory limit is %q, want %s", c.set, got, c.want)
			}
			if got == "" {
				t.Errorf("%v: container %v has no memory limit", c.set, m["name"])
			}
		}
	}
}
