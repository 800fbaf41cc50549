package podconfig

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/trust"
)

// writeSecret writes data as the kubelet mounts a Secret: one file per key.
func writeSecret(t *testing.T, data map[string][]byte) string {
	t.Helper()
	dir := t.TempDir()
	for k, b := range data {
		if err := os.WriteFile(filepath.Join(dir, k), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// The installation's CA certificate travels to the sidecars as key ca.crt of their
// configuration Secret and back out of it; a configuration without it (TLS off) has none,
// and one larger than a bundle of certificates is refused at load, naming the file.
func TestConfigCarriesTheInstallationCA(t *testing.T) {
	wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "wf"}}
	ca := []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
	data, err := (&Config{Workflow: wf, NATSURL: "tls://sluice-nats:4222", CA: ca}).Data()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(data[v1alpha1.SecretKeyInstallationCA], ca) {
		t.Fatalf("the Secret's %s is %q", v1alpha1.SecretKeyInstallationCA, data[v1alpha1.SecretKeyInstallationCA])
	}
	got, err := Load(writeSecret(t, data))
	if err != nil || !bytes.Equal(got.CA, ca) {
		t.Fatalf("loaded CA %q, %v", got.CA, err)
	}

	plain, err := (&Config{Workflow: wf, NATSURL: "nats://sluice-nats:4222"}).Data()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := plain[v1alpha1.SecretKeyInstallationCA]; ok {
		t.Error("a configuration without TLS has a CA key")
	}
	if got, err := Load(writeSecret(t, plain)); err != nil || got.CA != nil {
		t.Errorf("loaded CA %q, %v; want none", got.CA, err)
	}

	data[v1alpha1.SecretKeyInstallationCA] = bytes.Repeat([]byte("x"), trust.MaxCA+1)
	if _, err := Load(writeSecret(t, data)); err == nil || !strings.Contains(err.Error(), v1alpha1.SecretKeyInstallationCA) {
		t.Errorf("an oversized CA: %v, want an error naming the file", err)
	}
}
