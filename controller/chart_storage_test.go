package controller

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-io/sluice/internal/testenv"
)

// The chart refuses its own trial object-storage keys unless storage.trial says the
// installation is a trial, and then renders MinIO's root keys into a Secret only the MinIO
// pod reads, apart from the installation's user's keys the controller gets.
func TestHelmChartRefusesTrialStorageKeys(t *testing.T) {
	testenv.Integration(t, "helm (hack/tools.sh helm builds it)")
	helm, err := exec.Command(filepath.Join("..", "hack", "tools.sh"), "helm").Output()
	if err != nil {
		t.Fatalf("hack/tools.sh helm: %v", err)
	}
	render := func(set ...string) (string, error) {
		args := []string{"template", "sluice", filepath.Join("..", "charts", "sluice"), "--namespace", "sluice-system"}
		for _, s := range set {
			args = append(args, "--set", s)
		}
		var out, stderr bytes.Buffer
		cmd := exec.Command(strings.TrimSpace(string(helm)), args...)
		cmd.Stdout, cmd.Stderr = &out, &stderr
		err := cmd.Run()
		return out.String() + stderr.String(), err
	}
	if out, err := render(); err == nil || !strings.Contains(out, "storage.trial=true") {
		t.Errorf("default values (trial keys, no storage.trial) rendered: %v\n%.300s", err, out)
	}
	if out, err := render("storage.secretKey=own-secret-1", "storage.minio.rootPassword=sluice-root-change-me"); err == nil {
		t.Errorf("MinIO's trial root password rendered without storage.trial:\n%.300s", out)
	}
	out, err := render("storage.secretKey=own-secret-1", "storage.minio.rootPassword=own-root-password")
	if err != nil {
		t.Fatalf("own keys refused: %v\n%s", err, out)
	}
	if !strings.Contains(out, "name: sluice-minio-root") || !strings.Contains(out, "args: [minio-setup") {
		t.Errorf("no MinIO root Secret or setup container rendered")
	}
	if _, err := render("storage.trial=true"); err != nil {
		t.Errorf("trial keys refused with storage.trial=true: %v", err)
	}
}

// deploy/base ships no object-storage keys, as the chart renders its trial keys only
// with storage.trial (issue 43: the base shipped them with no check): neither it nor the
// tls and cert-manager overlays hold Secret sluice-storage or sluice-minio-root, so an
// installation from them gets its keys from its operator or waits for them; only the
// overlays of trial clusters (kind, local) add the well-known keys, through the
// component deploy/components/trial-keys, into sluice-system.
func TestDeployBaseShipsNoTrialKeys(t *testing.T) {
	kubectl := filepath.Join(assets(t), "kubectl")
	for _, tc := range []struct {
		dir   string
		trial bool
	}{{"base", false}, {"overlays/tls", false}, {"overlays/cert-manager", false}, {"overlays/kind", true}, {"overlays/local", true}} {
		out, err := exec.Command(kubectl, "kustomize", filepath.Join("..", "deploy", tc.dir)).Output()
		if err != nil {
			t.Fatalf("kustomize %s: %v", tc.dir, err)
		}
		s := string(out)
		for _, key := range []string{"sluice-change-me", "sluice-root-change-me", "kind: Secret\nmetadata:\n  name: sluice-storage\n", "kind: Secret\nmetadata:\n  name: sluice-minio-root\n"} {
			if got := strings.Contains(s, key); got != tc.trial {
				t.Errorf("deploy/%s holds %q: %v, want %v", tc.dir, strings.TrimSpace(key), got, tc.trial)
			}
		}
		if tc.trial && !strings.Contains(s, "name: sluice-storage\n  namespace: sluice-system\n") {
			t.Errorf("deploy/%s: the trial Secret is not in sluice-system", tc.dir)
		}
	}
}

// helmTemplateOutput renders the chart with --set values and returns its output and
// error output together, and helm's error.
func helmTemplateOutput(t *testing.T, set ...string) (string, error) {
	t.Helper()
	helm, err := exec.Command(filepath.Join("..", "hack", "tools.sh"), "helm").Output()
	if err != nil {
		t.Fatalf("hack/tools.sh helm: %v", err)
	}
	args := []string{"template", "sluice", filepath.Join("..", "charts", "sluice"), "--namespace", "sluice-system"}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	var out, stderr bytes.Buffer
	cmd := exec.Command(strings.TrimSpace(string(helm)), args...)
	cmd.Stdout, cmd.Stderr = &out, &stderr
	err = cmd.Run()
	return out.String() + stderr.String(), err
}

// storage.accounts reaches the controller as --storage-accounts (and adminEndpoint as
// --storage-admin-endpoint) for storage of the operator's own; the default, minio, adds
// no flag; the bundled storage (MinIO) takes minio only, and an unknown value is refused.
func TestHelmChartStorageAccounts(t *testing.T) {
	testenv.Integration(t, "helm (hack/tools.sh helm builds it)")
	own := []string{"storage.trial=true", "storage.bundled=false", "storage.endpoint=versitygw.storage.svc:7070"}
	out, err := helmTemplateOutput(t, append(own, "storage.accounts=versitygw", "storage.adminEndpoint=versitygw.storage.svc:7071")...)
	if err != nil {
		t.Fatalf("versitygw: %v\n%s", err, out)
	}
	for _, want := range []string{"--storage-accounts=versitygw", "--storage-admin-endpoint=versitygw.storage.svc:7071", "--storage-endpoint=versitygw.storage.svc:7070"} {
		if !strings.Contains(out, want) {
			t.Errorf("versitygw: no %s in the controller's arguments", want)
		}
	}
	out, err = helmTemplateOutput(t, "storage.trial=true")
	if err != nil {
		t.Fatalf("defaults: %v\n%s", err, out)
	}
	if strings.Contains(out, "--storage-accounts") || strings.Contains(out, "--storage-admin-endpoint") {
		t.Error("the default (bundled MinIO) renders a --storage-accounts or --storage-admin-endpoint flag")
	}
	for _, tc := range []struct {
		set  []string
		want string
	}{
		{[]string{"storage.trial=true", "storage.accounts=versitygw"}, "storage.accounts must be minio with storage.bundled"},
		{append(own, "storage.accounts=seaweedfs"), "storage.accounts must be minio, versitygw or none"},
	} {
		if out, err := helmTemplateOutput(t, tc.set...); err == nil || !strings.Contains(out, tc.want) {
			t.Errorf("%v: %v, want %q", tc.set, err, tc.want)
		}
	}
}
