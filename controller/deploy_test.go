package controller

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/sluice-io/sluice/api/v1alpha1"
)

// deploy/ renders with kustomize and every object in it is accepted by a real
// kube-apiserver (server-side dry run: schema, CSIDriver and webhook validation, RBAC
// objects), for the base and each overlay; the cert-manager overlay against cert-manager's
// own CRDs.
func TestDeployManifestsAreAccepted(t *testing.T) {
	dir := assets(t)
	kubectl := filepath.Join(dir, "kubectl")
	if _, err := os.Stat(kubectl); err != nil {
		t.Fatalf("kubectl: %v (hack/cluster/build.sh builds it)", err)
	}
	te := &envtest.Environment{BinaryAssetsDirectory: dir}
	cfg, err := te.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = te.Stop() })
	user, err := te.AddUser(envtest.User{Name: "admin", Groups: []string{"system:masters"}}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	// kubectl keeps its discovery cache in ~/.kube/cache unless told: the test's own.
	cacheDir := t.TempDir()
	if err := os.WriteFile(kubeconfig, kc, 0o600); err != nil {
		t.Fatal(err)
	}
	k8s := startClient(t, te)
	// The namespaces first: a server dry run creates no namespace for the objects after it.
	for _, ns := range []string{"sluice-system", v1alpha1.DefaultAgentNamespace} {
		if err := k8s.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	crds := filepath.Join(dir, "..", "crds", "cert-manager")
	apply := exec.Command(kubectl, "--kubeconfig", kubeconfig, "--cache-dir", cacheDir, "apply", "-f", filepath.Join(crds, "certificates.yaml"), "-f", filepath.Join(crds, "issuers.yaml"))
	if out, err := apply.CombinedOutput(); err != nil {
		t.Fatalf("installing cert-manager's CRDs from %s (hack/cluster/build.sh copies them): %v\n%s", crds, err, out)
	}
	wait := exec.Command(kubectl, "--kubeconfig", kubeconfig, "--cache-dir", cacheDir, "wait", "--for=condition=Established", "--timeout=60s",
		"crd/certificates.cert-manager.io", "crd/issuers.cert-manager.io")
	if out, err := wait.CombinedOutput(); err != nil {
		t.Fatalf("cert-manager's CRDs not established: %v\n%s", err, out)
	}
	extra := map[string][]string{"overlays/cert-manager": {"certificate.cert-manager.io/sluice-webhook", "issuer.cert-manager.io/sluice-selfsigned"}}
	for _, k := range []string{"base", "overlays/kind", "overlays/cert-manager", "overlays/tls"} {
		path := filepath.Join("..", "deploy", k)
		rendered, err := exec.Command(kubectl, "kustomize", path).Output()
		if err != nil {
			t.Fatalf("kustomize %s: %v", path, err)
		}
		// The CRD first for real, so that nothing depends on the order of the dry run.
		cmd := exec.Command(kubectl, "--kubeconfig", kubeconfig, "--cache-dir", cacheDir, "apply", "--dry-run=server", "-f", "-")
		cmd.Stdin = strings.NewReader(string(rendered))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("%s rejected by the API server: %v\n%s", path, err, out)
			continue
		}
		wants := append([]string{"csidriver.storage.k8s.io/csi.sluice.io", "mutatingwebhookconfiguration.admissionregistration.k8s.io/sluice",
			"customresourcedefinition.apiextensions.k8s.io/workflows.sluice.io", "daemonset.apps/sluice-csi", "deployment.apps/sluice-controller", "statefulset.apps/sluice-nats"},
			extra[k]...)
		for _, want := range wants {
			if !strings.Contains(string(out), want) {
				t.Errorf("%s: %s missing from the applied objects:\n%s", path, want, out)
			}
		}
	}

	// The admission policy is in force: homeNode Hashing is refused with the reason,
	// Create accepted.
	install := exec.Command(kubectl, "--kubeconfig", kubeconfig, "--cache-dir", cacheDir, "apply", "-f", filepath.Join("..", "crds", "sluice.io_workflows.yaml"),
		"-f", filepath.Join("..", "deploy", "base", "admission.yaml"))
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("installing the CRD and the admission policy: %v\n%s", err, out)
	}
	workflow := func(policy string) error {
		cmd := exec.Command(kubectl, "--kubeconfig", kubeconfig, "--cache-dir", cacheDir, "-n", "sluice-system", "apply", "--dry-run=server", "-f", "-")
		cmd.Stdin = strings.NewReader(`apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: w}
spec:
  homeNode: {policy: ` + policy + `}
  steps:
  - name: a
    template: {spec: {containers: [{name: c, image: busybox}]}}
`)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%w: %s", err, out)
		}
		return nil
	}
	eventually(t, time.Minute, "the admission policy refuses homeNode Hashing", func() error {
		err := workflow("Hashing")
		if err == nil {
			return errors.New("a Workflow with homeNode.policy Hashing was accepted")
		}
		if !strings.Contains(err.Error(), "the Hashing policy is not supported on a cluster") {
			return err
		}
		return nil
	})
	if err := workflow("Create"); err != nil {
		t.Errorf("a Workflow with homeNode.policy Create was refused: %v", err)
	}
}
