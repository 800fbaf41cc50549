package csidriver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/diskfs/go-diskfs/backend"
	"github.com/diskfs/go-diskfs/backend/file"
	"github.com/diskfs/go-diskfs/filesystem/ext4"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-io/sluice/internal/store"
)

// Each workflow's disk tier on a node is the directory disk/<ns>/<workflow> of the node's
// disk (Options.DiskDir). With DiskTierFilesystem it is an ext4 file system of its own: a
// sparse file disk/.images/<ns>/<workflow> (root's, mode 0600, in no pod's view) that the
// plugin formats (github.com/diskfs/go-diskfs, writing ext4's structures only) and
// mounts over a loop device, so the kernel refuses (ENOSPC) a write beyond its size
// whoever makes it, root included, and a pod can neither reach the image nor change what
// bounds it. The file system is sized so that it holds the workflow's
// spec.volume.disk.sizeLimit, capped by Options.WorkflowDiskMax (unset: WorkflowDiskMax,
// else an eighth of Options.DiskSize, else defaultDiskTier); mounted with discard, a
// deleted file's blocks go back to the node's disk. The images of the workflows on a node
// add up to at most Options.DiskSize (unset: half of what the file system DiskDir is on had
// free when the plugin started): a
// publish that does not fit is ResourceExhausted (the pod waits, as for the memory tier).
// A workflow without a disk tier (no spec.tiers.fs, no spec.volume.disk) gets no file
// system: its directory stays root's, and its sidecars write nothing there. Retire
// unmounts the file system and removes the image; a restarted plugin finds the mounts
// where they were (the disk directory is mounted with Bidirectional propagation), after a
// node's reboot the next publish of the workflow mounts its image again, and Sweep removes
// the images of workflows retired meanwhile.
//
// With DiskTierDirectory the disk tier is a plain directory, bounded by its sidecars'
// store only, which counts the bytes it writes there (handoff.Volume.DiskLimit).

// Disk tier kinds (Options.DiskTier, `sluice csi --disk-tier`).
const (
	// DiskTierAuto is DiskTierFilesystem when the node has loop devices
	// (/dev/loop-control) and the disk tiers' directory takes unnamed files (O_TMPFILE),
	// DiskTierDirectory otherwise (logged at start).
	DiskTierAuto = "auto"
	// DiskTierFilesystem makes each workflow's disk tier a file system of its size, and
	// refuses to start where it cannot (canMakeDiskTiers): for shared clusters.
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
	// maxDiskTier bounds what diskImageSize is given (a sizeLimit the API took, in
	// bytes, beyond any disk), so that its arithmetic cannot overflow.
	maxDiskTier = 1 << 60
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
		return d.defaultDiskSize()
	case DiskTierAuto, DiskTierFilesystem:
	default:
		return fmt.Errorf("--disk-tier %q: want %s, %s or %s", kind, DiskTierAuto, DiskTierFilesystem, DiskTierDirectory)
	}
	err := canMakeDiskTiers(d.diskRoot())
	switch {
	case err == nil:
		d.diskFS = true
		if err := d.defaultDiskSize(); err != nil {
			return err
		}
		d.log.Info("each workflow's disk tier is a file system of its size", "dir", d.diskRoot(), "diskSize", d.opts.DiskSize)
	case kind == DiskTierFilesystem:
		return fmt.Errorf("--disk-tier=filesystem: %w", err)
	default:
		if err := d.defaultDiskSize(); err != nil {
			return err
		}
		// Not silent: an error line, naming what bounds the tiers instead.
		d.log.Error(err, "--disk-tier=auto: the workflows' disk tiers are directories, bounded by their sidecars' count only, not by the kernel (--disk-tier=filesystem refuses to start so)",
			"dir", d.diskRoot(), "workflowDiskMax", d.opts.WorkflowDiskMax, "unsizedWorkflowDisk", d.diskTierSize(WorkflowSizes{}))
	}
	return nil
}

