package csidriver

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/moby/sys/mountinfo"

	"golang.org/x/sys/unix"
)

// FUSEMaxWrite is the largest FUSE request the mount accepts (max_read), and what the
// sidecar's server negotiates (streamfs mounts with the same value): 1 MiB.
const FUSEMaxWrite = 1 << 20

// mountInfo is one mount of this process's mount table (/proc/self/mountinfo).
type mountInfo struct {
	dev        string // major:minor of the mounted filesystem
	root       string // the directory of that filesystem mounted (bind mounts)
	mountPoint string
	fsType     string
	source     string
}

// mounter makes, removes and lists the mounts of the plugin's mount namespace: the
// kernel's (kernelMounter) in the plugin; a fake in the tests that check requests and
// locking without root. (k8s.io/mount-utils' FakeMounter plays this part for drivers
// that mount through mount(8); this plugin mounts by descriptor, with FUSE's options,
// which that interface does not express.)
type mounter interface {
	// Mount is mount(2).
	Mount(source, target, fstype string, flags uintptr, data string) error
	// Unmount is umount2(2).
	Unmount(target string, flags int) error
	// Mounts lists the mount table in its order (later mounts on top of earlier ones).
	Mounts() ([]mountInfo, error)
}

// kernelMounter is the mounter of the plugin's own mount namespace.
type kernelMounter struct{}

// Mount mounts with mount(2).
func (kernelMounter) Mount(source, target, fstype string, flags uintptr, data string) error {
	return unix.Mount(source, target, fstype, flags, data)
}

// Unmount unmounts with umount2(2).
func (kernelMounter) Unmount(target string, flags int) error { return unix.Unmount(target, flags) }

// Mounts reads /proc/self/mountinfo, in its order, with moby/sys/mountinfo (the parser
// k8s.io/mount-utils uses): fields unescaped.
func (kernelMounter) Mounts() ([]mountInfo, error) {
	infos, err := mountinfo.GetMounts(nil)
	if err != nil {
		return nil, fmt.Errorf("reading mount table: %w", err)
	}
	out := make([]mountInfo, 0, len(infos))
	for _, m := range infos {
		out = append(out, mountInfo{dev: fmt.Sprintf("%d:%d", m.Major, m.Minor), root: m.Root, mountPoint: m.Mountpoint, fsType: m.FSType, source: m.Source})
	}
	return out, nil
}

// mountedAt returns what is mounted at path (the topmost mount), if anything.
func mountedAt(mnt mounter, path string) (mountInfo, bool, error) {
	ms, err := mnt.Mounts()
	if err != nil {
		return mountInfo{}, false, err
	}
	for i := len(ms) - 1; i >= 0; i-- {
		if ms[i].mountPoint == path {
			return ms[i], true, nil
		}
	}
	return mountInfo{}, false, nil
}

// mountFUSE opens /dev/fuse and mounts a FUSE filesystem of type fuse.sluice at target
// on the descriptor, with the options go-fuse would use: anyone may access it
// (allow_other; the server decides), requests up to FUSEMaxWrite bytes. It returns the
// descriptor, which the caller keeps and hands to the filesystem's server. With
// permissions the kernel checks every access against the owner and mode the server
// reports (default_permissions).
func mountFUSE(mnt mounter, target string, readOnly, permissions bool) (*os.File, error) {
	var st unix.Stat_t
	if err := unix.Stat(target, &st); err != nil {
		return nil, fmt.Errorf("target %s: %w", target, err)
	}
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening /dev/fuse: %w", err)
	}
	opts := strings.Join([]string{
		"fd=" + strconv.Itoa(fd),
		fmt.Sprintf("rootmode=%o", st.Mode&unix.S_IFMT),
		"user_id=0",
		"group_id=0",
		"allow_other",
		"max_read=" + strconv.Itoa(FUSEMaxWrite),
	}, ",")
	if permissions {
		opts += ",default_permissions"
	}
	flags := uintptr(unix.MS_NOSUID | unix.MS_NODEV)
	if readOnly {
		flags |= unix.MS_RDONLY
	}
	if err := mnt.Mount("sluice", target, "fuse.sluice", flags, opts); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("mounting FUSE at %s: %w", target, err)
	}
	return os.NewFile(uintptr(fd), "/dev/fuse"), nil
}

// bindMount bind-mounts src at dst (recursively, so that mounts under src come along).
func bindMount(mnt mounter, src, dst string, readOnly bool) error {
	if err := mnt.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind-mounting %s at %s: %w", src, dst, err)
	}
	if readOnly {
		if err := mnt.Mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			_ = mnt.Unmount(dst, unix.MNT_DETACH)
			return fmt.Errorf("making %s read-only: %w", dst, err)
		}
	}
	return nil
}

// unmountAll unmounts every mount at or below path, deepest first. A busy mount is
// detached lazily: by the time the kubelet unpublishes, the pod's containers are gone,
// and a leftover reference must not keep the volume published.
func unmountAll(mnt mounter, path string) error {
	ms, err := mnt.Mounts()
	if err != nil {
		return err
	}
	var targets []string
	for _, m := range ms {
		if m.mountPoint == path || strings.HasPrefix(m.mountPoint, path+"/") {
			targets = append(targets, m.mountPoint)
		}
	}
	// Later lines of mountinfo are mounted on top of or below earlier ones: unmount in
	// reverse order.
	var errs []error
	for i := len(targets) - 1; i >= 0; i-- {
		t := targets[i]
		err := mnt.Unmount(t, 0)
		if errors.Is(err, syscall.EBUSY) {
			err = mnt.Unmount(t, unix.MNT_DETACH)
		}
		if err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", t, err))
		}
	}
	return errors.Join(errs...)
}

// ensureTmpfs mounts a tmpfs of size bytes at dir unless something is mounted there, with
// the inodes a tier of that size holds (tierInodes, memtier.go): the node store's own
// tmpfs holds the workflows' mount points, and the files of workflow directories from
// before the per-workflow mounts.
func ensureTmpfs(mnt mounter, dir string, size int64) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	if m, ok, err := mountedAt(mnt, dir); err != nil || ok {
		if err == nil && m.fsType == "tmpfs" {
			err = boundInodes(mnt, dir)
		}
		return err
	}
	if err := mnt.Mount("sluice-store", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,"+tmpfsOptions(size, tierInodes(size))); err != nil {
		return fmt.Errorf("mounting a tmpfs of %d bytes at %s: %w", size, dir, err)
	}
	return nil
}
