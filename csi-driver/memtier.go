package csidriver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/api/resource"
)

// Each workflow's memory tier on a node is a tmpfs of its own, mounted at
// store/<ns>/<workflow> by the first publish of one of its pods on the node, before its
// data/ and state/ directories exist, and unmounted when Retire removes the workflow's
// directory. Its size is the workflow's spec.volume.sizeLimit capped by
// Options.WorkflowMemoryMax; a workflow without one gets Options.WorkflowMemoryDefault.
// The sizes of the workflows' mounts on the node add up to at most Options.StoreSize: a
// publish whose workflow would not fit is refused with ResourceExhausted (the kubelet
// tries again; the pod waits in ContainerCreating with the event), and fits once a
// retired workflow's mount is gone. The sizes are read from the mounts themselves
// (statfs), so a restarted plugin counts what it finds and keeps it. A finished
// workflow's mount, once no volume of it is published on the node, shrinks to what it
// holds (ShrinkMemoryTier): a workflow kept after it finished (no ttlSecondsAfterFinished)
// counts only the memory its files take, not its whole size.

// A tmpfs without nr_inodes takes as many inodes as half the node's RAM pages, and an
// inode (with its dentry) pins about 1 KiB of kernel memory that its size does not count
// (1,012 bytes measured for an empty file): a 1 MiB tier held millions of empty files,
// hundreds of MiB of the node's memory (issue 43). So every tmpfs of the node store is
// mounted with nr_inodes from its size: one inode per 8 KiB (the kernel's own default
// ratio, of the tier's size rather than of the node's RAM; a file holding bytes takes at
// least a 4 KiB page anyway), at least 1,024 for the store's directories and state
// records. Each workflow's tmpfs counts against Options.StoreSize for its size and 1 KiB
// per inode: a tier of S bytes over 8 MiB takes S·9/8 of the node store, a smaller one
// S + 1 MiB. A tier that runs out of inodes answers ENOSPC, which its sidecar logs naming
// the tier (store.InodesError).
const (
	// inodeRatio is the bytes of a tmpfs's size per inode it may hold.
	inodeRatio = 8 << 10
	// minInodes is the fewest inodes a tmpfs of the node store holds.
	minInodes = 1024
	// inodeBytes is what one inode counts against the node store: the kernel memory an
	// inode and its dentry pin, rounded up.
	inodeBytes = 1 << 10
	// shrinkInodeSpare is how many inodes a shrunk tier keeps free beyond those in use.
	shrinkInodeSpare = 64
)

// boundInodes remounts the tmpfs at dir, mounted by a plugin from before inodes were
// bounded, with the inodes a tier of its size holds (or those it uses and
// shrinkInodeSpare, if more), so that what it counts against the node store and what it
// may pin are bounded from now on; a tmpfs already within that is left alone.
func boundInodes(mnt mounter, dir string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", dir, err)
	}
	size := int64(st.Blocks) * st.Bsize
	want := max(tierInodes(size), int64(st.Files-st.Ffree)+shrinkInodeSpare)
	if int64(st.Files) <= want {
		return nil
	}
	if err := mnt.Mount("", dir, "", unix.MS_REMOUNT|unix.MS_NOSUID|unix.MS_NODEV, tmpfsOptions(size, want)); err != nil {
		return fmt.Errorf("bounding the inodes of the tmpfs at %s to %d: %w", dir, want, err)
	}
	return nil
}

// boundOldTiers bounds the inodes of every workflow tmpfs of the node store that a plugin
// from before inodes were bounded mounted (boundInodes).
func (d *Driver) boundOldTiers() error {
	ms, err := d.mnt.Mounts()
	if err != nil {
		return err
	}
	root := d.storeRoot() + "/"
	for _, m := range ms {
		if rel, ok := strings.CutPrefix(m.mountPoint, root); ok && m.fsType == "tmpfs" && strings.Count(rel, "/") == 1 {
			if err := boundInodes(d.mnt, m.mountPoint); err != nil {
				return err
			}
		}
	}
	return nil
}

// tierInodes is the nr_inodes of a tmpfs of size bytes.
func tierInodes(size int64) int64 { return max(size/inodeRatio, minInodes) }

// tierCharge is what a tmpfs of size bytes and inodes inodes counts against the node store.
func tierCharge(size, inodes int64) int64 { return size + inodes*inodeBytes }

