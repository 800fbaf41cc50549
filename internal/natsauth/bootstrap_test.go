package natsauth

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/sluice-io/sluice/api/v1alpha1"
)

// The server configuration Bootstrap writes keeps nats-server's monitoring endpoints,
// which answer without authentication and list every workflow's connections and
// subjects, off the pod network: they listen on the loopback interface only, while
// clients still reach the server on every interface.
func TestBootstrapBindsMonitoringToLoopback(t *testing.T) {
	c := fakeClient(t)
	if _, _, err := Bootstrap(context.Background(), c, "sluice-system", "sluice-nats", DefaultQuota, ""); err != nil {
		t.Fatal(err)
	}
	var sec corev1.Secret
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: "sluice-system", Name: "sluice-nats"}, &sec); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(conf, []byte(testConfig(t, string(sec.Data[v1alpha1.SecretKeyNATSConfig]))), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("nats-server refused the generated configuration: %v", err)
	}
	if opts.HTTPHost != "127.0.0.1" || opts.HTTPPort != 8222 {
		t.Errorf("monitoring listens on %s:%d, want 127.0.0.1:8222 (loopback only)", opts.HTTPHost, opts.HTTPPort)
	}
	if opts.HTTPSPort != 0 {
		t.Errorf("monitoring also listens with TLS on port %d", opts.HTTPSPort)
	}
	if opts.Host != "0.0.0.0" || opts.Port != 4222 {
		t.Errorf("clients are served on %s:%d, want 0.0.0.0:4222", opts.Host, opts.Port)
	}
}

// The quota the controller is started with is the one the NATS server gets: Bootstrap
// writes it into a new Secret's configuration, and rewrites the configuration of an
// existing Secret (keeping its keys) when it bounds the account otherwise, as after an
// upgrade from an installation whose account was unlimited, or a changed flag.
func TestBootstrapWritesTheQuota(t *testing.T) {
	ctx := context.Background()
	c := fakeClient(t)
	key := types.NamespacedName{Namespace: "sluice-system", Name: "sluice-nats"}
	conf := func() string {
		t.Helper()
		var sec corev1.Secret
		if err := c.Get(ctx, key, &sec); err != nil {
			t.Fatal(err)
		}
		return string(sec.Data[v1alpha1.SecretKeyNATSConfig])
	}
	keys, rewrote, err := Bootstrap(ctx, c, key.Namespace, key.Name, DefaultQuota, "")
	if err != nil || rewrote {
		t.Fatalf("first Bootstrap: rewrote %v, %v", rewrote, err)
	}
	if q, ok := keys.ConfiguredQuota(conf()); !ok || q != DefaultQuota {
		t.Errorf("a new Secret's configuration bounds the account by %+v (%v), want %+v", q, ok, DefaultQuota)
	}

	bigger := Quota{Storage: 20 << 30, Streams: 512}
	again, rewrote, err := Bootstrap(ctx, c, key.Namespace, key.Name, bigger, "")
	if err != nil || !rewrote || again != keys {
		t.Fatalf("Bootstrap with another quota: rewrote %v, same keys %v, %v; want the configuration rewritten with the same keys", rewrote, again == keys, err)
	}
	if q, ok := keys.ConfiguredQuota(conf()); !ok || q != bigger {
		t.Errorf("after the quota changed the configuration bounds the account by %+v (%v), want %+v", q, ok, bigger)
	}
	if _, rewrote, err := Bootstrap(ctx, c, key.Namespace, key.Name, bigger, ""); err != nil || rewrote {
		t.Errorf("Bootstrap with the same quota: rewrote %v, %v; want nothing written", rewrote, err)
	}

	// A Secret written before quotas: its account's JetStream was unlimited.
	var sec corev1.Secret
	if err := c.Get(ctx, key, &sec); err != nil {
		t.Fatal(err)
	}
	unlimited, err := keys.ServerConfig(bigger)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := keys.pairs()
	if err != nil {
		t.Fatal(err)
	}
	accPub, _ := kp.acc.PublicKey()
	ac := jwt.NewAccountClaims(accPub)
	ac.Name = "sluice"
	ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1, MaxAckPending: -1}
	old, err := ac.Encode(kp.op)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, _ := strings.Cut(unlimited, accPub+": \"")
	cur, _, _ := strings.Cut(rest, "\"")
	sec.Data[v1alpha1.SecretKeyNATSConfig] = []byte(ServerBase + strings.Replace(unlimited, cur, old, 1))
	if err := c.Update(ctx, &sec); err != nil {
		t.Fatal(err)
	}
	if _, ok := keys.ConfiguredQuota(conf()); ok {
		t.Fatal("an unlimited account was taken for a quota")
	}
	if _, rewrote, err := Bootstrap(ctx, c, key.Namespace, key.Name, bigger, ""); err != nil || !rewrote {
		t.Errorf("Bootstrap over a Secret without a quota: rewrote %v, %v; want the quota written", rewrote, err)
	}
	if q, ok := keys.ConfiguredQuota(conf()); !ok || q != bigger {
		t.Errorf("after an upgrade the configuration bounds the account by %+v (%v), want %+v", q, ok, bigger)
	}
}

// fakeClient is an API client of an empty fake API server that knows core/v1.
func fakeClient(t *testing.T) client.Client {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	return fake.NewClientBuilder().WithScheme(scheme).Build()
}
