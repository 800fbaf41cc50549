package testutil

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
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

// NATSFromConfig runs an in-process nats-server with the configuration body (nats.conf's
// format: an installation's, as natsauth writes it, with a listen address and a
// JetStream directory of the test's) and shuts it down when t ends. t fails if the
// server refuses the configuration or is not ready within 10 s.
func NATSFromConfig(t testing.TB, body string) *server.Server {
	t.Helper()
	conf := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("nats-server refused the configuration: %v", err)
	}
	return NATSFromOptions(t, opts)
}

// NATSFromOptions runs an in-process nats-server with opts (without signal handlers or
// logs) and shuts it down when t ends; t fails if it is not ready within 10 s.
func NATSFromOptions(t testing.TB, opts *server.Options) *server.Server {
	t.Helper()
	opts.NoSigs, opts.NoLog = true, true
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(srv.Shutdown)
	return srv
}

// DialCreds connects to the NATS server at url once, with the credentials file creds
// and the inbox prefix inbox, without reconnecting, and returns the connection (closed
// when t ends) or the server's refusal; closed is closed when the connection is (by the
// server: a revocation, an expiry).
func DialCreds(t testing.TB, url string, creds []byte, inbox string) (nc *nats.Conn, closed <-chan struct{}, err error) {
	t.Helper()
	f := filepath.Join(t.TempDir(), "user.creds")
	if err := os.WriteFile(f, creds, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	nc, err = nats.Connect(url, nats.UserCredentials(f), nats.CustomInboxPrefix(inbox), nats.NoReconnect(),
		nats.ClosedHandler(func(*nats.Conn) { close(done) }))
	if err != nil {
		return nil, nil, err
	}
	t.Cleanup(nc.Close)
	return nc, done, nil
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
	rules, errs, _ := semantics.Compile(context.Background(), spec)
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
