package testutil

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats-server/v2/server"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/controller/certs"
)

// ServerTLS is a serving certificate for servers on the loopback address, as the
// controller issues it for the bundled NATS and MinIO (certs.Certs), written to files.
type ServerTLS struct {
	// CA is the CA certificate (PEM) clients trust.
	CA []byte
	// Dir holds tls.crt, tls.key and ca.crt, the keys of the Secret the servers mount.
	Dir string

	issuer *certs.Certs
}

// CertFile is the path of the serving certificate (tls.crt).
func (s *ServerTLS) CertFile() string { return filepath.Join(s.Dir, corev1.TLSCertKey) }

// KeyFile is the path of the serving key (tls.key).
func (s *ServerTLS) KeyFile() string { return filepath.Join(s.Dir, corev1.TLSPrivateKeyKey) }

// IssueServerTLS issues, with the controller's certs.Certs, a CA and a serving
// certificate for 127.0.0.1 and writes them under a temporary directory of t.
func IssueServerTLS(t testing.TB) *ServerTLS {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	s := &ServerTLS{Dir: t.TempDir()}
	s.issuer = &certs.Certs{Client: fake.NewClientBuilder().WithScheme(scheme).Build(), Namespace: "sluice-system",
		SecretName: "sluice-tls", Name: "sluice-tls", Services: []string{"sluice-nats"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)},
		Log: logr.Discard()}
	s.write(t)
	return s
}

// Renew renews the certificate as the controller does when a third of its validity
// remains (a new certificate from the same CA) and replaces the files, each at once, as
// the kubelet updates a mounted Secret.
func (s *ServerTLS) Renew(t testing.TB) {
	t.Helper()
	var sec corev1.Secret
	if err := s.issuer.Client.Get(context.Background(), types.NamespacedName{Namespace: "sluice-system", Name: "sluice-tls"}, &sec); err != nil {
		t.Fatal(err)
	}
	// Without its certificate the Secret is renewed at once, with the stored CA.
	delete(sec.Data, corev1.TLSCertKey)
	if err := s.issuer.Client.Update(context.Background(), &sec); err != nil {
		t.Fatal(err)
	}
	s.write(t)
}

// write issues (or keeps) the certificate and writes the Secret's keys into Dir.
func (s *ServerTLS) write(t testing.TB) {
	t.Helper()
	ctx := context.Background()
	if _, err := s.issuer.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	var sec corev1.Secret
	if err := s.issuer.Client.Get(ctx, types.NamespacedName{Namespace: "sluice-system", Name: "sluice-tls"}, &sec); err != nil {
		t.Fatal(err)
	}
	s.CA = sec.Data[v1alpha1.SecretKeyCA]
	for _, k := range []string{corev1.TLSCertKey, corev1.TLSPrivateKeyKey, v1alpha1.SecretKeyCA} {
		p := filepath.Join(s.Dir, k)
		if err := os.WriteFile(p+".tmp", sec.Data[k], 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(p+".tmp", p); err != nil {
			t.Fatal(err)
		}
	}
}

// NATSTLS starts an in-process nats-server with JetStream whose client port serves TLS
// only with s's certificate, as the bundled server does with TLS on; it stops when t ends.
// It returns the client URL, tls://127.0.0.1:<port>.
func NATSTLS(t testing.TB, s *ServerTLS) string {
	t.Helper()
	tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: s.CertFile(), KeyFile: s.KeyFile()})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true,
		StoreDir: t.TempDir(), NoSigs: true, NoLog: true, TLSConfig: tc, TLSTimeout: 5, MaxPayload: 2 << 20})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(30 * time.Second) {
		srv.Shutdown()
		t.Fatal("nats-server with TLS not ready after 30s")
	}
	t.Cleanup(srv.Shutdown)
	return "tls://" + srv.Addr().String()
}