// tmpfsOptions are the size options of a tmpfs mount: size=<bytes>,nr_inodes=<n>.
func tmpfsOptions(size, inodes int64) string {
	return "size=" + strconv.FormatInt(size, 10) + ",nr_inodes=" + strconv.FormatInt(inodes, 10)
}

// memoryTier is the part of a workflow's tmpfs of mount bytes that its sidecars' node
// store may fill (the memory tier's limit, handoff.Volume.MemoryLimit): the rest is kept
// for the state directory and for what the store does not count (it counts bytes, tmpfs
// takes whole pages; a direct-mode pod's own copies, see docs/security.md). A
// sixteenth of the mount, at least 1 MiB and at most 64 MiB, never more than half.
func memoryTier(mount int64) int64 {
	keep := min(max(mount/16, 1<<20), 64<<20, mount/2)
	return mount - keep
}

// memorySize is the size of the tmpfs of a workflow whose spec.volume.sizeLimit is limit
// bytes (0: none).
func (d *Driver) memorySize(limit int64) int64 {
	switch {
	case limit <= 0:
		return d.workflowMemoryDefault()
	case limit > d.workflowMemoryMax():
		return d.workflowMemoryMax()
	}
	return limit
}

// workflowMemoryMax is Options.WorkflowMemoryMax, or when unset or larger the largest
// tier that fits in the store with its inodes (largestTier).
func (d *Driver) workflowMemoryMax() int64 {
	fit := largestTier(d.opts.StoreSize)
	if m := d.opts.WorkflowMemoryMax; m > 0 && m < fit {
		return m
	}
	return fit
}

// largestTier is the largest tmpfs size, a multiple of 8 KiB, whose tierCharge fits in
// store bytes: 8/9 of it (less 1 MiB for a store under 9 MiB), at least one page.
func largestTier(store int64) int64 {
	s := store / (inodeRatio + inodeBytes) * inodeRatio
	if s/inodeRatio < minInodes {
		s = (store - minInodes*inodeBytes) / inodeRatio * inodeRatio
	}
	return max(s, int64(os.Getpagesize()))
}

// workflowMemoryDefault is Options.WorkflowMemoryDefault, or an eighth of the store's size
// when unset, at most the maximum.
func (d *Driver) workflowMemoryDefault() int64 {
	m := d.opts.WorkflowMemoryDefault
	if m <= 0 {
		m = d.opts.StoreSize / 8
	}
	return min(m, d.workflowMemoryMax())
}

// quantity formats bytes as a Kubernetes quantity ("512Mi").
func quantity(bytes int64) string { return resource.NewQuantity(bytes, resource.BinarySI).String() }

// tmpfsSize returns the size in bytes of the tmpfs mounted at dir.
func tmpfsSize(dir string) (int64, error) {
	size, _, err := tmpfsUsage(dir)
	return size, err
}

// tmpfsUsage returns the size in bytes of the tmpfs mounted at dir, and what it counts
// against the node store (tierCharge of its size and inodes).
func tmpfsUsage(dir string) (size, charge int64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	size = int64(st.Blocks) * st.Bsize
	return size, tierCharge(size, int64(st.Files)), nil
}

// workflowMounts returns what every workflow's tmpfs in the node store counts against
// it (tierCharge), by directory.
func (d *Driver) workflowMounts() (map[string]int64, error) {
	ms, err := d.mnt.Mounts()
	if err != nil {
		return nil, err
	}
	root := d.storeRoot() + "/"
	out := map[string]int64{}
	for _, m := range ms {
		rel, ok := strings.CutPrefix(m.mountPoint, root)
		if !ok || m.fsType != "tmpfs" || strings.Count(rel, "/") != 1 {
			continue
		}
		_, n, err := tmpfsUsage(m.mountPoint)
		if err != nil {
			return nil, err
		}
		out[m.mountPoint] = n
	}
	return out, nil
}

// mountedTotal returns what the node's workflow mounts count against the node store
// together (their sizes and inodes), and how many there are.
func (d *Driver) mountedTotal() (bytes int64, count int, err error) {
	mounts, err := d.workflowMounts()
	if err != nil {
		return 0, 0, err
	}
	for _, n := range mounts {
		bytes += n
	}
	return bytes, len(mounts), nil
}

