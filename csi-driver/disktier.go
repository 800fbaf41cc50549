package csidriver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/diskfs/go-diskfs/backend/file"
	"github.com/diskfs/go-diskfs/filesystem/ext4"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-io/sluice/internal/store"
)

// Each workflow's disk tier on a node is the directory disk/<ns>/<workflow> of the node's
// disk (Options.DiskDir). With DiskTierFilesystem it is an ext4 file system of its own: a
// sparse file disk/<ns>/<workflow>.img (root's, mode 0600, in no pod's view) formatted by
// the plugin (github.com/diskfs/go-diskfs) and mounted over a loop device, so the kernel
// refuses (ENOSPC) a write beyond its size whoever makes it, root included, and a pod can
// neither reach the image nor change what bounds it. The file system is sized so that it
// holds the workflow's spec.volume.disk.sizeLimit, capped by Options.WorkflowDiskMax
// (unset: WorkflowDiskMax, else an eighth of Options.DiskSize, else defaultDiskTier);
// mounted with discard, a deleted file's blocks go back to the node's disk. The images of
// the workflows on a node add up to at most Options.DiskSize: a publish that does not fit
// is ResourceExhausted (the pod waits, as for the memory tier). A workflow without a disk
// tier (no spec.tiers.fs, no spec.volume.disk) gets no file system: its directory stays
// root's, and its sidecars write nothing there. Retire unmounts the file system and
// removes the image; a restarted plugin finds the mounts where they were (the disk
// directory is mounted with Bidirectional propagation), and after a node's reboot mounts
// an image again at the next publish of its workflow.
//
// With DiskTierDirectory the disk tier is a plain directory, bounded by its sidecars'
// store only, which counts the bytes it writes there (handoff.Volume.DiskLimit).

// Disk tier kinds (Options.DiskTier, `sluice csi --disk-tier`).
const (
	// DiskTierAuto is DiskTierFilesystem when the node has loop devices
	// (/dev/loop-control), DiskTierDirectory otherwise (logged at start).
	DiskTierAuto = "auto"
	// DiskTierFilesystem makes each workflow's disk tier a file system of its size, and
	// refuses to start without loop devices: for shared clusters.
	DiskTierFilesystem = "filesystem"
	// DiskTierDirectory keeps each workflow's disk tier in a plain directory.
	DiskTierDirectory = "directory"
)

const (
	// defaultDiskTier is the size of a disk tier nothing sizes (no sizeLimit,
	// WorkflowDiskMax or DiskSize).
	defaultDiskTier = 1 << 30
	// minDiskImage is the smallest file system a disk tier gets: ext4's own structures
	// take most of a few megabytes.
	minDiskImage = 16 << 20
	// loopMajor is the loop devices' block major number.
	loopMajor = 7
	// loopControl hands out free loop devices.
	loopControl = "/dev/loop-control"
)

// WorkflowSizes is what a Workflow asks of a node (Options.WorkflowSizes), in bytes, 0
// for unset.
type WorkflowSizes struct {
	// Memory is spec.volume.sizeLimit.
	Memory int64
	// DiskTier is whether the workflow has a disk tier (spec.tiers.fs lists files or
	// spec.volume.disk is set).
	DiskTier bool
	// Disk is spec.volume.disk.sizeLimit.
	Disk int64
}

// chooseDiskTier decides at start what the disk tiers are (Options.DiskTier); an unknown
// kind, or filesystem on a node without loop devices, is an error naming the flag.
func (d *Driver) chooseDiskTier() error {
	kind := d.opts.DiskTier
	if kind == "" {
		kind = DiskTierAuto
	}
	switch kind {
	case DiskTierDirectory:
		return nil
	case DiskTierAuto, DiskTierFilesystem:
	default:
		return fmt.Errorf("--disk-tier %q: want %s, %s or %s", kind, DiskTierAuto, DiskTierFilesystem, DiskTierDirectory)
	}
	fd, err := unix.Open(loopControl, unix.O_RDWR|unix.O_CLOEXEC, 0)
	switch {
	case err == nil:
		unix.Close(fd)
		d.diskFS = true
		d.log.Info("each workflow's disk tier is a file system of its size", "dir", d.diskRoot(), "diskSize", d.opts.DiskSize)
	case kind == DiskTierFilesystem:
		return fmt.Errorf("--disk-tier=filesystem needs loop devices: %s: %w", loopControl, err)
	default:
		d.log.Info("the workflows' disk tiers are directories bounded by their sidecars' accounting only, not by the kernel (no loop devices; --disk-tier=filesystem refuses this)",
			"dir", d.diskRoot(), "error", err.Error())
	}
	return nil
}

