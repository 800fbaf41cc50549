package store

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// spillStore returns a store with a memory tier of limit bytes and a disk tier of
// diskLimit (0: unbounded) where every file but "pinned" may live while being written,
// and no file is committed (SetSpillable accepts only the names in committed).
func spillStore(t *testing.T, limit, diskLimit int64, wait time.Duration, committed ...string) (*Store, string, string) {
	t.Helper()
	mem, disk := t.TempDir(), t.TempDir()
	s, err := New(mem, Options{Limit: limit, Disk: disk, DiskLimit: diskLimit, SpaceWait: wait,
		OnDisk: func(string) bool { return false }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	s.SetSpillable(func(rel string) bool {
		for _, c := range committed {
			if rel == c {
				return true
			}
		}
		return false
	})
	s.SetSpillWritten(func(rel string) bool { return rel != "pinned" })
	return s, mem, disk
}

// writeAt appends data to the store file rel at off, with its reservation, as a view's
// write does.
func writeAt(s *Store, rel string, off int64, data string) error {
	f, err := s.OpenFile(rel, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := s.reserveUpTo(context.Background(), rel, off+int64(len(data))); err != nil {
		return err
	}
	_, err = f.WriteAt([]byte(data), off)
	return err
}

// While the memory tier's files being written take half its limit or more, a new file
// that may live on disk is created in the disk tier (and counted as spilled); a file
// pinned to memory, or one created while the memory tier's bytes are committed files
// that could move, is created in memory.
func TestSpillCreatesNewFilesOnDiskWhileMemoryIsTaken(t *testing.T) {
	s, mem, disk := spillStore(t, 16<<10, 0, 0, "done")
	if err := writeAt(s, "a", 0, strings.Repeat("a", 8<<10)); err != nil {
		t.Fatal(err)
	}
	if err := writeAt(s, "b", 0, strings.Repeat("b", 6<<10)); err != nil {
		t.Fatalf("a file created while half the memory tier is taken: %v", err)
	}
	if _, err := os.Stat(filepath.Join(disk, "b")); err != nil {
		t.Errorf("b is not in the disk tier: %v", err)
	}
	if _, err := os.Stat(filepath.Join(mem, "a")); err != nil {
		t.Errorf("a (created when the memory tier was empty) is not in it: %v", err)
	}
	if err := writeAt(s, "pinned", 0, "p"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(mem, "pinned")); err != nil {
		t.Errorf("a file that may not live on disk is not in the memory tier: %v", err)
	}
	if files, bytes := s.Spilled(); files != 1 || bytes != 6<<10 {
		t.Errorf("Spilled() = %d files, %d bytes; want b's 1 and 6 KiB", files, bytes)
	}
	if s.Used() != 8<<10+1 || s.DiskUsed() != 6<<10 {
		t.Errorf("used %d in memory, %d on disk", s.Used(), s.DiskUsed())
	}

	// Committed bytes can move on demand: they leave the memory tier to new files.
	s2, mem2, _ := spillStore(t, 16<<10, 0, 0, "done")
	if err := writeAt(s2, "done", 0, strings.Repeat("d", 12<<10)); err != nil {
		t.Fatal(err)
	}
	if err := writeAt(s2, "c", 0, "c"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(mem2, "c")); err != nil {
		t.Errorf("c, created while the memory tier held only a committed file, is not in it: %v", err)
	}
}

// When a file being written needs space the memory tier does not have, another file
// being written moves to the disk tier once no descriptor has it open: while a reader has
// it open, it stays and the write waits; the reader's close lets the waiting write go on.
// The moved file keeps its bytes and inode number, and a writer reopening it appends to
// the disk copy.
func TestSpillMovesFilesBeingWrittenOnceClosed(t *testing.T) {
	s, mem, disk := spillStore(t, 16<<10, 0, 10*time.Second)
	ctx := context.Background()
	// Both created while the memory tier is empty: both in it.
	for _, rel := range []string{"a", "b"} {
		if err := writeAt(s, rel, 0, ""); err != nil {
			t.Fatal(err)
		}
	}
	a := strings.Repeat("a", 10<<10)
	if err := writeAt(s, "a", 0, a); err != nil {
		t.Fatal(err)
	}
	before, err := s.Lstat("a")
	if err != nil {
		t.Fatal(err)
	}
	reader, err := s.OpenFile("a", os.O_RDONLY, 0) // a NoUpdate consumer mid-file
	if err != nil {
		t.Fatal(err)
	}
	first := make([]byte, 1000)
	if _, err := io.ReadFull(reader, first); err != nil {
		t.Fatal(err)
	}
	// While the reader has a open, no wait makes room.
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if err := s.reserveUpTo(short, "b", 10<<10); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("b's write while a, which it needs moved, was open: %v, want it to wait", err)
	}
	if _, err := os.Stat(filepath.Join(mem, "a")); err != nil {
		t.Fatalf("a moved while a reader had it open: %v", err)
	}
	rest, err := io.ReadAll(reader)
	if err != nil || string(first)+string(rest) != a {
		t.Errorf("the reader read %d bytes of a (%v), want its %d", len(first)+len(rest), err, len(a))
	}
	// A write waiting when the reader closes goes on (within the 10 s it may wait).
	done := make(chan error, 1)
	go func() { done <- s.reserveUpTo(ctx, "b", 10<<10) }()
	reader.Close()
	if err := <-done; err != nil {
		t.Fatalf("b's write after a's last descriptor closed: %v", err)
	}
	if got, err := os.ReadFile(filepath.Join(disk, "a")); err != nil || string(got) != a {
		t.Errorf("a in the disk tier: %d bytes (%v)", len(got), err)
	}
	if _, err := os.Stat(filepath.Join(mem, "a")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a is still in the memory tier (%v)", err)
	}
	after, err := s.Lstat("a")
	if err != nil || after.Ino != before.Ino || after.Size != before.Size {
		t.Errorf("a after the move: ino %d size %d (%v); before: ino %d size %d", after.Ino, after.Size, err, before.Ino, before.Size)
	}
	// Its writer comes back (OnTermination: it may): the bytes go to the disk copy.
	if err := writeAt(s, "a", int64(len(a)), "tail"); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(disk, "a")); err != nil || string(got) != a+"tail" {
		t.Errorf("a in the disk tier after its writer appended: %d bytes (%v)", len(got), err)
	}
	if s.Used() != 10<<10 || s.DiskUsed() != 10<<10+4 {
		t.Errorf("used %d in memory, %d on disk; want b's 10 KiB and a's", s.Used(), s.DiskUsed())
	}
	if files, bytes := s.Spilled(); files != 1 || bytes != 10<<10+4 {
		t.Errorf("Spilled() = %d files, %d bytes; want a's 1 and 10 KiB + 4", files, bytes)
	}
}

// A file pinned to memory never moves, and nothing moves past the disk tier's limit: the
// write then fails with ENOSPC; a file in the disk tier that fills it fails naming it.
func TestSpillStopsAtPinnedFilesAndAFullDiskTier(t *testing.T) {
	s, mem, _ := spillStore(t, 16<<10, 8<<10, 0)
	for _, rel := range []string{"pinned", "big", "w"} {
		if err := writeAt(s, rel, 0, ""); err != nil {
			t.Fatal(err)
		}
	}
	if err := writeAt(s, "pinned", 0, strings.Repeat("p", 4<<10)); err != nil {
		t.Fatal(err)
	}
	if err := writeAt(s, "big", 0, strings.Repeat("b", 9<<10)); err != nil {
		t.Fatal(err)
	}
	err := s.reserveUpTo(context.Background(), "w", 4<<10)
	if !errors.Is(err, ErrNoSpace) || !strings.Contains(err.Error(), "memory tier") || !strings.Contains(err.Error(), "the disk tier has") {
		t.Errorf("a write whose room only a move past the disk tier's limit would make: %v, want ErrNoSpace naming the memory tier and the full disk tier", err)
	}
	for _, rel := range []string{"pinned", "big"} {
		if _, err := os.Stat(filepath.Join(mem, rel)); err != nil {
			t.Errorf("%s left the memory tier: %v", rel, err)
		}
	}
	// A new file goes to the disk tier (the memory tier is taken), and fills it.
	if err := writeAt(s, "new", 0, strings.Repeat("n", 8<<10)); err != nil {
		t.Fatal(err)
	}
	err = writeAt(s, "new", 8<<10, "x")
	if !errors.Is(err, ErrNoSpace) || !strings.Contains(err.Error(), "disk tier") {
		t.Errorf("a write past the disk tier's limit: %v, want ErrNoSpace naming the disk tier", err)
	}
}
