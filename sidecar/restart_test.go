package sidecar

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/internal/testutil"
)

// TestMain doubles as a sidecar process when SLUICE_TEST_SIDECAR_CONTROL names a control
// directory (with SLUICE_TEST_SIDECAR_CONFIG the configuration directory), as the
// kubelet runs `sluice sidecar` in its own container: started held
// (testutil.ChildOptions.Hold) it attaches only once told to proceed. It prints "ready"
// once it serves and runs until killed.
func TestMain(m *testing.M) {
	if control := os.Getenv("SLUICE_TEST_SIDECAR_CONTROL"); control != "" {
		os.Exit(sidecarProcess(control, os.Getenv("SLUICE_TEST_SIDECAR_CONFIG")))
	}
	os.Exit(m.Run())
}

func sidecarProcess(control, config string) int {
	if err := testutil.WaitToProceed(); err != nil {
		fmt.Println("error:", err)
		return 1
	}
	if _, err := Start(context.Background(), Options{ControlDir: control, ConfigDir: config, AttachWait: 10 * time.Second, Log: logr.Discard()}); err != nil {
		fmt.Println("error:", err)
		return 1
	}
	fmt.Println("ready")
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGTERM)
	<-ch
	return 0
}

// spawnSidecar starts a sidecar process (TestMain's other role) for the pod's control
// directory; with wait it attaches only once told to (Proceed). A successor is spawned
// while its predecessor still serves (see testutil.StartChild).
func spawnSidecar(t *testing.T, control, cfg string, wait bool) *testutil.Child {
	t.Helper()
	return testutil.StartChild(t, testutil.ChildOptions{
		Env:  []string{"SLUICE_TEST_SIDECAR_CONTROL=" + control, "SLUICE_TEST_SIDECAR_CONFIG=" + cfg},
		Hold: wait, Within: 5 * time.Minute,
	})
}

const restartWorkflowYAML = `
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: wf, namespace: ns1}
spec:
  steps:
  - name: produce
    outputs:
    - {path: "many/*", commit: {rule: OnClose}}
    - {path: big.bin, commit: {rule: OnClose}, fire: NoUpdate}
    - {path: late.bin, commit: {rule: OnClose}}
  - name: consume
    inputs: ["many/*", big.bin, late.bin]
`

