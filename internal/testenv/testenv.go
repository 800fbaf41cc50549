// Package testenv is the one policy for Sluice's test tiers (make unit, make
// integration, make e2e-local; csi-driver-nfs keeps the same tiers as separate targets).
//
// A unit test needs nothing but Go: no root, no FUSE, no server but an in-process NATS
// (testutil.NATS, nats-server's Go package), no binary outside the module, and it takes
// milliseconds to seconds. Every other test is an integration test and says so
// first, with what it needs: Integration skips it under `go test -short` (make unit), and
// Root also skips it, with the reason, when the process is not root. make integration runs
// every test as root, without -short. WaitFile waits on inotify for a file's content,
// where a test would otherwise poll.
package testenv

import (
	"os"
	"testing"
)

// Integration marks t as an integration test that needs what needs says (for example
// "an embedded nats-server", "kube-apiserver and etcd (envtest)", "MinIO"); under -short
// (make unit) it skips t, naming that.
func Integration(t testing.TB, needs string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("integration test (needs %s): make integration runs it", needs)
	}
}

// Root marks t as an integration test that needs root for what why says (for example
// "mounts FUSE"), and skips it under -short or when the process is not root.
func Root(t testing.TB, why string) {
	t.Helper()
	Integration(t, "root: "+why)
	if os.Geteuid() != 0 {
		t.Skipf("needs root (%s); make integration runs as root", why)
	}
}
