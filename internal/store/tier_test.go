package store

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// tiered returns a store whose files under "fs/" go to its disk tier.
func tiered(t *testing.T, limit, diskLimit int64) (*Store, string, string) {
	t.Helper()
	mem, disk := t.TempDir(), t.TempDir()
	s, err := New(mem, Options{Limit: limit, Disk: disk, DiskLimit: diskLimit,
		OnDisk: func(rel string) bool { return strings.HasPrefix(rel, "fs/") }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.MkdirAll("fs/sub"); err != nil {
		t.Fatal(err)
	}
	return s, mem, disk
}

func write(t *testing.T, s *Store, rel, data string) {
	t.Helper()
	f, err := s.OpenFile(rel, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := s.reserveUpTo(context.Background(), rel, int64(len(data))); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(data); err != nil {
		t.Fatal(err)
	}
}

// One namespace over two tiers: a file is created in the tier its path says, read,
// listed, stat'ed (with a distinct inode number), renamed and linked within its tier, and
// removed; directories are the memory tier's.
func TestDiskTierNamespace(t *testing.T) {
	s, mem, disk := tiered(t, 0, 0)
	write(t, s, "fs/sub/big", "on disk")
	write(t, s, "top", "in memory")
	if _, err := os.Stat(filepath.Join(disk, "fs/sub/big")); err != nil {
		t.Errorf("fs/sub/big is not in the disk tier: %v", err)
	}
	if _, err := os.Stat(filepath.Join(mem, "fs/sub/big")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("fs/sub/big is in the memory tier too (%v)", err)
	}
	if _, err := os.Stat(filepath.Join(mem, "top")); err != nil {
		t.Errorf("top is not in the memory tier: %v", err)
	}
	st, err := s.Lstat("fs/sub/big")
	if err != nil || st.Size != 7 || st.Ino&DiskInoBit == 0 {
		t.Fatalf("Lstat of a disk file: size %d, ino %#x (%v); want 7 bytes and DiskInoBit", st.Size, st.Ino, err)
	}
	fd, err := s.Open("fs/sub/big", unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fst, err := s.Fstat(fd)
	unix.Close(fd)
	if err != nil || fst.Ino != st.Ino {
		t.Errorf("Fstat inode %#x, Lstat %#x (%v): want the same", fst.Ino, st.Ino, err)
	}
	if top, _ := s.Lstat("top"); top.Ino&DiskInoBit != 0 {
		t.Errorf("a memory file's inode %#x carries DiskInoBit", top.Ino)
	}
	entries, err := s.ReadDir("fs/sub")
	if err != nil || len(entries) != 1 || entries[0].Name() != "big" {
		t.Errorf("ReadDir(fs/sub) = %v (%v), want [big]", entries, err)
	}
	// A disk file keeps its tier under a new name, in a directory the disk tier did not
	// have; the name it replaces in the memory tier goes.
	write(t, s, "elsewhere", "replaced")
	if err := s.MkdirAll("dir"); err != nil {
		t.Fatal(err)
	}
	if err := s.renameAt("fs/sub/big", "dir/big", 0); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(disk, "dir/big")); err != nil || string(b) != "on disk" {
		t.Errorf("renamed disk file: %q (%v)", b, err)
	}
	if err := s.renameAt("dir/big", "elsewhere", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(mem, "elsewhere")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the memory file a disk file was renamed onto is still there (%v)", err)
	}
	if err := s.renameAt("top", "elsewhere", unix.RENAME_NOREPLACE); !errors.Is(err, unix.EEXIST) {
		t.Errorf("RENAME_NOREPLACE onto a disk file: %v, want EEXIST", err)
	}
	if err := s.Link("elsewhere", "dir/link"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(disk, "dir/link")); err != nil {
		t.Errorf("hard link of a disk file is not in the disk tier: %v", err)
	}
	// Directories: listed once, removed from both tiers.
	root, _ := s.ReadDir(".")
	var names []string
	for _, e := range root {
		names = append(names, e.Name())
	}
	slices.Sort(names)
	if want := []string{"dir", "elsewhere", "fs", "top"}; !slices.Equal(names, want) {
		t.Errorf("ReadDir(.) = %v, want %v", names, want)
	}
	if err := s.Rmdir("dir"); !errors.Is(err, unix.ENOTEMPTY) {
		t.Errorf("Rmdir of a directory whose disk copy holds a file: %v, want ENOTEMPTY", err)
	}
	if _, err := s.Remove("dir/link"); err != nil {
		t.Fatal(err)
	}
	if err := s.Rmdir("dir"); err != nil {
		t.Errorf("Rmdir of an empty directory: %v", err)
	}
	if _, err := os.Stat(filepath.Join(disk, "dir")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the disk tier's copy of a removed directory stays (%v)", err)
	}
	var walked []string
	if err := s.WalkFiles(func(ino uint64, rel string) error {
		walked = append(walked, rel)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(walked, "elsewhere") || !slices.Contains(walked, "top") {
		t.Errorf("WalkFiles saw %v", walked)
	}
}

// Each tier has its own limit: the disk tier's full ends a reservation with ErrNoSpace
// naming it, while the memory tier still has room; a new store over the same directories
// counts what each holds.
func TestDiskTierLimit(t *testing.T) {
	s, mem, disk := tiered(t, 100, 50)
	ctx := context.Background()
	write(t, s, "fs/a", strings.Repeat("a", 40))
	f, err := s.OpenFile("fs/b", os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	err = s.reserveUpTo(ctx, "fs/b", 20)
	if !errors.Is(err, ErrNoSpace) || !strings.Contains(err.Error(), "disk tier") {
		t.Fatalf("over the disk tier's limit: %v, want ErrNoSpace naming the disk tier", err)
	}
	write(t, s, "m", strings.Repeat("m", 90)) // the memory tier is another budget
	if s.Used() != 90 || s.DiskUsed() != 40 {
		t.Errorf("used %d in memory, %d on disk; want 90 and 40", s.Used(), s.DiskUsed())
	}
	if _, err := s.Remove("fs/a"); err != nil {
		t.Fatal(err)
	}
	if err := s.reserveUpTo(ctx, "fs/b", 20); err != nil || s.DiskUsed() != 20 {
		t.Errorf("after removing fs/a: %v, disk used %d", err, s.DiskUsed())
	}
	again, err := New(mem, Options{Limit: 100, Disk: disk, DiskLimit: 50, OnDisk: func(rel string) bool { return strings.HasPrefix(rel, "fs/") }})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if again.Used() != 90 || again.DiskUsed() != 0 {
		// fs/b was reserved, not written: its file is empty.
		t.Errorf("reopened: used %d in memory, %d on disk; want 90 and 0", again.Used(), again.DiskUsed())
	}
}

// When the memory tier is full, a write moves committed files to the disk tier (least
// recently opened first) before it waits: the moved file keeps its inode number and its
// bytes, a descriptor opened before the move reads it whole, and a file that may not move
// stays.
func TestSpillMovesCommittedFilesToDisk(t *testing.T) {
	s, mem, disk := tiered(t, 10<<10, 0)
	ctx := context.Background()
	a, b := strings.Repeat("a", 4<<10), strings.Repeat("b", 4<<10)
	write(t, s, "old", a)
	write(t, s, "pinned", b)
	s.SetSpillable(func(rel string) bool { return rel != "pinned" })
	before, err := s.Lstat("old")
	if err != nil {
		t.Fatal(err)
	}
	reader, err := s.OpenFile("old", os.O_RDONLY, 0) // a reader mid-file
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	first := make([]byte, 1000)
	if _, err := io.ReadFull(reader, first); err != nil {
		t.Fatal(err)
	}
	f, err := s.OpenFile("new", os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := s.reserveUpTo(ctx, "new", 5<<10); err != nil {
		t.Fatalf("a write that spilling makes room for: %v", err)
	}
	if _, err := os.Stat(filepath.Join(mem, "old")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("old is still in the memory tier (%v)", err)
	}
	if got, err := os.ReadFile(filepath.Join(disk, "old")); err != nil || string(got) != a {
		t.Errorf("old in the disk tier: %d bytes (%v)", len(got), err)
	}
	if _, err := os.Stat(filepath.Join(mem, "pinned")); err != nil {
		t.Errorf("the file that may not move moved: %v", err)
	}
	after, err := s.Lstat("old")
	if err != nil || after.Ino != before.Ino || after.Size != before.Size {
		t.Errorf("old after the move: ino %d size %d (%v); before: ino %d size %d", after.Ino, after.Size, err, before.Ino, before.Size)
	}
	rest, err := io.ReadAll(reader)
	if err != nil || string(first)+string(rest) != a {
		t.Errorf("the reader that had old open read %d bytes (%v), want its %d", len(first)+len(rest), err, len(a))
	}
	if files, bytes := s.Spilled(); files != 1 || bytes != int64(len(a)) {
		t.Errorf("Spilled() = %d files, %d bytes; want 1, %d", files, bytes, len(a))
	}
	if s.Used() != int64(len(b))+5<<10 || s.DiskUsed() != int64(len(a)) {
		t.Errorf("used %d in memory, %d on disk", s.Used(), s.DiskUsed())
	}
	// Nothing else may move: past the limit, the write fails.
	if err := s.reserveUpTo(ctx, "new", 12<<10); !errors.Is(err, ErrNoSpace) {
		t.Errorf("a write no spill can make room for: %v, want ErrNoSpace", err)
	}
}
