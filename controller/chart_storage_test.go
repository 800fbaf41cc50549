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
