package main

import (
	"context"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/nats-io/nats.go"

	"github.com/sluice-io/sluice/internal/natsauth"
	"github.com/sluice-io/sluice/internal/testutil"
	"github.com/sluice-io/sluice/internal/trust"
)

// `sluice nats-server --reload-on-change` serves a renewed certificate without a
// restart: when the controller renews the bundled server's certificate and the kubelet
// replaces the mounted files, new connections get the new certificate (from the same CA,
// so clients keep trusting it) while the server keeps running.
func TestNATSServerReloadsARenewedCertificate(t *testing.T) {
	tlsFiles := testutil.IssueServerTLS(t)
	conf := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(conf, []byte("listen: 127.0.0.1:-1\n"+natsauth.ServerTLS(tlsFiles.Dir)), 0o600); err != nil {
		t.Fatal(err)
	}
	srv, err := startNATSServer(conf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	watched := []string{tlsFiles.CertFile(), tlsFiles.KeyFile()}
	loaded := digestFiles(watched)
	reloads := make(chan struct{}, 8)
	go func() {
		_ = reloadOnChange(ctx, srv, watched, loaded, 20*time.Millisecond, time.Hour, func() { reloads <- struct{}{} }, testr.New(t))
	}()

	tc, err := trust.Config(tlsFiles.CA)
	if err != nil {
		t.Fatal(err)
	}
	served := func() *big.Int {
		t.Helper()
		nc, err := nats.Connect("tls://"+srv.Addr().String(), nats.Secure(tc))
		if err != nil {
			t.Fatalf("connecting with the CA: %v", err)
		}
		defer nc.Close()
		state, err := nc.TLSConnectionState()
		if err != nil {
			t.Fatal(err)
		}
		return state.PeerCertificates[0].SerialNumber
	}
	first := served()
	tlsFiles.Renew(t)
	// The key and the certificate may be replaced one after the other: each reload that
	// succeeds serves what the files hold then, the new certificate once both are there.
	deadline := time.After(30 * time.Second)
	for renewed := false; !renewed; {
		select {
		case <-reloads:
			renewed = served().Cmp(first) != 0
		case <-deadline:
			t.Fatal("the server still serves the old certificate 30s after it was renewed")
		}
	}
}

// A change nats-server cannot reload (the controller's rewritten nats.conf may carry
// one by the time a certificate is renewed) does not leave the server retrying for ever
// with the old configuration: after the give-up time it shuts down, with the error, so
// that the container restarts with the whole new configuration.
func TestNATSServerRestartsWhenItCannotReload(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(conf, []byte("listen: 127.0.0.1:-1\nserver_name: first\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv, err := startNATSServer(conf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	loaded := digestFiles([]string{conf})
	go func() {
		done <- reloadOnChange(ctx, srv, []string{conf}, loaded, 20*time.Millisecond, 200*time.Millisecond, nil, testr.New(t))
	}()
	// Another server name: nats-server refuses to reload it.
	if err := os.WriteFile(conf, []byte("listen: 127.0.0.1:-1\nserver_name: second\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("reloadOnChange gave up without an error")
		}
		t.Log(err)
	case <-ctx.Done():
		t.Fatal("reloadOnChange still retries a reload nats-server refuses")
	}
	stopped := make(chan struct{})
	go func() { srv.WaitForShutdown(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Error("the server still runs after reloadOnChange gave up")
	}
}

// In a container with a memory limit and no GOMEMLIMIT, `sluice nats-server` sets the Go
// runtime's soft limit to 90% of it (the server collects garbage before it is killed);
// without a limit, or with GOMEMLIMIT set, it changes nothing.
func TestNATSServerMemoryLimitFollowsTheCgroup(t *testing.T) {
	dir := t.TempDir()
	write := func(s string) string {
		p := filepath.Join(dir, "memory.max")
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if n, ok := goMemoryLimit("", write("2147483648\n")); !ok || n != 2147483648/10*9 {
		t.Errorf("a 2 GiB limit: %d, %v; want 90%% of it", n, ok)
	}
	if _, ok := goMemoryLimit("", write("max\n")); ok {
		t.Error("no limit (max): set one")
	}
	if _, ok := goMemoryLimit("1GiB", write("2147483648\n")); ok {
		t.Error("GOMEMLIMIT set: overridden")
	}
	if _, ok := goMemoryLimit("", filepath.Join(dir, "missing")); ok {
		t.Error("no cgroup file: set one")
	}
}
