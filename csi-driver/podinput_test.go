package csidriver

import (
	"bufio"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/csi-driver/handoff"
	"github.com/sluice-io/sluice/internal/published"
	"github.com/sluice-io/sluice/internal/testenv"
)

// The privileged plugin opens nothing inside a pod's volume (issue 42): a tenant that
// plants go-fuse's poll-hack name in its direct-mode volume as a symlink to a host file
// (a review pointed it at /dev/watchdog, whose open and close reboots the node), then
// sends an INIT over its hand-off socket, must not make the plugin open the link's
// target. The target here is a file outside the volume watched with inotify, which
// reports every open of it: before, the plugin's open came at once.
func TestPluginOpensNoPlantedPollHack(t *testing.T) {
	n := newTestNode(t)
	target, err := n.publish("uid-a", "team", v1alpha1.RoleApp, v1alpha1.ModeDirect)
	if err != nil {
		t.Fatal(err)
	}
	host := filepath.Join(t.TempDir(), "host-device")
	if err := os.WriteFile(host, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	in, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(in)
	if _, err := unix.InotifyAddWatch(in, host, unix.IN_OPEN); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(host, filepath.Join(target, ".go-fuse-epoll-hack")); err != nil {
		t.Fatal(err)
	}
	if err := handoff.SaveInit(filepath.Join(n.d.podsRoot(), "uid-a", handoff.SocketName), []byte("INIT")); err != nil {
		t.Fatal(err)
	}
	// The plugin answered the INIT; whatever it does about it starts at once. Two seconds
	// is what an open of a local file never needs.
	fds := []unix.PollFd{{Fd: int32(in), Events: unix.POLLIN}}
	for {
		ready, err := unix.Poll(fds, 2000)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if ready > 0 {
			t.Fatal("the plugin opened the target of a symlink a tenant planted in its volume")
		}
		return
	}
}

// aliasedWorkflow is a workflow file of about 400 KB whose YAML decode allocates about
// 90 MiB (200,000 scalars, and two aliases of them).
func aliasedWorkflow() []byte {
	return []byte("metadata: {name: wf, namespace: team}\nx: &x [" + strings.Repeat("x,", 200_000) +
		"x]\ny: [*x, *x]\n")
}

// The privileged plugin takes no configuration from a pod (issue 42): sidecars before
// it handed over a "deposit" (their NATS credentials and a workflow file, which the root
// plugin YAML-decoded: a tenant's 512 KiB file cost ~90 MiB per request). Now the store
// server's connection is the agent Secret in the API; a deposit from an older sidecar is
// acknowledged (it would stop otherwise) without its content being decoded, and nothing
// of it reaches the disk.
func TestPluginTakesNoDeposit(t *testing.T) {
	n := newTestNode(t)
	if _, err := n.publish("uid-a", "team", v1alpha1.RoleApp, v1alpha1.ModeDirect); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(n.d.podsRoot(), "uid-a", handoff.SocketName)
	const url = "nats://deposited.example:4222"
	req, err := json.Marshal(map[string]any{"op": "deposit", "deposit": map[string][]byte{
		v1alpha1.SecretKeyWorkflow: aliasedWorkflow(), v1alpha1.SecretKeyNATSURL: []byte(url)}})
	if err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	reply := rawRequest(t, sock, req)
	runtime.ReadMemStats(&after)
	if strings.Contains(reply, `"error"`) {
		t.Errorf("the plugin's reply to an older sidecar's deposit: %s, want it acknowledged", reply)
	}
	// The request's own line, read and skipped: a few MiB.
	if got := after.TotalAlloc - before.TotalAlloc; got > 24<<20 {
		t.Errorf("taking a deposit allocated %d MiB, want at most 24", got>>20)
	}
	// Nothing of it anywhere the plugin writes.
	err = filepath.Walk(n.d.opts.StateDir, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if strings.Contains(string(b), url) || strings.Contains(string(b), "metadata: {name: wf") {
			t.Errorf("the plugin kept the deposit in %s", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// rawRequest sends the request line req to the hand-off socket and returns the reply's
// line.
func rawRequest(t *testing.T, socket string, req []byte) string {
	t.Helper()
	conn, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write(append(req, '\n')); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		t.Fatalf("reading the plugin's reply: %v", err)
	}
	return line
}

// A plugin upgraded from before issue 42 finds the deposits its predecessor kept: the
// Workflow UIDs it had checked become publication records, so the store servers of
// those workflows start again; the sidecars' NATS credentials are removed.
func TestPluginMigratesItsPredecessorsDeposits(t *testing.T) {
	testenv.Root(t, "the plugin makes root-only directories")
	state := filepath.Join(t.TempDir(), "state")
	server := filepath.Join(state, "deposits", "team", "wf", "server")
	if err := os.MkdirAll(server, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string]string{published.UIDFile: "uid-wf", v1alpha1.SecretKeyNATSCreds: "-----BEGIN NATS USER JWT-----"} {
		if err := os.WriteFile(filepath.Join(server, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	d, err := New(Options{NodeID: "node-1", StateDir: state, SidecarUID: os.Getuid(), SidecarGID: os.Getgid(), DiskTier: DiskTierDirectory})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	if b, err := os.ReadFile(filepath.Join(d.RecordDir("team", "wf"), published.Dir, published.UIDFile)); err != nil || string(b) != "uid-wf" {
		t.Errorf("the publication record of team/wf: %q (%v), want the deposit's uid-wf", b, err)
	}
	if _, err := os.Stat(filepath.Join(state, "deposits")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the deposits are still there (%v)", err)
	}
}
