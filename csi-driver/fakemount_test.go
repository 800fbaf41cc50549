package csidriver

import (
	"os"
	"path/filepath"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// fakeMounter is a mount table in memory: Mount records a mount, Unmount removes the
// topmost one at a path, Mounts lists them. Nothing reaches the kernel, so the tests of
// requests and locking need no root. onMount, when set, is called before a mount is
// recorded: a test holds a publish there.
type fakeMounter struct {
	mu      sync.Mutex
	table   []mountInfo
	onMount func(target string)
}

func (f *fakeMounter) Mount(source, target, fstype string, flags uintptr, _ string) error {
	if f.onMount != nil {
		f.onMount(target)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if flags&unix.MS_REMOUNT != 0 {
		return nil
	}
	f.table = append(f.table, mountInfo{mountPoint: target, fsType: fstype, source: source})
	return nil
}

func (f *fakeMounter) Unmount(target string, _ int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := len(f.table) - 1; i >= 0; i-- {
		if f.table[i].mountPoint == target {
			f.table = append(f.table[:i], f.table[i+1:]...)
			return nil
		}
	}
	return unix.EINVAL
}

func (f *fakeMounter) Mounts() ([]mountInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]mountInfo(nil), f.table...), nil
}

// newFakeNode is a node plugin over a fake mount table (fakeMounter): a unit test, no
// root. Publishing creates the directories as the plugin does and mounts nothing.
func newFakeNode(t *testing.T) (*testNode, *fakeMounter) {
	t.Helper()
	dir := t.TempDir()
	d, err := New(Options{NodeID: "node-1", StateDir: filepath.Join(dir, "state"), SidecarUID: os.Getuid(), SidecarGID: os.Getgid(), DiskTier: DiskTierDirectory})
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeMounter{}
	d.mnt = f
	t.Cleanup(d.Close)
	return &testNode{t: t, d: d, dir: dir}, f
}