// A consumer's sidecar killed while the app reads a file still being written, in a
// workflow with a long history: its successor takes the mount over and must know every
// file before it answers the kernel's resent requests. The app's open descriptor reads
// every byte (no EIO, nothing short), and the files committed before the restart are
// there.
func TestRestartReplaysBeforeServing(t *testing.T) {
	testenv.Root(t, "the CSI node plugin mounts FUSE")
	_, _, cfgDir := backends(t, restartWorkflowYAML)
	n := newTestNode(t, "node-a")
	prod := n.pod(t, "produce-0", "produce", 0, cfgDir)

	// A history the successor needs a moment to replay.
	const files = 3000
	if err := os.Mkdir(filepath.Join(prod.app, "many"), 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range files {
		if err := os.WriteFile(filepath.Join(prod.app, "many", fmt.Sprintf("f%04d", i)), []byte{byte(i)}, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want := make([]byte, 4<<20)
	rand.Read(want)
	big, err := os.Create(filepath.Join(prod.app, "big.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer big.Close()
	half := len(want) / 2
	if _, err := big.Write(want[:half]); err != nil {
		t.Fatal(err)
	}

	app, control := n.publishPod(t, "consume-0", "consume", 0, "fuse")
	first := spawnSidecar(t, control, cfgDir, false)
	first.Expect(t, "ready")
	in, err := os.Open(filepath.Join(app, "big.bin"))
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	got := make([]byte, half)
	if _, err := io.ReadFull(in, got); err != nil {
		t.Fatalf("reading the first half before the restart: %v", err)
	}

	second := spawnSidecar(t, control, cfgDir, true)
	first.Kill()
	if _, err := big.Write(want[half:]); err != nil {
		t.Fatal(err)
	}
	if err := big.Close(); err != nil {
		t.Fatal(err)
	}
	readRestAcross(t, second, in, "the descriptor opened before the restart", got, want)
	// Every file of the replayed history is there. (Each is looked up by name: a listing
	// of many/ by its consumer ends only once the producer of many/* has exited, and the
	// producer pod here never does.)
	for i := range files {
		if _, err := os.Stat(filepath.Join(app, "many", fmt.Sprintf("f%04d", i))); err != nil {
			t.Fatalf("after the restart many/f%04d: %v, want all %d files", i, err, files)
		}
	}
}

// An app that opened an input before it existed (the open waited for the commit, on the
// name's placeholder) holds a descriptor of that placeholder's node; a consumer's sidecar
// killed while the app reads it: the successor revives the node by its ID, and the
// descriptor reads the rest of the committed bytes, its size the committed size.
func TestRestartKeepsAWaitedOpen(t *testing.T) {
	testenv.Root(t, "the CSI node plugin mounts FUSE")
	_, _, cfgDir := backends(t, restartWorkflowYAML)
	n := newTestNode(t, "node-a")
	prod := n.pod(t, "produce-0", "produce", 0, cfgDir)
	app, control := n.publishPod(t, "consume-0", "consume", 0, "fuse")
	first := spawnSidecar(t, control, cfgDir, false)
	first.Expect(t, "ready")

	type opened struct {
		f   *os.File
		err error
	}
	waited := make(chan opened, 1)
	go func() {
		f, err := os.Open(filepath.Join(app, "late.bin")) // waits: not even created yet
		waited <- opened{f, err}
	}()
	// The open is waiting once a thread of this process waits for the sidecar's answer
	// (nothing else here sends FUSE requests now); the kernel's state is polled, as
	// nothing signals it.
	if err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		return fuseRequestPending(), nil
	}); err != nil {
		t.Fatalf("the consumer's open of late.bin never waited: %v", err)
	}
	want := make([]byte, 3<<20+5)
	rand.Read(want)
	if err := os.WriteFile(filepath.Join(prod.app, "late.bin"), want, 0o644); err != nil {
		t.Fatal(err)
	}
	var o opened
	select {
	case o = <-waited:
	case <-time.After(60 * time.Second):
		t.Fatal("the consumer's open did not return after the commit")
	}
	if o.err != nil {
		t.Fatalf("the open that waited for the commit: %v", o.err)
	}
	in := o.f
	defer in.Close()
	half := len(want) / 2
	got := make([]byte, half)
	if _, err := io.ReadFull(in, got); err != nil {
		t.Fatalf("reading the first half before the restart: %v", err)
	}

	second := spawnSidecar(t, control, cfgDir, true)
	first.Kill()
	readRestAcross(t, second, in, "the descriptor that waited for its input", got, want)
	fi, err := in.Stat()
	if err != nil || fi.Size() != int64(len(want)) {
		t.Fatalf("fstat after the restart: size %v (%v), want %d", fi, err, len(want))
	}
}

// readRestAcross reads the rest of in while the successor sidecar takes the mount over
// (Proceed), and fails t unless what was read before (got) and the rest are want.
func readRestAcross(t *testing.T, successor *testutil.Child, in *os.File, what string, got, want []byte) {
	t.Helper()
	rest := make(chan []byte, 1)
	go func() {
		b, err := io.ReadAll(in)
		if err != nil {
			b = append(b, "read: "+err.Error()...)
		}
		rest <- b
	}()
	successor.Proceed(t)
	tail := receive(t, what, rest)
	if got = append(got, tail...); !bytes.Equal(got, want) {
		t.Fatalf("%s: the app read %d bytes across the restart (tail %.80q), want the %d written", what, len(got), tail, len(want))
	}
}

// fuseRequestPending reports whether a thread of this process waits for a FUSE server's
// answer (its kernel wait channel is request_wait_answer).
func fuseRequestPending() bool {
	tasks, _ := os.ReadDir("/proc/self/task")
	for _, task := range tasks {
		wchan, _ := os.ReadFile(filepath.Join("/proc/self/task", task.Name(), "wchan"))
		if string(wchan) == "request_wait_answer" {
			return true
		}
	}
	return false
}
