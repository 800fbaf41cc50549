package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// recorder is an Events and a Sink that records what it is told, refusing the names in
// refuse (as an engine refuses a path no rule governs).
type recorder struct {
	told   []string
	refuse map[string]bool
}

func (r *recorder) note(format string, a ...any) error {
	r.told = append(r.told, fmt.Sprintf(format, a...))
	return nil
}

func (r *recorder) Create(p string, dir bool) error     { return r.note("create %s", p) }
func (r *recorder) Write(p string, off, n int64) error  { return r.note("write %s %d+%d", p, off, n) }
func (r *recorder) Truncate(p string, size int64) error { return r.note("truncate %s %d", p, size) }
func (r *recorder) Remove(p string) error               { return r.note("remove %s", p) }
func (r *recorder) Wrote(p string, off int64, data []byte) {
	_ = r.note("wrote %s %d %q", p, off, data)
}

func (r *recorder) Rename(oldPath, newPath string, size int64) error {
	_ = r.note("rename %s %s %d", oldPath, newPath, size)
	if r.refuse[newPath] {
		return errors.New("refused")
	}
	return nil
}

func (r *recorder) want(t *testing.T, what string, want ...string) {
	t.Helper()
	if !slices.Equal(r.told, want) {
		t.Fatalf("%s told %q, want %q", what, r.told, want)
	}
	r.told = nil
}

// newFiles returns a store of limit bytes and its Files telling a recorder.
func newFiles(t *testing.T, limit int64) (*Store, *recorder, *Files) {
	t.Helper()
	s, err := New(t.TempDir(), Options{Limit: limit})
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	return s, rec, s.Files(rec)
}

// A write the store has no room for writes nothing and tells nobody; one that fits
// writes, is counted, and is told to the events, then to the sink.
func TestFilesWriteReservesFirst(t *testing.T) {
	s, rec, files := newFiles(t, 8)
	f, err := files.Create("f")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rec.want(t, "Create", "create f")
	ctx := context.Background()
	n, err := files.WriteAt(ctx, "f", int(f.Fd()), []byte("too many bytes"), 0)
	var re *ReserveError
	if n != 0 || !errors.As(err, &re) || !errors.Is(err, ErrNoSpace) {
		t.Fatalf("a write past the limit: %d bytes, %v; want 0 and a *ReserveError wrapping ErrNoSpace", n, err)
	}
	if st, _ := f.Stat(); st.Size() != 0 || s.Used() != 0 {
		t.Fatalf("after a refused write the file has %d bytes and the store counts %d; want nothing", st.Size(), s.Used())
	}
	rec.want(t, "a refused write")
	if n, err := files.WriteAt(ctx, "f", int(f.Fd()), []byte("abc"), 2); n != 3 || err != nil {
		t.Fatalf("a write that fits: %d bytes, %v", n, err)
	}
	if got, _ := os.ReadFile(s.Dir() + "/f"); string(got) != "\x00\x00abc" || s.Used() != 3 {
		t.Fatalf("after the write the file is %q and the store counts %d; want two zeros and abc, 3", got, s.Used())
	}
	rec.want(t, "a write", "write f 2+3", `wrote f 2 "abc"`)
	if err := files.Truncate("f", int(f.Fd()), 1); err != nil {
		t.Fatal(err)
	}
	if st, _ := f.Stat(); st.Size() != 1 || s.Used() != 0 {
		t.Fatalf("after a truncation to 1 byte the file has %d and the store counts %d; want 1 and 0", st.Size(), s.Used())
	}
	rec.want(t, "Truncate", "truncate f 1")
}

