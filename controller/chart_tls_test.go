package controller

import (
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// With its default values (tls.enabled is on by default, issue 43) the chart installs
// what deploy/overlays/tls (the base and components/tls) does: the controller issues the CA and certificate into sluice-tls and
// every client uses TLS (tls:// NATS URL, --storage-secure, the setup container's
// --secure --ca-file); NATS and MinIO mount the serving certificate and key, MinIO serves
// them from its certificates directory and is probed over HTTPS; and no pod mounts the
// CA's key.
func TestHelmChartTLS(t *testing.T) {
	chart := chartMatchesKustomize(t, "overlays/tls", "storage.createSecret=false", "storage.minio.createRootSecret=false")
	containers := func(chart map[string]map[string]any, key string) []any {
		t.Helper()
		obj, ok := chart[key]
		if !ok {
			t.Fatalf("%s not rendered", key)
		}
		cs, _, _ := unstructured.NestedSlice(obj, "spec", "template", "spec", "containers")
		return cs
	}
	args := func(c any) []string {
		a, _, _ := unstructured.NestedStringSlice(c.(map[string]any), "args")
		return a
	}
	ctrl := args(containers(chart, "Deployment/sluice-system/sluice-controller")[0])
	for _, want := range []string{"--nats-url=tls://sluice-nats.sluice-system.svc:4222", "--storage-secure", "--tls-secret=sluice-tls", "--nats-tls-dir=/etc/nats-tls"} {
		if !slices.Contains(ctrl, want) {
			t.Errorf("the controller's args %q lack %s", ctrl, want)
		}
	}
	minio := containers(chart, "Deployment/sluice-system/sluice-minio")
	if a := args(minio[0]); !slices.Contains(a, "--certs-dir=/etc/minio/certs") {
		t.Errorf("MinIO's args %q name no certificates directory", a)
	}
	if scheme, _, _ := unstructured.NestedString(minio[0].(map[string]any), "readinessProbe", "httpGet", "scheme"); scheme != "HTTPS" {
		t.Errorf("MinIO's readiness probe scheme %q, want HTTPS", scheme)
	}
	if a := args(minio[1]); !slices.Contains(a, "--secure") || !slices.Contains(a, "--ca-file=/etc/minio/certs/CAs/ca.crt") {
		t.Errorf("the setup container's args %q do not verify MinIO's certificate", a)
	}
	nats := containers(chart, "StatefulSet/sluice-system/sluice-nats")[0].(map[string]any)
	if a := args(nats); !slices.Contains(a, "--reload-on-change=/etc/nats-tls/tls.crt,/etc/nats-tls/tls.key") {
		t.Errorf("NATS's args %q do not reload a renewed certificate", a)
	}
	mounts, _, _ := unstructured.NestedSlice(nats, "volumeMounts")
	if !strings.Contains(toYAML(t, mounts), "mountPath: /etc/nats-tls") {
		t.Errorf("NATS does not mount its certificate at /etc/nats-tls: %s", toYAML(t, mounts))
	}
	for key, obj := range chart {
		if strings.Contains(toYAML(t, obj), "ca.key") {
			t.Errorf("%s names ca.key: the CA's key must stay in the Secret", key)
		}
	}

	// An issuer other than the controller (cert-manager): the controller only reads the
	// Secret. (Off, the default, is deploy/base: TestHelmChartMatchesKustomizeBase.)
	external := args(containers(renderChart(t, "storage.trial=true", "tls.enabled=true", "tls.issuer=external"), "Deployment/sluice-system/sluice-controller")[0])
	if !slices.Contains(external, "--manage-tls-certs=false") {
		t.Errorf("tls.issuer=external: the controller's args %q still issue the certificate", external)
	}
}

func toYAML(t *testing.T, v any) string {
	t.Helper()
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
