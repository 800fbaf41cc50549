package transport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluice-io/sluice/internal/testenv"
)

// plant makes dir/name a symlink to a new file outside dir holding want, and returns the
// file's path.
func plant(t *testing.T, dir, name string, want []byte) string {
	t.Helper()
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, want, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
	return victim
}

func unchanged(t *testing.T, victim string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(victim)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s was written through a planted symlink: %q, want %q", victim, got, want)
	}
}

// The host state is written by the unprivileged sidecars and used by the CSI plugin's
// store server as root: a symlink planted at state/progress must not make the server
// open (and write) the file it points to.
func TestHostStateRefusesPlantedProgressSymlink(t *testing.T) {
	dir := t.TempDir()
	want := []byte("root-only secret, do not touch")
	victim := plant(t, dir, "progress", want)
	h, err := openDirHost(dir)
	if err == nil {
		_ = h.SetProgress(0x4141414141414141)
		h.Close()
		t.Error("the host state was opened through a symlink at progress")
	}
	unchanged(t, victim, want)
}

// A symlink planted at state/failed/<h>.tmp (or at the record's name itself) is
// replaced, never written through; the record is still made.
func TestHostStateMarkFailedIgnoresPlantedSymlinks(t *testing.T) {
	dir := t.TempDir()
	h, err := openDirHost(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	want := []byte("root-only secret, do not touch")
	tmpVictim := plant(t, dir, "failed/"+failedName("out/a")+".tmp", want)
	nameVictim := plant(t, dir, "failed/"+failedName("out/b"), want)
	lockVictim := plant(t, dir, "materialiser.lock", want)
	if err := h.MarkFailed("out/a", "|/tmp/pwn core"); err != nil {
		t.Fatal(err)
	}
	if err := h.MarkFailed("out/b", "node store full"); err != nil {
		t.Fatal(err)
	}
	unchanged(t, tmpVictim, want)
	unchanged(t, nameVictim, want)
	if got := h.Failed("out/a"); got != "|/tmp/pwn core" {
		t.Errorf("Failed(out/a) = %q", got)
	}
	if got := h.Failed("out/b"); got != "node store full" {
		t.Errorf("Failed(out/b) = %q", got)
	}
	if err := h.Acquire(context.Background()); err == nil {
		t.Error("the materialiser lock was opened through a symlink")
	}
	unchanged(t, lockVictim, want)
	// A record that is a symlink to a file holding the right path is not believed.
	other := filepath.Join(t.TempDir(), "forged")
	if err := os.WriteFile(other, []byte("out/c\nforged"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(other, filepath.Join(dir, "failed", failedName("out/c"))); err != nil {
		t.Fatal(err)
	}
	if got := h.Failed("out/c"); got != "" {
		t.Errorf("Failed(out/c) read a record through a symlink: %q", got)
	}
}

// Inotify instances are counted per user on the node, and any pod may run as the
// sidecars' user and take them all: the host state then polls the progress file instead
// of failing, so a sidecar (or store server) still starts and still learns what the
// materialiser stored.
func TestHostStateWorksWithoutInotify(t *testing.T) {
	testenv.Root(t, "taking a user's inotify instances needs another uid")
	const uid = 64999 // a user no other test runs as
	dir := t.TempDir()
	if err := os.Chmod(filepath.Dir(dir), 0o711); err != nil { // the test's own, 0700
		t.Fatal(err)
	}
	if err := os.Chown(dir, uid, uid); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		// This thread alone becomes the user (the raw syscall changes one thread; the
		// locked thread is discarded when the goroutine ends).
		runtime.LockOSThread()
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uid, uid, 0); e != 0 {
			got <- fmt.Errorf("setresuid: %w", e)
			return
		}
		var taken []int
		defer func() {
			for _, fd := range taken {
				unix.Close(fd)
			}
		}()
		for {
			fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
			if err != nil {
				if !errors.Is(err, unix.EMFILE) {
					got <- fmt.Errorf("taking the user's inotify instances: %w", err)
					return
				}
				break
			}
			taken = append(taken, fd)
			if len(taken) > 1<<16 {
				got <- errors.New("the user's inotify instances seem unbounded")
				return
			}
		}
		follower, err := openDirHost(dir)
		if err != nil {
			got <- fmt.Errorf("with no inotify instance left: %w", err)
			return
		}
		defer follower.Close()
		materialiser, err := openDirHost(dir)
		if err != nil {
			got <- err
			return
		}
		defer materialiser.Close()
		if err := materialiser.SetProgress(42); err != nil {
			got <- err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := follower.WaitProgress(ctx, 42); err != nil {
			got <- fmt.Errorf("the follower never saw the materialiser's progress 42 (at %d): %w", follower.Progress(), err)
			return
		}
		got <- nil
	}()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}
