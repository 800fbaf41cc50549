package main

import (
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-io/sluice/csi-driver/handoff"
	"github.com/sluice-io/sluice/internal/testenv"
)

// sidecarTestEnv makes this test binary run `sluice sidecar` (TestMain).
const sidecarTestEnv = "SLUICE_TEST_RUN_SIDECAR"

// The sidecar holds the workflow's credentials in its memory and its mount namespace
// (/etc/sluice): another process of its user, in a pod that shares its process
// namespace or in an ephemeral container that targets it (kubectl debug --target), must
// not read them through /proc/<pid>/environ, mem or root (issue 43, finding 5). The
// sidecar makes itself not dumpable at start, so the kernel owns its /proc entries as
// root and refuses them to a process of its user without CAP_SYS_PTRACE.
func TestSidecarIsNotDumpable(t *testing.T) {
	testenv.Root(t, "runs the sidecar and its neighbour as the sidecars' user")
	// The sidecars' user must reach the binary.
	dir := reachableTempDir(t)
	bin := filepath.Join(dir, "sluice")
	copyExecutable(t, bin)
	control := filepath.Join(dir, "control")
	if err := os.Mkdir(control, 0o777); err != nil {
		t.Fatal(err)
	}
	sidecarUser := &syscall.Credential{Uid: 65532, Gid: 65532}
	// The test stands where the node plugin would: the sidecar's first act after making
	// itself not dumpable is to ask for its volume here, and it gets no answer.
	ln, err := net.Listen("unix", filepath.Join(control, handoff.SocketName))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	if err := os.Chmod(filepath.Join(control, handoff.SocketName), 0o777); err != nil {
		t.Fatal(err)
	}
	sidecar := exec.Command(bin, "sidecar", "--control-dir", control, "--config-dir", filepath.Join(dir, "config"),
		"--metrics-addr", "", "--attach-wait", "2m")
	sidecar.Env = append(os.Environ(), sidecarTestEnv+"=1", "SLUICE_SECRET_IN_ENV=hunter2")
	sidecar.Stderr = os.Stderr
	sidecar.SysProcAttr = &syscall.SysProcAttr{Credential: sidecarUser}
	if err := sidecar.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sidecar.Process.Kill(); _ = sidecar.Wait() })
	proc := filepath.Join("/proc", strconv.Itoa(sidecar.Process.Pid))

	// Its /proc entries are root's once it asks for its volume.
	asked := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			t.Cleanup(func() { _ = c.Close() })
		}
		asked <- err
	}()
	select {
	case err := <-asked:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the sidecar did not ask for its volume within 30 s")
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(proc, "fd"), &st); err != nil {
		t.Fatalf("the sidecar ended: %v", err)
	}
	if st.Uid != 0 {
		t.Fatalf("%s/fd is owned by %d once the sidecar runs: it is dumpable", proc, st.Uid)
	}
	// A neighbour of the sidecars' user reads neither its environment nor its root.
	for _, f := range []string{"environ", "root/"} {
		cat := exec.Command("ls", "-la", filepath.Join(proc, f))
		if f == "environ" {
			cat = exec.Command("cat", filepath.Join(proc, f))
		}
		cat.SysProcAttr = &syscall.SysProcAttr{Credential: sidecarUser}
		if out, err := cat.CombinedOutput(); err == nil {
			t.Errorf("a process of the sidecars' user read the sidecar's %s:\n%s", f, out)
		}
	}
}

// copyExecutable copies this test binary to dst, executable by everyone.
func copyExecutable(t *testing.T, dst string) {
	t.Helper()
	src, err := os.Open("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, src); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
