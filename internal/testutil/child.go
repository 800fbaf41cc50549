package testutil

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// holdEnv, set in a child's environment, makes WaitToProceed wait for Proceed.
const holdEnv = "SLUICE_TEST_WAIT"

// Child is a helper process: this test binary run again (with no test selected) and an
// environment that makes the package's TestMain take another role, typically a
// sidecar, which reports progress as lines on its standard output ("ready").
type Child struct {
	cmd    *exec.Cmd
	stdin  io.Writer
	lines  chan string
	within time.Duration
}

// ChildOptions says how to start a Child.
type ChildOptions struct {
	// Env is added to this process's environment: what tells TestMain the role.
	Env []string
	// Hold makes the child's WaitToProceed wait until Proceed.
	Hold bool
	// Within bounds each Expect (default 30s).
	Within time.Duration
}

// StartChild starts a child process; it is killed when t ends, and also when this test
// binary dies (go test's timeout): one left running would keep go test's output pipe
// open, and go test waiting for it.
//
// A process that holds descriptors of a FUSE volume cannot fork and exec while no server
// answers (the child's copies are closed at exec, and each close sends the server a
// FLUSH), so a successor is started while its predecessor still serves, with Hold.
func StartChild(t testing.TB, opts ChildOptions) *Child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), opts.Env...)
	if opts.Hold {
		cmd.Env = append(cmd.Env, holdEnv+"=1")
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &Child{cmd: cmd, stdin: stdin, lines: make(chan string, 16), within: opts.Within}
	if c.within == 0 {
		c.within = 30 * time.Second
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
		close(c.lines)
	}()
	t.Cleanup(c.Kill)
	return c
}

// Expect fails t unless the child's next line is want, within the child's bound.
func (c *Child) Expect(t testing.TB, want string) {
	t.Helper()
	select {
	case got, ok := <-c.lines:
		if !ok || got != want {
			t.Fatalf("child said %q (open %v), want %q", got, ok, want)
		}
	case <-time.After(c.within):
		t.Fatalf("child did not say %q", want)
	}
}

// Proceed lets a child started with Hold go on past WaitToProceed, and waits until it
// says "ready".
func (c *Child) Proceed(t testing.TB) {
	t.Helper()
	if _, err := io.WriteString(c.stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	c.Expect(t, "ready")
}

// Kill ends the child with SIGKILL, as a container runtime does after a crash or an OOM
// kill, and reaps it.
func (c *Child) Kill() {
	if c.cmd.ProcessState == nil {
		_ = c.cmd.Process.Kill()
		_ = c.cmd.Wait()
	}
}

// WaitToProceed returns at once in a child not started with Hold; in one that was, it
// returns once the parent calls Proceed. Call it in the child.
func WaitToProceed() error {
	if os.Getenv(holdEnv) == "" {
		return nil
	}
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return fmt.Errorf("waiting to proceed: %w", err)
	}
	return nil
}
