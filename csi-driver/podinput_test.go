package csidriver

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/csi-driver/handoff"
	"github.com/sluice-io/sluice/internal/storeserver"
)

// The privileged plugin opens nothing inside a pod's volume (issue 42): a tenant that
// plants go-fuse's poll-hack name in its direct-mode volume as a symlink to a host file
// (a review pointed it at /dev/watchdog, whose open and close reboots the node), then
// sends an INIT over its hand-off socket, must not make the plugin open the link's
// target. The target here is a FIFO outside the volume: a writer's non-blocking open of
// it succeeds only while some process has it open for reading, which is what the
// plugin's open did at once before.
func TestPluginOpensNoPlantedPollHack(t *testing.T) {
	n := newTestNode(t)
	target, err := n.publish("uid-a", "team", v1alpha1.RoleApp, v1alpha1.ModeDirect)
	if err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(t.TempDir(), "host-device")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(fifo, filepath.Join(target, ".go-fuse-epoll-hack")); err != nil {
		t.Fatal(err)
	}
	if err := handoff.SaveInit(filepath.Join(n.d.podsRoot(), "uid-a", handoff.SocketName), []byte("INIT")); err != nil {
		t.Fatal(err)
	}
	// The plugin answered the INIT; whatever it does about it starts at once. Two seconds
	// is what an open on a local FIFO never needs.
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		fd, err := unix.Open(fifo, unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err == nil {
			unix.Close(fd) // lets the plugin's open return
			t.Fatal("the plugin opened the target of a symlink a tenant planted in its volume")
		}
		if !errors.Is(err, syscall.ENXIO) {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// aliasedWorkflow is a workflow file of about 400 KB whose YAML decode allocates about
// 90 MiB (200,000 scalars, and two aliases of them).
func aliasedWorkflow() []byte {
	return []byte("metadata: {name: wf, namespace: team}\nx: &x [" + strings.Repeat("x,", 200_000) +
		"x]\ny: [*x, *x]\n")
}

// A deposit is what a pod's sidecar hands the privileged plugin: the plugin checks only
// its file names and sizes and decodes none of it (issue 42: the root plugin YAML-decoded
// a tenant's 512 KiB workflow file, ~90 MiB per request). A workflow file in a deposit
// (sidecars before this change sent one) is dropped unread: the store server takes the
// Workflow from the API and the UID from the publication.
func TestPluginDecodesNoDeposit(t *testing.T) {
	n := newTestNode(t)
	if _, err := n.publish("uid-a", "team", v1alpha1.RoleApp, v1alpha1.ModeDirect); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(n.d.podsRoot(), "uid-a", handoff.SocketName)
	data := map[string][]byte{v1alpha1.SecretKeyWorkflow: aliasedWorkflow(), v1alpha1.SecretKeyNATSURL: []byte("nats://127.0.0.1:4222")}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	err := handoff.Deposit(sock, data)
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	// The request's own JSON, base64 of the file, on both ends: a few MiB.
	if got := after.TotalAlloc - before.TotalAlloc; got > 24<<20 {
		t.Errorf("handing over a deposit allocated %d MiB, want at most 24", got>>20)
	}
	dir := filepath.Join(n.d.DepositDir("team", "wf"), storeserver.DepositDir)
	if _, err := os.Stat(filepath.Join(dir, v1alpha1.SecretKeyWorkflow)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the deposit keeps the pod's workflow file (%v)", err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, v1alpha1.SecretKeyNATSURL)); err != nil || string(b) != "nats://127.0.0.1:4222" {
		t.Errorf("the deposit's NATS URL is %q (%v)", b, err)
	}
}
