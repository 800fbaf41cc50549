package natsauth

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/sluice-io/sluice/api/v1alpha1"
)

// The server configuration Bootstrap writes keeps nats-server's monitoring endpoints,
// which answer without authentication and list every workflow's connections and
// subjects, off the pod network: they listen on the loopback interface only, while
// clients still reach the server on every interface.
func TestBootstrapBindsMonitoringToLoopback(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).Build()
	if _, err := Bootstrap(context.Background(), c, "sluice-system", "sluice-nats"); err != nil {
		t.Fatal(err)
	}
	var sec corev1.Secret
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: "sluice-system", Name: "sluice-nats"}, &sec); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(conf, sec.Data[v1alpha1.SecretKeyNATSConfig], 0o600); err != nil {
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
