package store

import (
	"context"
	"errors"
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
	if err := s.Reserve(context.Background(), rel, int64(len(data))); err != nil {
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
	if err := s.RenameAt("fs/sub/big", "dir/big", 0); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(disk, "dir/big")); err != nil || string(b) != "on disk" {
		t.Errorf("renamed disk file: %q (%v)", b, err)
	}
	if err := s.RenameAt("dir/big", "elsewhere", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(mem, "elsewhere")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the memory file a disk file was renamed onto is still there (%v)", err)
	}
	if err := s.RenameAt("top", "elsewhere", unix.RENAME_NOREPLACE); !errors.Is(err, unix.EEXIST) {
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
	err = s.Reserve(ctx, "fs/b", 20)
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
	if err := s.Reserve(ctx, "fs/b", 20); err != nil || s.DiskUsed() != 20 {
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
