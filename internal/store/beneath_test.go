package store

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// A directory of the store swapped for a symlink to a directory outside it (what a step
// can do to another step's directory) never takes the store's operations outside: every
// call through it fails (ELOOP, or ENOTDIR where the symlink itself is the directory
// asked for) and the outside directory is untouched; the symlink
// itself can still be looked at, read and removed.
func TestSymlinkedDirectoryIsNeverFollowed(t *testing.T) {
	outside := t.TempDir()
	secret := filepath.Join(outside, "secret")
	if err := os.WriteFile(secret, []byte("outside"), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	s, err := New(filepath.Join(dir, "store"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := os.Symlink(outside, filepath.Join(dir, "store", "d")); err != nil {
		t.Fatal(err)
	}
	for name, op := range map[string]func() error{
		"open for reading": func() error { fd, err := s.Open("d/secret", syscall.O_RDONLY, 0); syscall.Close(fd); return err },
		"create": func() error {
			fd, err := s.Open("d/new", syscall.O_CREAT|syscall.O_WRONLY, 0o644)
			syscall.Close(fd)
			return err
		},
		"lstat":             func() error { _, err := s.Lstat("d/secret"); return err },
		"truncate":          func() error { return s.truncate("d/secret", 0) },
		"chmod":             func() error { return s.Chmod("d/secret", 0o777) },
		"unlink":            func() error { return s.unlink("d/secret") },
		"rename out of it":  func() error { return s.renameAt("d/secret", "stolen", 0) },
		"mkdir in it":       func() error { return s.MkdirAll("d/sub") },
		"list it":           func() error { _, err := s.ReadDir("d"); return err },
		"hard link from it": func() error { return s.LinkOut("d/secret", filepath.Join(dir, "linked")) },
	} {
		if err := op(); !errors.Is(err, syscall.ELOOP) && !errors.Is(err, syscall.ENOTDIR) {
			t.Errorf("%s through the symlinked directory: %v, want ELOOP (or ENOTDIR)", name, err)
		}
	}
	if b, err := os.ReadFile(secret); err != nil || string(b) != "outside" {
		t.Errorf("the file outside the store is %q (%v), want it untouched", b, err)
	}
	if entries, _ := os.ReadDir(outside); len(entries) != 1 {
		t.Errorf("the outside directory holds %d entries, want only its own file", len(entries))
	}
	if st, err := s.Lstat("d"); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFLNK {
		t.Errorf("lstat of the symlink itself: %v", err)
	}
	if target, err := s.Readlink("d"); err != nil || target != outside {
		t.Errorf("readlink = %q (%v)", target, err)
	}
	if fd, err := s.Open("d", syscall.O_RDONLY, 0); !errors.Is(err, syscall.ELOOP) {
		syscall.Close(fd)
		t.Errorf("opening the symlink itself: %v, want ELOOP (O_NOFOLLOW)", err)
	}
	if err := s.unlink("d"); err != nil {
		t.Errorf("removing the symlink: %v", err)
	}
}

// Paths longer than PATH_MAX resolve a piece at a time.
func TestPathsBeyondPathMax(t *testing.T) {
	s, err := New(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var parts []string
	for i := 0; len(strings.Join(parts, "/")) < 5000; i++ {
		parts = append(parts, strings.Repeat("x", 200))
	}
	deep := strings.Join(parts, "/")
	if err := s.MkdirAll(deep); err != nil {
		t.Fatalf("mkdir -p of a %d-byte path: %v", len(deep), err)
	}
	fd, err := s.Open(deep+"/f", syscall.O_CREAT|syscall.O_WRONLY, 0o644)
	if err != nil {
		t.Fatalf("creating a file at a %d-byte path: %v", len(deep)+2, err)
	}
	syscall.Close(fd)
	if st, err := s.Lstat(deep + "/f"); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		t.Errorf("lstat at a %d-byte path: %v", len(deep)+2, err)
	}
}

// Open takes the flags a FUSE OPEN or CREATE carries as they come, including one openat2(2)
// refuses (__FMODE_EXEC, 0x20, which the kernel sets when a program is executed from the
// volume) and a creation mode with file type bits, as open(2) does: the file is created
// with the permission bits and opened.
func TestOpenTakesTheFlagsAFUSEOpenCarries(t *testing.T) {
	s, err := New(t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const fmodeExec = 0x20
	if fd, err := s.Open("d/x", syscall.O_CREAT|syscall.O_WRONLY, syscall.S_IFREG|0o751); !errors.Is(err, syscall.ENOENT) {
		syscall.Close(fd)
		t.Errorf("creating a file in a missing directory: %v, want ENOENT", err)
	}
	if err := s.MkdirAll("d"); err != nil {
		t.Fatal(err)
	}
	fd, err := s.Open("d/x", syscall.O_CREAT|syscall.O_WRONLY, syscall.S_IFREG|0o751)
	if err != nil {
		t.Fatalf("creating with S_IFREG in the mode: %v", err)
	}
	syscall.Close(fd)
	if st, err := s.Lstat("d/x"); err != nil || st.Mode != syscall.S_IFREG|0o751 {
		t.Errorf("created file: mode %o (%v), want %o", st.Mode, err, syscall.S_IFREG|0o751)
	}
	if fd, err = s.Open("d/x", syscall.O_RDONLY|fmodeExec|0x8000, 0); err != nil {
		t.Fatalf("opening with __FMODE_EXEC and O_LARGEFILE: %v", err)
	}
	syscall.Close(fd)
	if _, err := s.Open("d/../../x", syscall.O_RDONLY, 0); err == nil {
		t.Error("a path with .. leaving the store opened")
	}
}

// Close frees the store's root descriptors even while operations run: each operation in
// progress keeps the root it resolves beneath until it returns (its descriptor number is
// never reused under it), and every operation after Close fails with os.ErrClosed instead
// of resolving beneath whatever the number names next.
func TestCloseWhileOperationsRun(t *testing.T) {
	dir := t.TempDir()
	s, err := New(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	var wg, started sync.WaitGroup
	for range 4 {
		wg.Add(1)
		started.Add(1)
		go func() {
			defer wg.Done()
			for first := true; ; first = false {
				fd, err := s.Open("f", os.O_RDONLY, 0)
				if first {
					started.Done()
				}
				if err != nil {
					if !errors.Is(err, os.ErrClosed) {
						t.Errorf("open after or during Close: %v, want os.ErrClosed", err)
					}
					return
				}
				syscall.Close(fd)
			}
		}()
	}
	started.Wait() // every opener is in its loop
	if err := s.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	wg.Wait()
	if err := s.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}
	for _, op := range []func() error{
		func() error { _, err := s.Lstat("f"); return err },
		func() error { return s.Mkdir("d", 0o755) },
		func() error { _, err := s.Open("d/f", os.O_RDONLY, 0); return err },
	} {
		if err := op(); !errors.Is(err, os.ErrClosed) {
			t.Errorf("operation after Close: %v, want os.ErrClosed", err)
		}
	}
}
