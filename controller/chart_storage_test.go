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