// defaultDiskSize sets DiskSize, when unset, to half of what the disk tiers' file system
// has free: the node's own data (the kubelet's, containerd's) keeps the rest; a
// file-system tier beyond it is refused, never formatted, and a directory tier of a
// workflow without a sizeLimit is bounded by an eighth of it. Shared clusters set
// --disk-size.
func (d *Driver) defaultDiskSize() error {
	if d.opts.DiskSize > 0 {
		return nil
	}
	var st unix.Statfs_t
	if err := unix.Statfs(d.diskRoot(), &st); err != nil {
		return fmt.Errorf("statfs %s: %w", d.diskRoot(), err)
	}
	d.opts.DiskSize = int64(st.Bavail) * st.Bsize / 2
	return nil
}

// canMakeDiskTiers returns why the plugin cannot make disk tier file systems beneath
// the directory root: no loop devices, or a file system that takes no unnamed files
// (O_TMPFILE: overlayfs before Linux 6.6, NFS).
func canMakeDiskTiers(root string) error {
	fd, err := unix.Open(loopControl, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("no loop devices: %w", &os.PathError{Op: "open", Path: loopControl, Err: err})
	}
	unix.Close(fd)
	fd, err = unix.Open(root, unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("the disk tiers' directory takes no unnamed files: %w", &os.PathError{Op: "open O_TMPFILE", Path: root, Err: err})
	}
	unix.Close(fd)
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
	return min(bytes, maxDiskTier)
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

// imagesDir holds the disk tiers' images beneath the disk root, .images/<ns>/<workflow>:
// no namespace is named so (a DNS label starts with a letter or digit), and no workflow's
// name can collide with an image's.
const imagesDir = ".images"

// diskImage is the image file of workflow ns/wf's disk tier, relative to the disk root.
func diskImage(ns, wf string) string { return imagesDir + "/" + ns + "/" + wf }

// ensureDiskTier makes the disk tier of workflow ns/wf and returns the limit in bytes its
// sidecars' store is told (0: none). With file systems: a workflow with a disk tier gets
// its file system mounted unless it is (sizes, read from the API, is called only to make
// one), owned by the sidecar's user; the limit is below the file system's free space. A
// workflow that does not fit in Options.DiskSize beside the others is refused with
// ResourceExhausted. With directories: a directory owned by the sidecar's user, limited by
// Options.WorkflowDiskMax.
func (d *Driver) ensureDiskTier(ctx context.Context, ns, wf string, own owner, sizes func(context.Context) (WorkflowSizes, error)) (int64, error) {
	rel := ns + "/" + wf
	if !d.diskFS {
		// A directory, bounded by its sidecars' count only: never by nothing. Its bound
		// is what a file system of the workflow would hold (diskTierSize: its sizeLimit
		// within the installation's maximum, else an eighth of DiskSize).
		want, err := sizes(ctx)
		if err != nil {
			return 0, status.Errorf(codes.Unavailable, "reading Workflow %s/%s: %v", ns, wf, err)
		}
		fd, err := ownedDir(d.diskRoot(), rel, own.uid, own.gid, 0o755)
		if err != nil {
			return 0, fmt.Errorf("preparing the workflow's disk tier: %w", err)
		}
		unix.Close(fd)
		return d.diskTierSize(want), nil
	}
	dir := d.DiskDir(ns, wf)
	if m, ok, err := mountedAt(d.mnt, dir); err != nil {
		return 0, err
	} else if ok && m.fsType == "ext4" {
		return d.handOverDiskTier(dir, own) // again: a plugin may have stopped before it did
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
		return d.handOverDiskTier(dir, own)
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
	return d.handOverDiskTier(dir, own)
}

// handOverDiskTier makes the root of the disk tier file system mounted at dir own's (the
// workflow's sidecars' user), mode 0755, and returns the limit its sidecars' store is told
// (diskTierLimit). The mount point's path runs through the plugin's own directories only.
func (d *Driver) handOverDiskTier(dir string, own owner) (int64, error) {
	mnt, err := store.OpenDirNoFollow(dir)
	if err != nil {
		return 0, err
	}
	defer unix.Close(mnt)
	if err := chownFd(mnt, own.uid, own.gid); err != nil {
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
	dir, err := makeDir(d.diskRoot(), imagesDir+"/"+ns, 0o700)
	if err != nil {
		return -1, fmt.Errorf("preparing the disk tiers' images: %w", err)
	}
	defer unix.Close(dir)
	// Made unnamed and named once formatted: a plugin stopped half way leaves nothing
	// that a later publish would take for a file system.
	fd, err := unix.Openat(dir, ".", unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return -1, fmt.Errorf("creating the disk tier's image %s: %w", rel, err)
	}
	img := os.NewFile(uintptr(fd), filepath.Join(d.diskRoot(), rel))
	defer img.Close()
	if err := img.Truncate(size); err != nil {
		return -1, fmt.Errorf("sizing the disk tier's image: %w", err)
	}
	if _, err := ext4.Create(sparseStorage{file.New(img, false)}, size, 0, 0, &ext4.Params{VolumeName: "sluice-disk", InodeRatio: diskInodeRatio}); err != nil {
		return -1, fmt.Errorf("formatting the disk tier's image %s (%d bytes): %w", rel, size, err)
	}
	if err := img.Sync(); err != nil {
		return -1, fmt.Errorf("writing the disk tier's image: %w", err)
	}
	if err := unix.Linkat(int(img.Fd()), "", dir, wf, unix.AT_EMPTY_PATH); err != nil {
		return -1, fmt.Errorf("naming the disk tier's image %s: %w", rel, err)
	}
	own, err := unix.FcntlInt(img.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("the disk tier's image: %w", err)
	}
	d.log.Info("made a workflow's disk tier", "namespace", ns, "workflow", wf, "bytes", bytes, "fileSystem", size)
	return own, nil
}

// diskInodeRatio is the bytes per inode of a disk tier's file system: a disk tier holds
// a workflow's larger files (mke2fs's "large" type takes 64 KiB); its inode tables are
// written when it is made.
const diskInodeRatio = 64 << 10

// sparseStorage is the fresh, sparse image file go-diskfs formats: a write of zeros into a
// hole is not made (the hole reads as zeros already), so that formatting writes only the
// file system's structures, not its zeroed inode tables and journal.
type sparseStorage struct{ backend.Storage }

// Writable implements backend.Storage.
func (s sparseStorage) Writable() (backend.WritableFile, error) {
	w, err := s.Storage.Writable()
	if err != nil {
		return nil, err
	}
	f, err := s.Sys()
	if err != nil {
		return nil, err
	}
	return sparseFile{w, int(f.Fd())}, nil
}

type sparseFile struct {
	backend.WritableFile
	fd int
}

// WriteAt implements io.WriterAt: a part of p within one of the file's pages that is all
// zeros and falls in a hole is skipped, the rest written.
func (f sparseFile) WriteAt(p []byte, off int64) (int, error) {
	const page = 4096
	for done := 0; done < len(p); {
		// Chunks end on the file's page boundaries: a chunk written beside data must not
		// fill the next page's hole.
		end := min(done+page-int((off+int64(done))%page), len(p))
		if chunk := p[done:end]; !allZero(chunk) || !f.hole(off+int64(done), int64(len(chunk))) {
			if n, err := f.WritableFile.WriteAt(chunk, off+int64(done)); err != nil {
				return done + n, err
			}
		}
		done = end
	}
	return len(p), nil
}

// hole reports whether the n bytes at off hold no data.
func (f sparseFile) hole(off, n int64) bool {
	data, err := unix.Seek(f.fd, off, unix.SEEK_DATA)
	return errors.Is(err, unix.ENXIO) || (err == nil && data >= off+n)
}

// allZero reports whether p (at most a page) holds only zeros.
func allZero(p []byte) bool {
	var zero [4096]byte
	return bytes.Equal(p, zero[:len(p)])
}

// diskImagesTotal returns the sizes of the node's disk tier images together, and how many
// there are; images are reached beneath root without following symlinks.
func (d *Driver) diskImagesTotal(root int) (bytes int64, count int, err error) {
	imgs, err := tierEntries(root, imagesDir, false)
	if err != nil {
		return 0, 0, err
	}
	for _, w := range imgs {
		var st unix.Stat_t
		rel := diskImage(w.ns, w.name)
		if err := unix.Fstatat(root, rel, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return 0, 0, fmt.Errorf("the disk tier's image %s: %w", rel, err)
		}
		bytes += st.Size
	}
	return bytes, len(imgs), nil
}

// workflowName is a workflow's namespace and name.
type workflowName struct{ ns, name string }

// tierEntries returns the workflows of the entries <ns>/<workflow> of directory base
// beneath root: directories (dirs: the disk tiers' mount points) or regular files (the
// images of imagesDir). A missing base, or a namespace removed meanwhile, has none; a
// namespace whose name starts with a dot (imagesDir beneath the root) is not one.
func tierEntries(root int, base string, dirs bool) ([]workflowName, error) {
	nss, err := readEntries(root, base, true)
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []workflowName
	for _, ns := range nss {
		if strings.HasPrefix(ns, ".") {
			continue
		}
		names, err := readEntries(root, base+"/"+ns, dirs)
		if errors.Is(err, unix.ENOENT) {
			continue // retired meanwhile
		}
		if err != nil {
			return nil, err
		}
		for _, name := range names {
			out = append(out, workflowName{ns, name})
		}
	}
	return out, nil
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
// through a new loop device that detaches itself when the file system is unmounted.
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

// attachLoop attaches the file open as img to a free loop device with LOOP_CONFIGURE and
// autoclear, and returns the device; release is called once it is mounted. A device that
// a stopped plugin attached and did not mount detached itself when its descriptor closed
// (autoclear), so no device is looked for by its backing file (whose inode a removed
// image's may share). A device node missing from this /dev (a container's, made before
// the device) is made.
func attachLoop(img int) (dev string, release func(), err error) {
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
		dev, err := loopDevice(n)
		if err != nil {
			return "", nil, err
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

// loopDevice returns the path of loop device n, making its node when this /dev (a
// container's, populated when it started) lacks it.
func loopDevice(n int) (string, error) {
	dev := "/dev/loop" + strconv.Itoa(n)
	if err := unix.Mknod(dev, unix.S_IFBLK|0o600, int(unix.Mkdev(loopMajor, uint32(n)))); err != nil && !errors.Is(err, unix.EEXIST) {
		return "", fmt.Errorf("making %s: %w", dev, err)
	}
	return dev, nil
}

// diskTierLimit is the bound the sidecars' store is told of the disk tier file system at
// dir (diskTierShare of its size): at least what diskImageSize made it for; the store
// also keeps the workflow's own spec.volume.disk.sizeLimit.
func diskTierLimit(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	// What an unprivileged writer may fill: the blocks less those reserved for root.
	return diskTierShare(int64(st.Blocks-(st.Bfree-st.Bavail)) * st.Bsize), nil
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
	_ = os.Remove(filepath.Dir(img))
	_ = os.Remove(filepath.Dir(dir))
	return nil
}

// diskTiers returns the workflows that have a disk tier directory or image on the node
// (a workflow may be named twice).
func (d *Driver) diskTiers() ([]workflowName, error) {
	root, err := store.OpenDirNoFollow(d.diskRoot())
	if err != nil {
		return nil, err
	}
	defer unix.Close(root)
	dirs, err := tierEntries(root, ".", true)
	if err != nil {
		return nil, err
	}
	imgs, err := tierEntries(root, imagesDir, false)
	return append(dirs, imgs...), err
}