// diskTierSize returns the bytes a workflow's disk tier that asks for sizes holds (its
// file system's size is a little more, diskImageSize).
func (d *Driver) diskTierSize(sizes WorkflowSizes) int64 {
	bytes := sizes.Disk
	if m := d.opts.WorkflowDiskMax; m > 0 && (bytes <= 0 || bytes > m) {
		bytes = m
	}
	if bytes <= 0 && d.opts.DiskSize > 0 {
		bytes = d.opts.DiskSize / 8
	}
	if bytes <= 0 {
		bytes = defaultDiskTier
	}
	return bytes
}

// diskImageSize is the size of the file system that holds bytes of files, a whole number
// of MiB: ext4 takes about a sixteenth for its journal, inode tables and group
// descriptors (go-diskfs's defaults), and the sidecars' store is told a sixteenth less
// than the file system's size (diskTierShare), so a quarter more keeps bytes within both.
// The image is sparse: the node's disk holds only what is written.
func diskImageSize(bytes int64) int64 {
	size := max(bytes+bytes/4+(4<<20), minDiskImage)
	return (size + (1<<20 - 1)) &^ (1<<20 - 1)
}

// diskImage is the image file of workflow ns/wf's disk tier, relative to the disk root.
func diskImage(ns, wf string) string { return ns + "/" + wf + ".img" }

// ensureDiskTier makes the disk tier of workflow ns/wf and returns the limit in bytes its
// sidecars' store is told (0: none). With file systems: a workflow with a disk tier gets
// its file system mounted unless it is (sizes, read from the API, is called only to make
// one), owned by the sidecar's user; the limit is below the file system's free space. A
// workflow that does not fit in Options.DiskSize beside the others is refused with
// ResourceExhausted. With directories: a directory owned by the sidecar's user, limited by
// Options.WorkflowDiskMax.
func (d *Driver) ensureDiskTier(ctx context.Context, ns, wf string, sizes func(context.Context) (WorkflowSizes, error)) (int64, error) {
	rel := ns + "/" + wf
	if !d.diskFS {
		fd, err := ownedDir(d.diskRoot(), rel, d.opts.SidecarUID, d.opts.SidecarGID, 0o755)
		if err != nil {
			return 0, fmt.Errorf("preparing the workflow's disk tier: %w", err)
		}
		unix.Close(fd)
		return d.opts.WorkflowDiskMax, nil
	}
	dir := d.DiskDir(ns, wf)
	if m, ok, err := mountedAt(d.mnt, dir); err != nil {
		return 0, err
	} else if ok && m.fsType == "ext4" {
		return diskTierLimit(dir)
	}
	want, err := sizes(ctx)
	if err != nil {
		return 0, status.Errorf(codes.Unavailable, "reading Workflow %s/%s: %v", ns, wf, err)
	}
	fd, err := makeDir(d.diskRoot(), rel, 0o755) // root's: without a file system, nobody writes it
	if err != nil {
		return 0, fmt.Errorf("preparing the workflow's disk tier: %w", err)
	}
	unix.Close(fd)
	if !want.DiskTier {
		return 0, nil
	}
	d.diskMu.Lock()
	defer d.diskMu.Unlock()
	if _, ok, err := mountedAt(d.mnt, dir); err != nil || ok { // mounted by another publish meanwhile
		if err != nil {
			return 0, err
		}
		return diskTierLimit(dir)
	}
	root, err := store.OpenDirNoFollow(d.diskRoot())
	if err != nil {
		return 0, err
	}
	defer unix.Close(root)
	img, err := store.OpenBeneath(root, diskImage(ns, wf), unix.O_RDWR, 0)
	switch {
	case errors.Is(err, unix.ENOENT):
		if empty, err := emptyDir(dir); err != nil || !empty {
			if err == nil {
				// A file system mounted over them would hide them from the workflow.
				d.log.Info("disk tier directory predates the per-workflow file systems: it stays a directory", "dir", dir)
			}
			return d.opts.WorkflowDiskMax, err
		}
		if img, err = d.makeDiskImage(root, ns, wf, d.diskTierSize(want)); err != nil {
			return 0, err
		}
	case err != nil:
		return 0, fmt.Errorf("opening the disk tier's image %s: %w", diskImage(ns, wf), err)
	default:
		d.log.Info("mounting a workflow's disk tier again (the node restarted?)", "namespace", ns, "workflow", wf)
	}
	defer unix.Close(img)
	if err := d.mountDiskImage(img, dir); err != nil {
		return 0, err
	}
	mnt, err := store.OpenDirNoFollow(dir)
	if err != nil {
		return 0, err
	}
	defer unix.Close(mnt)
	if err := chownFd(mnt, d.opts.SidecarUID, d.opts.SidecarGID); err != nil {
		return 0, fmt.Errorf("handing the disk tier to the sidecar's user: %w", err)
	}
	if err := chmodFd(mnt, 0o755); err != nil {
		return 0, fmt.Errorf("setting the mode of the disk tier: %w", err)
	}
	return diskTierLimit(dir)
}