// ensureMemoryTier mounts the tmpfs of workflow ns/wf at its directory of the node store
// unless it is there (a restarted plugin keeps what it finds), and returns the memory
// tier's limit (memoryTier of the mount's size). sizeLimit reads the workflow's
// spec.volume.sizeLimit; it is called only when the mount is missing. A workflow that
// does not fit beside the others is refused with ResourceExhausted. Without
// Options.StoreSize there is no mount and no limit (tests). A workflow directory that
// holds files from before the plugin mounted one per workflow keeps them on the store's
// tmpfs, unlimited. Either way the workflow's directory exists on return: the root of
// what the plugin makes in it, entered by its path (openat2 RESOLVE_NO_XDEV does not
// cross into the mount; the node store's root and its namespace directories are the
// plugin's own, no pod writes them).
func (d *Driver) ensureMemoryTier(ctx context.Context, ns, wf string, sizeLimit func(context.Context) (int64, error)) (int64, error) {
	if d.opts.StoreSize <= 0 {
		fd, err := makeDir(d.storeRoot(), ns+"/"+wf, 0o755)
		if err != nil {
			return 0, fmt.Errorf("preparing the workflow's directory: %w", err)
		}
		unix.Close(fd)
		return 0, nil
	}
	dir := d.WorkflowDir(ns, wf)
	d.memMu.Lock()
	shrunk := d.shrunk[dir]
	d.memMu.Unlock()
	if n, ok, err := d.mountedTmpfs(dir); err != nil || (ok && !shrunk) {
		return memoryTier(n), err
	}
	limit, err := sizeLimit(ctx)
	if err != nil {
		return 0, status.Errorf(codes.Unavailable, "reading Workflow %s/%s: %v", ns, wf, err)
	}
	// tmpfs takes whole pages, and size=0 would be no limit at all.
	page := int64(os.Getpagesize())
	size := max((d.memorySize(limit)+page-1)/page*page, page)
	d.memMu.Lock()
	defer d.memMu.Unlock()
	if n, ok, err := d.mountedTmpfs(dir); err != nil || ok {
		if err != nil || !d.shrunk[dir] {
			return memoryTier(n), err // mounted by another publish meanwhile
		}
		return d.regrow(ns, wf, dir, n, size)
	}
	if empty, err := emptyDir(dir); err != nil || !empty {
		if err == nil {
			d.log.Info("workflow directory predates the per-workflow tmpfs: it stays on the store's tmpfs", "dir", dir)
		}
		return 0, err
	}
	used, count, err := d.mountedTotal()
	if err != nil {
		return 0, err
	}
	inodes := tierInodes(size)
	if charge := tierCharge(size, inodes); used+charge > d.opts.StoreSize {
		return 0, status.Errorf(codes.ResourceExhausted,
			"node %s: the memory tier of Workflow %s/%s (%s and %d inodes, %s of the store) does not fit in the node store (%s): the tiers of the other workflows on the node take %s (workflows: %d); the pod waits until one is retired",
			d.opts.NodeID, ns, wf, quantity(size), inodes, quantity(charge), quantity(d.opts.StoreSize), quantity(used), count)
	}
	fd, err := makeDir(d.storeRoot(), ns+"/"+wf, 0o755)
	if err != nil {
		return 0, fmt.Errorf("preparing the workflow's directory: %w", err)
	}
	defer unix.Close(fd)
	// Not noexec: a direct-mode app runs what it reads from its volume, a bind mount of
	// this tmpfs that inherits its flags.
	opts := "mode=0755," + tmpfsOptions(size, inodes)
	if err := d.mnt.Mount("sluice-workflow", fdPath(fd), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return 0, fmt.Errorf("mounting a tmpfs of %d bytes and %d inodes at %s: %w", size, inodes, dir, err)
	}
	d.log.Info("mounted a workflow's memory tier", "namespace", ns, "workflow", wf, "bytes", size, "inodes", inodes, "sizeLimit", limit)
	// The size as the mount reports it, as a restarted plugin will read it: every sidecar
	// of the workflow on the node is told the same limit.
	n, err := tmpfsSize(dir)
	return memoryTier(n), err
}

// mountedTmpfs returns the size of the tmpfs mounted at dir, if one is.
func (d *Driver) mountedTmpfs(dir string) (int64, bool, error) {
	m, ok, err := mountedAt(d.mnt, dir)
	if err != nil || !ok || m.fsType != "tmpfs" {
		return 0, false, err
	}
	n, err := tmpfsSize(dir)
	return n, err == nil, err
}

