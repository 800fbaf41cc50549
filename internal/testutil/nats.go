package testutil

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/store"
	"github.com/sluice-io/sluice/internal/transport"
)

// NATS starts an in-process nats-server with JetStream (the one `sluice run` embeds)
// storing under a temporary directory, stops it when t ends, and returns its client URL.
// In-process NATS is a unit-tier dependency: it needs neither root nor a binary.
func NATS(t testing.TB) string {
	t.Helper()
	srv, err := transport.StartEmbedded(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	return srv.URL()
}

// Connect connects to the NATS server at url with opts and closes the connection when t
// ends.
func Connect(t testing.TB, url string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Peer starts a transport peer with cfg (its Conn, Names, Node and whatever else the
// test sets) over a new node store in storeDir with opts, and an engine over spec's
// rules. It does not stop the peer: a test that keeps it to the end stops it in its own
// cleanup, one that ends it early (a pod that ended) calls Stop itself.
func Peer(t testing.TB, spec *v1alpha1.WorkflowSpec, storeDir string, opts store.Options, cfg transport.Config) (*transport.Peer, *store.Store) {
	t.Helper()
	rules, errs, _ := semantics.Compile(spec)
	if len(errs) > 0 {
		t.Fatal(errs.ToAggregate())
	}
	st, err := store.New(storeDir, opts)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Engine, cfg.Store = semantics.NewEngine(rules), st
	p, err := transport.Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("transport peer %s: %v", cfg.Node, err)
	}
	return p, st
}