// makeDiskImage creates workflow ns/wf's image beneath root, of the size that holds bytes,
// unless the node's images would then exceed Options.DiskSize (ResourceExhausted), and
// formats it; it returns the image open read-write. A failed format leaves no image.
func (d *Driver) makeDiskImage(root int, ns, wf string, bytes int64) (int, error) {
	size := diskImageSize(bytes)
	if d.opts.DiskSize > 0 {
		used, count, err := d.diskImagesTotal(root)
		if err != nil {
			return -1, err
		}
		if used+size > d.opts.DiskSize {
			return -1, status.Errorf(codes.ResourceExhausted,
				"node %s: the disk tier of Workflow %s/%s (%s) does not fit in the node's disk tiers (%s): the disk tiers of the other workflows on the node take %s (workflows: %d); the pod waits until one is retired",
				d.opts.NodeID, ns, wf, quantity(size), quantity(d.opts.DiskSize), quantity(used), count)
		}
	}
	rel := diskImage(ns, wf)
	fd, err := store.OpenBeneath(root, rel, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL, 0o600)
	if err != nil {
		return -1, fmt.Errorf("creating the disk tier's image %s: %w", rel, err)
	}
	f := os.NewFile(uintptr(fd), filepath.Join(d.diskRoot(), rel))
	fail := func(err error) (int, error) {
		f.Close()
		_ = unix.Unlinkat(root, rel, 0)
		return -1, err
	}
	if err := f.Truncate(size); err != nil {
		return fail(fmt.Errorf("sizing the disk tier's image: %w", err))
	}
	if _, err := ext4.Create(file.New(f, false), size, 0, 0, &ext4.Params{VolumeName: "sluice-disk"}); err != nil {
		return fail(fmt.Errorf("formatting the disk tier's image %s (%d bytes): %w", rel, size, err))
	}
	if err := f.Sync(); err != nil {
		return fail(fmt.Errorf("writing the disk tier's image: %w", err))
	}
	own, err := unix.Dup(fd)
	if err != nil {
		return fail(err)
	}
	unix.CloseOnExec(own)
	f.Close()
	d.log.Info("made a workflow's disk tier", "namespace", ns, "workflow", wf, "bytes", bytes, "fileSystem", size)
	return own, nil
}

// diskImagesTotal returns the sizes of the node's disk tier images together, and how many
// there are; images are reached beneath root without following symlinks.
func (d *Driver) diskImagesTotal(root int) (bytes int64, count int, err error) {
	nss, err := readEntries(root, ".", true)
	if err != nil {
		return 0, 0, err
	}
	for _, ns := range nss {
		imgs, err := readEntries(root, ns, false)
		if err != nil {
			return 0, 0, err
		}
		for _, img := range imgs {
			if !strings.HasSuffix(img, ".img") {
				continue
			}
			var st unix.Stat_t
			if err := unix.Fstatat(root, ns+"/"+img, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return 0, 0, fmt.Errorf("the disk tier's image %s/%s: %w", ns, img, err)
			}
			bytes += st.Size
			count++
		}
	}
	return bytes, count, nil
}

// readEntries returns the names of the directories (dirs) or regular files (!dirs) in
// directory rel beneath root.
func readEntries(root int, rel string, dirs bool) ([]string, error) {
	fd, err := store.OpenBeneath(root, rel, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, fmt.Errorf("opening %s of the disk tiers: %w", rel, err)
	}
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	ents, err := f.ReadDir(-1)
	if err != nil {
		return nil, fmt.Errorf("reading %s of the disk tiers: %w", rel, err)
	}
	var names []string
	for _, e := range ents {
		if (dirs && e.IsDir()) || (!dirs && e.Type().IsRegular()) {
			names = append(names, e.Name())
		}
	}
	return names, nil
}