// emptyDir reports whether the directory dir is empty or missing (a symlink is neither:
// an error).
func emptyDir(dir string) (bool, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return true, nil
	}
	if err != nil {
		return false, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	f := os.NewFile(uintptr(fd), dir)
	defer f.Close()
	_, err = f.Readdirnames(1)
	if errors.Is(err, io.EOF) {
		return true, nil
	}
	return false, err
}

// unmountMemoryTier unmounts workflow dir's tmpfs (and anything below it), if mounted.
func (d *Driver) unmountMemoryTier(dir string) error {
	if _, ok, err := mountedAt(d.mnt, filepath.Clean(dir)); err != nil || !ok {
		return err
	}
	return unmountAll(d.mnt, dir)
}

// regrow remounts the shrunk tmpfs of workflow ns/wf at dir, of have bytes, with size
// bytes again for a new publish of the workflow (a pod of it started after it finished),
// if the node store has room, and returns the memory tier's limit; it refuses the
// publish with ResourceExhausted as a new workflow's would be. d.memMu is held.
func (d *Driver) regrow(ns, wf, dir string, have, size int64) (int64, error) {
	if size <= have {
		delete(d.shrunk, dir)
		return memoryTier(have), nil
	}
	used, _, err := d.mountedTotal()
	if err != nil {
		return 0, err
	}
	_, haveCharge, err := tmpfsUsage(dir)
	if err != nil {
		return 0, err
	}
	inodes := tierInodes(size)
	if used-haveCharge+tierCharge(size, inodes) > d.opts.StoreSize {
		return 0, status.Errorf(codes.ResourceExhausted,
			"node %s: the memory tier of Workflow %s/%s (%s, shrunk to %s when it finished) does not fit in the node store (%s) again: the tiers of the workflows on the node take %s; the pod waits until one is retired",
			d.opts.NodeID, ns, wf, quantity(size), quantity(have), quantity(d.opts.StoreSize), quantity(used))
	}
	if err := d.mnt.Mount("", dir, "", unix.MS_REMOUNT|unix.MS_NOSUID|unix.MS_NODEV, tmpfsOptions(size, inodes)); err != nil {
		return 0, fmt.Errorf("growing the memory tier at %s to %d bytes and %d inodes: %w", dir, size, inodes, err)
	}
	delete(d.shrunk, dir)
	d.log.Info("grew a shrunk memory tier back for a new pod of its workflow", "namespace", ns, "workflow", wf, "bytes", size)
	n, err := tmpfsSize(dir)
	return memoryTier(n), err
}

// shrinkSpare is what a shrunk memory tier keeps free beyond what it holds: room for the
// state directory's last records.
const shrinkSpare = 1 << 20

// ShrinkMemoryTier remounts the tmpfs of finished workflow ns/wf with the size of what it
// holds (whole pages) and shrinkSpare, and the inodes it uses and shrinkInodeSpare, unless a published volume uses the workflow's
// directory or it has no such mount; the freed size goes to the other workflows of the
// node. Shrinking what is already that small changes nothing. The errors are the mount
// table's and the remount's.
func (d *Driver) ShrinkMemoryTier(ns, wf string) error {
	d.dirs.Lock()
	defer d.dirs.Unlock()
	dir := d.WorkflowDir(ns, wf)
	size, ok, err := d.mountedTmpfs(dir)
	if err != nil || !ok {
		return err
	}
	if used, err := d.inUse(dir); err != nil || used {
		return err
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", dir, err)
	}
	held := int64(st.Blocks-st.Bfree) * st.Bsize
	want := held + shrinkSpare
	if want >= size {
		return nil
	}
	inodes := min(int64(st.Files-st.Ffree)+shrinkInodeSpare, int64(st.Files))
	d.memMu.Lock()
	defer d.memMu.Unlock()
	if err := d.mnt.Mount("", dir, "", unix.MS_REMOUNT|unix.MS_NOSUID|unix.MS_NODEV, tmpfsOptions(want, inodes)); err != nil {
		return fmt.Errorf("shrinking the memory tier at %s to %d bytes and %d inodes: %w", dir, want, inodes, err)
	}
	if d.shrunk == nil {
		d.shrunk = map[string]bool{}
	}
	d.shrunk[dir] = true
	d.log.Info("shrank a finished workflow's memory tier to what it holds", "namespace", ns, "workflow", wf, "bytes", want, "was", size)
	return nil
}
