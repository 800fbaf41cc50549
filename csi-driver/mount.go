package csidriver

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// FUSEMaxWrite is the largest FUSE request the mount accepts (max_read), and what the
// sidecar's server negotiates (streamfs mounts with the same value): 1 MiB.
const FUSEMaxWrite = 1 << 20

// mountInfo is one line of /proc/self/mountinfo.
type mountInfo struct {
	dev        string // major:minor of the mounted filesystem
	root       string // the directory of that filesystem mounted (bind mounts)
	mountPoint string
	fsType     string
	source     string
}

// mounts reads /proc/self/mountinfo.
func mounts() ([]mountInfo, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("reading mount table: %w", err)
	}
	defer f.Close()
	var out []mountInfo
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent major:minor root mountpoint options [optional...] - fstype source super
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, f := range fields {
			if f == "-" {
				sep = i
				break
			}
		}
		if sep < 5 || sep+2 >= len(fields) {
			continue
		}
		out = append(out, mountInfo{dev: fields[2], root: unescape(fields[3]), mountPoint: unescape(fields[4]), fsType: fields[sep+1], source: fields[sep+2]})
	}
	return out, sc.Err()
}

// mountedAt returns what is mounted at path (the topmost mount), if anything.
func mountedAt(path string) (mountInfo, bool, error) {
	ms, err := mounts()
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

// unescape undoes the octal escapes (\040 for space) of the mount table.
func unescape(s string) string {
	if !strings.Contains(s, "\\") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// mountFUSE opens /dev/fuse and mounts a FUSE filesystem of type fuse.sluice at target
// on the descriptor, with the options go-fuse would use: anyone may access it
// (allow_other; the server decides), requests up to FUSEMaxWrite bytes. It returns the
// descriptor, which the caller keeps and hands to the filesystem's server. With
// permissions the kernel checks every access against the owner and mode the server
// reports (default_permissions).
func mountFUSE(target string, readOnly, permissions bool) (*os.File, error) {
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
	if err := unix.Mount("sluice", target, "fuse.sluice", flags, opts); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("mounting FUSE at %s: %w", target, err)
	}
	return os.NewFile(uintptr(fd), "/dev/fuse"), nil
}

// bindMount bind-mounts src at dst (recursively, so that mounts under src come along).
func bindMount(src, dst string, readOnly bool) error {
	if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind-mounting %s at %s: %w", src, dst, err)
	}
	if readOnly {
		if err := unix.Mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			_ = unix.Unmount(dst, unix.MNT_DETACH)
			return fmt.Errorf("making %s read-only: %w", dst, err)
		}
	}
	return nil
}

// unmountAll unmounts every mount at or below path, deepest first. A busy mount is
// detached lazily: by the time the kubelet unpublishes, the pod's containers are gone,
// and a leftover reference must not keep the volume published.
func unmountAll(path string) error {
	ms, err := mounts()
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
		err := unix.Unmount(t, 0)
		if errors.Is(err, syscall.EBUSY) {
			err = unix.Unmount(t, unix.MNT_DETACH)
		}
		if err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", t, err))
		}
	}
	return errors.Join(errs...)
}

// ensureTmpfs mounts a tmpfs of size bytes at dir unless something is mounted there.
func ensureTmpfs(dir string, size int64) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	if _, ok, err := mountedAt(dir); err != nil || ok {
		return err
	}
	if err := unix.Mount("sluice-store", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size="+strconv.FormatInt(size, 10)); err != nil {
		return fmt.Errorf("mounting a tmpfs of %d bytes at %s: %w", size, dir, err)
	}
	return nil
}
