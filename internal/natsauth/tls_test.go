package natsauth

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/testutil"
	"github.com/sluice-io/sluice/internal/transport"
)

// With TLS on, the configuration Bootstrap writes makes the NATS server's client port
// TLS only with the certificate the controller issues: a client that trusts the CA
// connects (and its connection is TLS), one that does not trust it, or does not speak
// TLS, is refused; a tls:// URL never falls back to plain text. Monitoring stays plain on
// the loopback interface. Switching TLS on or off rewrites the configuration with the
// same keys.
func TestBootstrapServesTLSOnly(t *testing.T) {
	ctx := context.Background()
	c := fakeClient(t)
	key := types.NamespacedName{Namespace: "sluice-system", Name: "sluice-nats"}
	tlsFiles := testutil.IssueServerTLS(t)
	keys, _, err := Bootstrap(ctx, c, key.Namespace, key.Name, DefaultQuota, tlsFiles.Dir)
	if err != nil {
		t.Fatal(err)
	}
	var sec corev1.Secret
	if err := c.Get(ctx, key, &sec); err != nil {
		t.Fatal(err)
	}
	conf := string(sec.Data[v1alpha1.SecretKeyNATSConfig])
	if !strings.Contains(conf, "cert_file: \""+tlsFiles.CertFile()+"\"") || !strings.Contains(conf, "key_file: \""+tlsFiles.KeyFile()+"\"") {
		t.Fatalf("the configuration has no tls block with the certificate and key:\n%s", conf)
	}
	file := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(file, []byte(testConfig(t, conf)), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(file)
	if err != nil {
		t.Fatalf("nats-server refused the configuration with TLS: %v", err)
	}
	if opts.TLSConfig == nil || opts.AllowNonTLS {
		t.Fatalf("the client port is not TLS only (TLSConfig %v, AllowNonTLS %v)", opts.TLSConfig != nil, opts.AllowNonTLS)
	}
	if opts.HTTPHost != "127.0.0.1" || opts.HTTPPort != 8222 || opts.HTTPSPort != 0 {
		t.Errorf("monitoring listens on %s:%d (https %d), want plain 127.0.0.1:8222", opts.HTTPHost, opts.HTTPPort, opts.HTTPSPort)
	}

	// The server as the configuration makes it, on a loopback port of the test's own.
	opts.Host, opts.Port, opts.HTTPPort = "127.0.0.1", -1, 0
	srv := testutil.NATSFromOptions(t, opts)
	creds, err := keys.Creds("tls-test", nil)
	if err != nil {
		t.Fatal(err)
	}
	hostPort := srv.Addr().String()

	for _, url := range []string{"tls://" + hostPort, "nats://" + hostPort} {
		nc, err := transport.Connect(url, transport.ConnOptions{Name: "tls-test", ReconnectWait: time.Second, Creds: creds, CA: tlsFiles.CA})
		if err != nil {
			t.Fatalf("a client that trusts the CA could not connect to %s: %v", url, err)
		}
		state, err := nc.TLSConnectionState()
		if err != nil || !state.HandshakeComplete {
			t.Errorf("the connection to %s is not TLS (%v)", url, err)
		}
		if err := nc.Flush(); err != nil {
			t.Errorf("flush over TLS: %v", err)
		}
		nc.Close()
	}

	if nc, err := transport.Connect("tls://"+hostPort, transport.ConnOptions{Name: "no-ca", ReconnectWait: time.Second, Creds: creds}); err == nil {
		nc.Close()
		t.Error("a client that does not trust the CA connected")
	} else if !strings.Contains(err.Error(), "certificate") {
		t.Errorf("a client without the CA was refused for another reason than the certificate: %v", err)
	}
	token, seed, err := keys.User("plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	if nc, err := nats.Connect("nats://"+hostPort, nats.UserJWTAndSeed(token, seed)); err == nil {
		nc.Close()
		t.Error("a plain (non-TLS) client connected")
	}

	// The URL says whether a connection is TLS: with the CA, a plain server named by a
	// nats:// URL (NATS of your own, without TLS) is still reached, and one named by a
	// tls:// URL is refused rather than spoken to in plain text.
	plainURL := startServer(t, keys, DefaultQuota)
	if nc, err := transport.Connect(plainURL, transport.ConnOptions{Name: "plain", ReconnectWait: time.Second, Creds: creds, CA: tlsFiles.CA}); err != nil {
		t.Errorf("a client with the CA could not reach a plain server at %s: %v", plainURL, err)
	} else {
		nc.Close()
	}
	if nc, err := transport.Connect(strings.Replace(plainURL, "nats://", "tls://", 1), transport.ConnOptions{Name: "tls-to-plain", ReconnectWait: time.Second, Creds: creds, CA: tlsFiles.CA}); err == nil {
		nc.Close()
		t.Error("a tls:// URL connected to a plain server")
	}

	// TLS off: the configuration is rewritten without the tls block, with the same keys.
	again, rewrote, err := Bootstrap(ctx, c, key.Namespace, key.Name, DefaultQuota, "")
	if err != nil || !rewrote || again != keys {
		t.Fatalf("Bootstrap with TLS off: rewrote %v, same keys %v, %v", rewrote, again == keys, err)
	}
	if err := c.Get(ctx, key, &sec); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(sec.Data[v1alpha1.SecretKeyNATSConfig]), "tls {") {
		t.Error("TLS off: the configuration still has a tls block")
	}
	if _, rewrote, err := Bootstrap(ctx, c, key.Namespace, key.Name, DefaultQuota, ""); err != nil || rewrote {
		t.Errorf("Bootstrap again with TLS off: rewrote %v, %v; want nothing written", rewrote, err)
	}
	if _, rewrote, err := Bootstrap(ctx, c, key.Namespace, key.Name, DefaultQuota, TLSDir); err != nil || !rewrote {
		t.Errorf("Bootstrap with TLS on again: rewrote %v, %v; want the tls block written", rewrote, err)
	}
}
