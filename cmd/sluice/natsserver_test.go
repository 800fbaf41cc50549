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
	go reloadOnChange(ctx, srv, []string{tlsFiles.CertFile(), tlsFiles.KeyFile()}, 20*time.Millisecond, testr.New(t))

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
	deadline := time.Now().Add(30 * time.Second)
	for served().Cmp(first) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the server still serves the old certificate 30s after it was renewed")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
