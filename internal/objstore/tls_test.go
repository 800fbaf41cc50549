package objstore

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/internal/servers"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/internal/testutil"
)

// A MinIO that serves TLS with the certificate the controller issues for the bundled one
// takes every client of the installation that trusts the CA: the minio-setup container's
// (SetupMinIOUser), the controller's (NewMinIOAccounts) and the sidecars' (Open, Put);
// a client without the CA, or over plain HTTP, is refused.
func TestMinIOOverTLSTrustsTheInstallationCA(t *testing.T) {
	testenv.Integration(t, "MinIO")
	tlsFiles := testutil.IssueServerTLS(t)
	cert, err := os.ReadFile(tlsFiles.CertFile())
	if err != nil {
		t.Fatal(err)
	}
	key, err := os.ReadFile(tlsFiles.KeyFile())
	if err != nil {
		t.Fatal(err)
	}
	m, err := servers.StartMinIOTLS(t.TempDir(), servers.ServerCert{Cert: cert, Key: key, CA: tlsFiles.CA})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Stop)
	ctx := context.Background()
	if _, err := m.Bucket(ctx, "results"); err != nil {
		t.Fatal(err)
	}
	root := Credentials{AccessKey: m.AccessKey, SecretKey: m.SecretKey, CA: tlsFiles.CA}
	if err := SetupMinIOUser(ctx, m.Endpoint, true, root, "sluice-installation", "installation-secret-1", "results"); err != nil {
		t.Fatalf("minio-setup over TLS: %v", err)
	}
	installation := Credentials{AccessKey: "sluice-installation", SecretKey: "installation-secret-1", CA: tlsFiles.CA}
	accounts, err := NewMinIOAccounts(m.Endpoint, true, installation)
	if err != nil {
		t.Fatal(err)
	}
	acc := Account{AccessKey: "sluice-wf-tls", SecretKey: "secret-of-workflow-tls", Bucket: "results", Prefix: "ns/wf/", Namespace: "ns", NamespacePrefix: "ns/", Description: "ns/wf"}
	if err := accounts.Ensure(ctx, acc); err != nil {
		t.Fatalf("the controller's workflow account over TLS: %v", err)
	}
	if err := accounts.Ensure(ctx, acc); err != nil { // an existing account: its keys are tried
		t.Fatalf("the controller's workflow account over TLS, again: %v", err)
	}
	src := putOverTLS(ctx, t, m, m.Endpoint, acc, tlsFiles.CA)
	// Plain HTTP to the TLS port is refused.
	plain, err := Open(ctx, "s3://results/ns/wf?endpoint="+m.Endpoint, Credentials{AccessKey: acc.AccessKey, SecretKey: acc.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	plain.(*S3).RetryFor = 1
	if _, err := plain.Put(ctx, "plain.txt", src); err == nil {
		t.Error("a plain HTTP client stored an object on the TLS endpoint")
	}
	// A CA with TLS off is a configuration error, not a silent plain connection.
	if _, err := Open(ctx, "s3://results/ns/wf?endpoint="+m.Endpoint, installation); err == nil {
		t.Error("Open accepted a CA for a plain endpoint")
	}
}

// A versitygw serving TLS on its S3 and admin ports, with a certificate of the
// installation's CA, takes every client that trusts the CA: the installation's account
// made with the root keys (SetupVersityGWUser), the controller's accounts
// (NewVersityGWAccounts) and a workflow's uploads (Open, Put); a client without the CA is
// refused at once, naming the certificate.
func TestVersityGWOverTLSTrustsTheInstallationCA(t *testing.T) {
	testenv.Integration(t, "versitygw")
	tlsFiles := testutil.IssueServerTLS(t)
	cert, err := os.ReadFile(tlsFiles.CertFile())
	if err != nil {
		t.Fatal(err)
	}
	key, err := os.ReadFile(tlsFiles.KeyFile())
	if err != nil {
		t.Fatal(err)
	}
	g, err := servers.StartVersityGWTLS(t.TempDir(), servers.ServerCert{Cert: cert, Key: key, CA: tlsFiles.CA})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Stop)
	ctx := context.Background()
	if _, err := g.Bucket(ctx, "results"); err != nil {
		t.Fatal(err)
	}
	root := Credentials{AccessKey: g.AccessKey, SecretKey: g.SecretKey, CA: tlsFiles.CA}
	if err := SetupVersityGWUser(ctx, g.AdminEndpoint, true, root, "sluice-installation", "installation-secret-1"); err != nil {
		t.Fatalf("the installation's account over TLS: %v", err)
	}
	installation := Credentials{AccessKey: "sluice-installation", SecretKey: "installation-secret-1", CA: tlsFiles.CA}
	accounts, err := NewVersityGWAccounts(g.Endpoint, g.AdminEndpoint, "results", true, installation)
	if err != nil {
		t.Fatal(err)
	}
	acc := Account{AccessKey: "sluicetlstlstlstls01", SecretKey: "secret-of-workflow-tls", Bucket: "results", Prefix: "ns/wf/", Namespace: "ns", NamespacePrefix: "ns/"}
	if err := accounts.Ensure(ctx, acc); err != nil {
		t.Fatalf("the controller's workflow account over TLS: %v", err)
	}
	putOverTLS(ctx, t, g, g.Endpoint, acc, tlsFiles.CA)
	if err := SetupVersityGWUser(ctx, g.AdminEndpoint, true, Credentials{AccessKey: g.AccessKey, SecretKey: g.SecretKey}, "sluice-other", "other-secret-1"); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("the admin API without the CA: %v, want a refused certificate", err)
	}
}

// putOverTLS stores ns/wf/out.txt in bucket "results" of the TLS endpoint with acc's keys
// and the CA ca, checks the bytes through srv, and checks that a client without the CA is
// refused the certificate at once (a configuration error, not retried for minutes as
// while the endpoint is down). It returns the uploaded file's path.
func putOverTLS(ctx context.Context, t *testing.T, srv objectReader, endpoint string, acc Account, ca []byte) string {
	t.Helper()
	src := filepath.Join(t.TempDir(), "out.txt")
	if err := os.WriteFile(src, []byte("over TLS\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	url := "s3://results/ns/wf?endpoint=" + endpoint + "&secure=true"
	st, err := Open(ctx, url, Credentials{AccessKey: acc.AccessKey, SecretKey: acc.SecretKey, CA: ca})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Put(ctx, "out.txt", src); err != nil {
		t.Fatalf("a sidecar's Put over TLS: %v", err)
	}
	if b, err := srv.Object(ctx, "results", "ns/wf/out.txt"); err != nil || string(b) != "over TLS\n" {
		t.Fatalf("stored object %q, %v", b, err)
	}
	noCA, err := Open(ctx, url, Credentials{AccessKey: acc.AccessKey, SecretKey: acc.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := noCA.Put(ctx, "untrusted.txt", src); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("a client without the CA: %v, want a refused certificate", err)
	} else if d := time.Since(start); d > 30*time.Second {
		t.Errorf("a client without the CA retried for %v", d)
	}
	return src
}