// mountDiskImage mounts the ext4 image open as img at dir (nosuid, nodev, discard),
// through the loop device it is attached to, or a new one that detaches itself when the
// file system is unmounted.
func (d *Driver) mountDiskImage(img int, dir string) error {
	dev, closeDev, err := attachLoop(img)
	if err != nil {
		return err
	}
	defer closeDev()
	if err := d.mnt.Mount(dev, dir, "ext4", unix.MS_NOSUID|unix.MS_NODEV, "discard"); err != nil {
		return fmt.Errorf("mounting the disk tier %s (%s): %w", dir, dev, err)
	}
	return nil
}

// attachLoop returns a loop device of the file open as img: one it is attached to (a
// plugin that restarted between attaching and mounting), or a free one it attaches with
// LOOP_CONFIGURE and autoclear; close is called once the device is mounted. A device
// node missing from this /dev (a container's, made before the device) is made.
func attachLoop(img int) (dev string, close func(), err error) {
	var st unix.Stat_t
	if err := unix.Fstat(img, &st); err != nil {
		return "", nil, fmt.Errorf("the disk tier's image: %w", err)
	}
	if dev, ok := attachedLoop(st); ok {
		return dev, func() {}, nil
	}
	ctl, err := unix.Open(loopControl, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", nil, &os.PathError{Op: "open", Path: loopControl, Err: err}
	}
	defer unix.Close(ctl)
	for range 16 {
		n, err := unix.IoctlRetInt(ctl, unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return "", nil, fmt.Errorf("LOOP_CTL_GET_FREE: %w", err)
		}
		dev := "/dev/loop" + strconv.Itoa(n)
		if err := unix.Mknod(dev, unix.S_IFBLK|0o600, int(unix.Mkdev(loopMajor, uint32(n)))); err != nil && !errors.Is(err, unix.EEXIST) {
			return "", nil, fmt.Errorf("making %s: %w", dev, err)
		}
		fd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return "", nil, &os.PathError{Op: "open", Path: dev, Err: err}
		}
		cfg := unix.LoopConfig{Fd: uint32(img), Info: unix.LoopInfo64{Flags: unix.LO_FLAGS_AUTOCLEAR}}
		err = unix.IoctlLoopConfigure(fd, &cfg)
		if errors.Is(err, unix.EBUSY) { // taken meanwhile
			unix.Close(fd)
			continue
		}
		if err != nil {
			unix.Close(fd)
			return "", nil, fmt.Errorf("attaching the disk tier's image to %s: %w", dev, err)
		}
		return dev, func() { unix.Close(fd) }, nil
	}
	return "", nil, errors.New("attaching the disk tier's image: no loop device stayed free")
}

// attachedLoop returns the loop device the file of st is attached to, if one is.
func attachedLoop(st unix.Stat_t) (string, bool) {
	devs, _ := filepath.Glob("/sys/block/loop*/loop")
	for _, sys := range devs {
		dev := "/dev/" + filepath.Base(filepath.Dir(sys))
		fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		info, err := unix.IoctlLoopGetStatus64(fd)
		unix.Close(fd)
		if err == nil && info.Device == st.Dev && info.Inode == st.Ino {
			return dev, true
		}
	}
	return "", false
}

// diskTierLimit is the bound the sidecars' store is told of the disk tier file system at
// dir (diskTierShare of its size): at least what diskImageSize made it for; the store
// also keeps the workflow's own spec.volume.disk.sizeLimit.
func diskTierLimit(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return diskTierShare(int64(st.Blocks) * st.Bsize), nil
}

// diskTierShare is the part of a disk tier file system of size bytes its sidecars' store
// may fill: as memoryTier keeps part of a tmpfs, for what the store does not count (whole
// blocks, directories).
func diskTierShare(size int64) int64 { return memoryTier(size) }

// removeDiskTier unmounts workflow ns/wf's disk tier file system, if mounted (its loop
// device detaches itself), and removes its directory and image.
func (d *Driver) removeDiskTier(ns, wf string) error {
	dir := d.DiskDir(ns, wf)
	if _, ok, err := mountedAt(d.mnt, dir); err != nil {
		return err
	} else if ok {
		if err := unmountAll(d.mnt, dir); err != nil {
			return fmt.Errorf("unmounting the disk tier %s: %w", dir, err)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("removing %s: %w", dir, err)
	}
	img := filepath.Join(d.diskRoot(), diskImage(ns, wf))
	if err := os.Remove(img); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing %s: %w", img, err)
	}
	_ = os.Remove(filepath.Dir(dir))
	return nil
}
