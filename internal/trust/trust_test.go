package trust

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A CA that holds no certificate, or more than MaxCA bytes, is an error rather than a
// configuration that would silently trust the system's roots alone; ReadFile names the
// file.
func TestConfigRefusesWhatIsNoCA(t *testing.T) {
	for name, ca := range map[string][]byte{
		"empty":     nil,
		"not PEM":   []byte("not a certificate"),
		"too large": bytes.Repeat([]byte("x"), MaxCA+1),
	} {
		if _, err := Config(ca); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	p := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(p, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadFile(p); err == nil || !bytes.Contains([]byte(err.Error()), []byte(p)) {
		t.Errorf("ReadFile of a bad CA: %v, want an error naming %s", err, p)
	}
	if _, err := ReadFile(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("ReadFile of a missing file: no error")
	}
}

// A CA certificate gives a configuration that asks for TLS 1.2 at least.
func TestConfigTrustsTheCA(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test-ca"}, IsCA: true,
		BasicConstraintsValid: true, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	tc, err := Config(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	if err != nil {
		t.Fatal(err)
	}
	if tc.MinVersion != tls.VersionTLS12 || tc.RootCAs == nil || tc.InsecureSkipVerify {
		t.Errorf("MinVersion %x, roots %v, InsecureSkipVerify %v", tc.MinVersion, tc.RootCAs != nil, tc.InsecureSkipVerify)
	}
}
