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
	"github.com/sluice-io/sluice/internal/storeserver"
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
// server's connection is the agent Secret in the API; a deposit request is refused
// without a look at its content, and nothing of it reaches the disk.
func TestPluginTakesNoDeposit(t *testing.T) {
	n := newTestNode(t)
	if _, err := n.publish("uid-a", "team", v1alpha1.RoleApp, v1alpha1.ModeDirect); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(n.d.podsRoot(), "uid-a", handoff.SocketName)
	req, err := json.Marshal(map[string]any{"op": "deposit", "deposit": map[string][]byte{
		v1alpha1.SecretKeyWorkflow: aliasedWorkflow(), v1alpha1.SecretKeyNATSURL: []byte("nats://127.0.0.1:4222")}})
	if err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	reply := rawRequest(t, sock, req)
	runtime.ReadMemStats(&after)
	if !strings.Contains(reply, "unknown op") {
		t.Errorf("the plugin's reply to a deposit: %s, want it refused as an unknown op", reply)
	}
	// The request's own JSON, base64 of the file, on both ends: a few MiB.
	if got := after.TotalAlloc - before.TotalAlloc; got > 24<<20 {
		t.Errorf("refusing a deposit allocated %d MiB, want at most 24", got>>20)
	}
	for _, dir := range []string{filepath.Join(n.d.opts.StateDir, "deposits"), n.d.RecordDir("team", "wf")} {
		err := filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
			if err == nil && !info.IsDir() && filepath.Base(p) != storeserver.RecordUID {
				t.Errorf("the plugin wrote %s", p)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
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