// A rename moves the bytes, their accounting and the events' file together; a name the
// events refuse takes the old one out of them, since it left the store all the same.
func TestFilesRenameMovesEverything(t *testing.T) {
	s, rec, files := newFiles(t, 100)
	rec.refuse = map[string]bool{"ungoverned": true}
	f, err := files.Create("tmp")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := files.WriteAt(context.Background(), "tmp", int(f.Fd()), make([]byte, 60), 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	rec.told = nil
	if err := files.Rename("tmp", "final", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Lstat("tmp"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the old name is still in the store: %v", err)
	}
	if st, err := s.Lstat("final"); err != nil || st.Size != 60 {
		t.Fatalf("the new name: %v, %d bytes; want 60", err, st.Size)
	}
	rec.want(t, "Rename", "rename tmp final 60")
	// The bytes are counted under the new name: removing it frees them.
	if s.Used() != 60 {
		t.Fatalf("the store counts %d after the rename, want 60", s.Used())
	}
	if err := files.Rename("final", "ungoverned", 0); err != nil {
		t.Fatal(err)
	}
	rec.want(t, "a refused rename", "rename final ungoverned 60", "remove final")
	if err := files.Remove("ungoverned"); err != nil {
		t.Fatal(err)
	}
	if s.Used() != 0 {
		t.Fatalf("the store counts %d after the renamed file's removal, want 0", s.Used())
	}
	rec.want(t, "Remove", "remove ungoverned")
	// A rename the store refuses changes nothing and tells nobody.
	if err := files.Rename("absent", "x", unix.RENAME_NOREPLACE); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("renaming a missing file: %v, want ErrNotExist", err)
	}
	rec.want(t, "a failed rename")
}

// Create of a file that exists empties it: its accounting is reset and the events hear
// the truncation after the creation (they may know its bytes); a new file is only
// created.
func TestFilesCreateOfAnExistingFileTruncates(t *testing.T) {
	s, rec, files := newFiles(t, 100)
	f, err := files.Create("f")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := files.WriteAt(context.Background(), "f", int(f.Fd()), make([]byte, 60), 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	rec.want(t, "Create, WriteAt", "create f", "write f 0+60", fmt.Sprintf("wrote f 0 %q", make([]byte, 60)))
	if f, err = files.Create("f"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	rec.want(t, "Create of an existing file", "create f", "truncate f 0")
	if st, err := s.Lstat("f"); err != nil || st.Size != 0 || s.Used() != 0 {
		t.Fatalf("after Create of the existing f: %d bytes (%v), the store counts %d; want nothing", st.Size, err, s.Used())
	}
}

// The unlink of a name that another writer (another view) is renaming away, caught
// between the rename of the store file and the move of its accounting, fails with
// ENOENT and leaves the accounting alone: the bytes stay counted under the new name, and
// removing that frees them.
func TestFilesRemoveRacingARename(t *testing.T) {
	s, _, files := newFiles(t, 100)
	f, err := files.Create("a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := files.WriteAt(context.Background(), "a", int(f.Fd()), make([]byte, 60), 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	other := s.Files(&recorder{})
	removed := make(chan error, 1)
	s.renamed = func() {
		s.renamed = nil
		go func() { removed <- other.Remove("a") }()
		// Give the unlink the chance to run in the middle of the rename: it must wait
		// for the rename to end, or find nothing to drop (it is done at once without).
		select {
		case err := <-removed:
			removed <- err
		case <-time.After(200 * time.Millisecond):
		}
	}
	if err := files.Rename("a", "b", 0); err != nil {
		t.Fatal(err)
	}
	if err := <-removed; !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("removing a while it was renamed to b: %v, want ErrNotExist", err)
	}
	if used := s.Used(); used != 60 {
		t.Fatalf("the store counts %d bytes for b after the racing unlink of a, want 60", used)
	}
	if err := files.Remove("b"); err != nil {
		t.Fatal(err)
	}
	if used := s.Used(); used != 0 {
		t.Fatalf("the store counts %d bytes once b is removed, want 0", used)
	}
}

// RENAME_EXCHANGE swaps the accounting of the two names with their bytes.
func TestFilesRenameExchange(t *testing.T) {
	s, rec, files := newFiles(t, 100)
	for name, size := range map[string]int{"a": 10, "b": 30} {
		f, err := files.Create(name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := files.WriteAt(context.Background(), name, int(f.Fd()), make([]byte, size), 0); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	rec.told = nil
	if err := files.Rename("a", "b", unix.RENAME_EXCHANGE); err != nil {
		t.Fatal(err)
	}
	rec.want(t, "an exchange")
	if err := files.Remove("a"); err != nil { // now the 30 bytes
		t.Fatal(err)
	}
	if s.Used() != 10 {
		t.Fatalf("after the exchange and removing a (30 bytes), the store counts %d; want 10", s.Used())
	}
}

// A directory's rename takes the accounting of the files beneath it along (mv work out):
// rewriting a file under the new name counts nothing twice, removing it frees its bytes;
// an exchange of two directories swaps what is counted beneath them.
func TestFilesRenameDirectoryMovesItsFiles(t *testing.T) {
	s, _, files := newFiles(t, 100)
	ctx := context.Background()
	write := func(p string, n int) {
		t.Helper()
		f, err := files.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := files.WriteAt(ctx, p, int(f.Fd()), make([]byte, n), 0); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"work/sub", "other"} {
		if err := s.MkdirAll(d); err != nil {
			t.Fatal(err)
		}
	}
	write("work/sub/f", 60)
	if err := files.Rename("work", "out", 0); err != nil {
		t.Fatal(err)
	}
	fd, err := s.Open("out/sub/f", unix.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if _, err := files.WriteAt(ctx, "out/sub/f", fd, make([]byte, 60), 0); err != nil || s.Used() != 60 {
		t.Fatalf("rewriting the renamed file: %v, the store counts %d; want 60", err, s.Used())
	}
	write("other/g", 10)
	if err := files.Rename("out", "other", unix.RENAME_EXCHANGE); err != nil {
		t.Fatal(err)
	}
	if err := files.Remove("other/sub/f"); err != nil {
		t.Fatal(err)
	}
	if s.Used() != 10 {
		t.Fatalf("after removing the 60 bytes exchanged into other/, the store counts %d; want 10", s.Used())
	}
	if err := files.Remove("out/g"); err != nil {
		t.Fatal(err)
	}
	if s.Used() != 0 {
		t.Fatalf("after removing every file the store counts %d; want 0", s.Used())
	}
}
