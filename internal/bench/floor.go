package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// openClose opens the file at p read-only and closes it.
func openClose(p string) error {
	fd, err := syscall.Open(p, syscall.O_RDONLY, 0)
	if err == nil {
		syscall.Close(fd)
	}
	return err
}

// floorFile is the one file of fuseFloor's file system: its open does nothing and asks
// for no flush at close, so an open+close of it costs the kernel's one OPEN round trip
// (RELEASE is sent without waiting), and nothing of a server's own work.
type floorFile struct{ fs.Inode }

var _ fs.NodeOpener = (*floorFile)(nil)

// Open answers at once; FOPEN_KEEP_CACHE and FOPEN_NOFLUSH as a Sluice view answers a
// committed file's open.
func (f *floorFile) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	return nil, fuse.FOPEN_KEEP_CACHE | fuse.FOPEN_NOFLUSH, 0
}

// floorRoot is fuseFloor's root directory, holding the file "f".
type floorRoot struct{ fs.Inode }

var _ fs.NodeOnAdder = (*floorRoot)(nil)

// OnAdd adds the file "f".
func (r *floorRoot) OnAdd(ctx context.Context) {
	r.AddChild("f", r.NewPersistentInode(ctx, &floorFile{}, fs.StableAttr{Ino: 2}), false)
}

// fuseFloor mounts a minimal go-fuse file system (the library Sluice's views are built
// on, with the same mount options and an hour of entry and attribute caching) under dir
// and returns the mean latency of n open+close calls of its one file, in microseconds:
// the cost of one FUSE round trip on this machine, below which no FUSE volume's open can
// go.
func fuseFloor(dir string, n int) (float64, error) {
	mnt := filepath.Join(dir, "floor")
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		return 0, err
	}
	hour := time.Hour
	srv, err := fs.Mount(mnt, &floorRoot{}, &fs.Options{
		EntryTimeout: &hour, AttrTimeout: &hour,
		MountOptions: fuse.MountOptions{DirectMount: true, FsName: "sluice-floor", Name: "sluice", MaxWrite: 1 << 20},
	})
	if err != nil {
		return 0, fmt.Errorf("mounting the go-fuse baseline at %s: %w", mnt, err)
	}
	defer srv.Unmount()
	return latency(n, func() error { return openClose(filepath.Join(mnt, "f")) })
}
