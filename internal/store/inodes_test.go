package store

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sluice-io/sluice/internal/testenv"
)

// A memory tier on a tmpfs whose inodes run out answers ENOSPC, as the kernel does, with
// an error that names the tier and its directory (store.InodesError), for every way of
// making a name: a file, a directory, a symlink, a special file, an O_TMPFILE file.
func TestTierOutOfInodesIsNamed(t *testing.T) {
	testenv.Root(t, "mounts a tmpfs with few inodes")
	dir := filepath.Join(t.TempDir(), "tier")
	if err := unix.Mkdir(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m,nr_inodes=16,mode=0777"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	s, err := New(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var last error
	n := 0
	for ; n < 100; n++ {
		fd, err := s.Open(fmt.Sprintf("f%d", n), unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY, 0o644)
		if err != nil {
			last = err
			break
		}
		unix.Close(fd)
	}
	if n >= 16 || last == nil {
		t.Fatalf("created %d files in a tier of 16 inodes (error %v)", n, last)
	}
	for what, err := range map[string]error{
		"create":    last,
		"mkdir":     s.Mkdir("d", 0o755),
		"symlink":   s.Symlink("f0", "l"),
		"mknod":     s.Mknod("p", unix.S_IFIFO|0o644, 0),
		"O_TMPFILE": func() error { _, err := s.OpenTmpfile(".", unix.O_WRONLY, 0o644); return err }(),
	} {
		var inodes *InodesError
		if !errors.Is(err, ErrNoInodes) || !errors.Is(err, syscall.ENOSPC) || !errors.As(err, &inodes) {
			t.Errorf("%s in a tier out of inodes: %v, want ENOSPC and ErrNoInodes", what, err)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, "memory tier ("+dir+") is out of inodes") || inodes.Files != 16 {
			t.Errorf("%s: %q (%d inodes), want it to name the memory tier %s and its 16 inodes", what, msg, inodes.Files, dir)
		}
	}
}

// Probing a store's directory for owners on a tmpfs out of inodes is an error, which
// New returns, not OwnersNone (a view of it would be mounted without the kernel's
// permission checks).
func TestStoreOnATierOutOfInodesIsNotOpened(t *testing.T) {
	testenv.Root(t, "mounts a tmpfs with few inodes")
	dir := filepath.Join(t.TempDir(), "tier")
	if err := unix.Mkdir(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m,nr_inodes=4,mode=0777"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	for i := 0; ; i++ {
		if err := unix.Mkdir(filepath.Join(dir, fmt.Sprintf("d%d", i)), 0o755); err != nil {
			break
		}
	}
	// As an unprivileged sidecar probes (New as root keeps real owners, no probe).
	if o, err := ProbeOwners(dir, false); !errors.Is(err, syscall.ENOSPC) || o != OwnersNone {
		t.Errorf("ProbeOwners on a tier out of inodes = %v, %v; want the probe's ENOSPC", o, err)
	}
}
