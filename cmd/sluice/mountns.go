package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluice-io/sluice/internal/exitcode"
)

// privateNSEnv marks the process sluice run re-executed in a mount namespace of its own.
const privateNSEnv = "SLUICE_RUN_PRIVATE_MOUNTS"

// inPrivateMountNS reports whether this process is the re-executed sluice run.
func inPrivateMountNS() bool { return os.Getenv(privateNSEnv) == "1" }

// runInPrivateMountNS runs this same command line again in a new mount namespace
// (clone(2) CLONE_NEWNS) and waits for it, returning its exit status as an *exitcode.Error.
// The views are mounted in that namespace only, so they never appear in the caller's and
// they go when the run's processes do: a sluice run killed with SIGKILL leaves no dead
// FUSE mount behind (the child dies with its parent, PR_SET_PDEATHSIG). SIGINT and
// SIGTERM (ctx's end) are passed on to the child, which stops its steps and exits.
func runInPrivateMountNS(ctx context.Context) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding the sluice binary to run in a private mount namespace: %w", err)
	}
	// The death signal is sent when the thread that started the child exits: keep it.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cmd := exec.Command(self, os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), privateNSEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return &exitcode.Error{Code: 2, Err: fmt.Errorf("starting sluice run in a private mount namespace (--private-mounts=false runs without one): %w", err)}
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-ctx.Done():
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err = <-done:
		case <-time.After(time.Minute):
			_ = cmd.Process.Kill()
			err = <-done
		}
	}
	var exit *exec.ExitError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &exit):
		// The child has said why; pass its status on without a second message.
		return &exitcode.Error{Code: max(exit.ExitCode(), 1)}
	default:
		return &exitcode.Error{Code: 1, Err: fmt.Errorf("sluice run in a private mount namespace: %w", err)}
	}
}

// makeMountsPrivate stops mount events in this (new) namespace from propagating back to
// the namespace it was copied from: with "/" shared, as systemd mounts it, the views
// would appear there too.
func makeMountsPrivate() error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making the run's mounts private: %w", err)
	}
	return nil
}
