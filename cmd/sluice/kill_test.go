package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/sluice-io/sluice/internal/testenv"
)

// Killing `sluice run` with SIGKILL must not leave a reader hung: the kernel aborts the
// FUSE connections of the dead runner (no workflow process holds its /dev/fuse
// descriptors) and the blocked reader gets an error. No mount is left in the caller's
// namespace, and a later run in the same work directory succeeds.
func TestKilledRunnerReleasesReaders(t *testing.T) {
	testenv.Root(t, "sluice run mounts FUSE views")
	dir := t.TempDir()
	bin := buildSluice(t, dir)
	status := filepath.Join(dir, "reader-status")
	if err := syscall.Mkfifo(status, 0o600); err != nil {
		t.Fatal(err)
	}
	statusc := make(chan string, 1)
	go func() { b, _ := os.ReadFile(status); statusc <- strings.TrimSpace(string(b)) }()
	wf := filepath.Join(dir, "stuck.yaml")
	os.WriteFile(wf, []byte(`apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: stuck}
spec:
  steps:
  - name: p
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'exec 3>"$SLUICE_DIR/f"; exec sleep 1000']}]}}
    outputs: [{path: f, commit: {rule: OnClose}}]
  - name: c
    template:
      spec:
        containers:
        - name: c
          image: x
          # the reader runs in its own session so that it outlives the runner's kill
          command: [sh, -c, 'setsid sh -c "cat \"$SLUICE_DIR/f\" >/dev/null 2>&1; echo \$? > `+status+`" & exec sleep 1000']
`), 0o644)
	work := filepath.Join(dir, "work")
	run := exec.Command(bin, "run", "--quiet", "--work", work, wf)
	run.Stdout, run.Stderr = os.Stderr, os.Stderr
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	// Wait until the reader is parked in the FUSE open: the consumer's view reports it
	// only inside the runner's process, so poll the kernel's view of the reader's cat
	// (its wait channel) instead; there is no event to wait on from outside.
	// (two minutes: on a loaded machine the run may take that long to start its steps)
	if err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		return readerBlocked(filepath.Join(work, "mounts", "c-0", "f")), nil
	}); err != nil {
		run.Process.Kill()
		t.Fatalf("the reader never blocked on f: %v", err)
	}
	run.Process.Signal(syscall.SIGKILL)
	run.Wait()
	// the reader writes its exit status into the fifo when its cat returns
	select {
	case code := <-statusc:
		if code == "0" {
			t.Errorf("the reader of a dead runner's mount succeeded")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the reader is still hung 30s after the runner was killed")
	}
	// The views lived in the run's own mount namespace: none is left in this one, and
	// the next run in the same work directory starts cleanly.
	mounts, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(mounts), work) {
		t.Errorf("the killed run left mounts in the caller's namespace:\n%s", mounts)
	}
	os.WriteFile(wf, []byte(`apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: stuck}
spec:
  steps:
  - name: p
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'echo ok > "$SLUICE_DIR/f"']}]}}
    outputs: [{path: f, commit: {rule: OnClose}}]
  - name: c
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'cat "$SLUICE_DIR/f"']}]}}
    inputs: [f]
`), 0o644)
	if out, err := exec.Command(bin, "run", "--quiet", "--work", work, wf).CombinedOutput(); err != nil {
		t.Errorf("the next run in the killed run's work directory: %v\n%s", err, out)
	}
}

// readerBlocked reports whether some process has path open or is waiting to open it: a
// cat whose command line names it.
func readerBlocked(path string) bool {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if strings.HasPrefix(string(cmd), "cat\x00") && strings.Contains(string(cmd), path) {
			wchan, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "wchan"))
			return strings.Contains(string(wchan), "request_wait_answer") || strings.Contains(string(wchan), "fuse")
		}
	}
	return false
}

// buildSluice builds the sluice binary into dir and returns its path.
func buildSluice(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "sluice")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("building sluice: %v\n%s", err, out)
	}
	return bin
}

// reachableTempDir is t.TempDir made reachable by every user (it is 0700 twice).
func reachableTempDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// Without root, sluice run says what it needs (instead of failing later on a missing
// fusermount) and exits with 2.
func TestRunWithoutPrivilegesSaysWhy(t *testing.T) {
	testenv.Root(t, "runs the command as another user")
	// The other user must reach the binary and the workflow.
	dir := reachableTempDir(t)
	bin := buildSluice(t, dir)
	wf := filepath.Join(dir, "wf.yaml")
	if err := os.WriteFile(wf, []byte("apiVersion: sluice.io/v1alpha1\nkind: Workflow\nmetadata: {name: w}\nspec:\n  steps:\n  - name: a\n    template: {spec: {containers: [{name: c, image: x, command: [\"true\"]}]}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "run", "--quiet", "--work", filepath.Join(dir, "work"), wf)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 {
		t.Fatalf("sluice run as uid 65534: %v, want exit status 2\n%s", err, out)
	}
	if !strings.Contains(string(out), "needs root (or CAP_SYS_ADMIN)") || !strings.Contains(string(out), "lacks CAP_SYS_ADMIN") {
		t.Errorf("sluice run as uid 65534 said %q; want it to say it needs root or CAP_SYS_ADMIN", out)
	}
}
