package csidriver

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sluice-io/sluice/internal/store"
)

// The plugin runs as root and works in directories pods can write (a workflow's data
// directory is mode 0777, its state directory and a pod's direct directory belong to the
// sidecars' user). Every directory it creates, chowns, chmods or bind-mounts there is
// therefore reached from a directory the plugin made itself (the node store's root, the
// disk tier's root, the pods' root, a workflow's directory: the root of its tmpfs, whose
// path runs through the plugin's directories only), one component at a time with openat2(2)
// RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS (store.OpenBeneath): a component that is a symlink
// fails (ELOOP) instead of redirecting it. It then acts on the O_PATH descriptor it got:
// fchownat(AT_EMPTY_PATH), chmod of /proc/self/fd/N, and a bind mount whose source is
// /proc/self/fd/N, so that nothing is looked up by name again.

// fdPath is the /proc path of descriptor fd: the file it is open on, whatever happened to
// its name since.
func fdPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// makeDir creates (when missing) every directory of the relative path rel beneath the
// directory root, with mode (before the umask) and owned by root, and returns an O_PATH
// descriptor of the last one, which the caller closes. No component may be a symlink. An
// empty rel is root itself, which must exist: a mount point the plugin made (a
// workflow's disk tier file system), entered by its path.
func makeDir(root, rel string, mode uint32) (int, error) {
	fd, err := store.OpenDirNoFollow(root)
	if err != nil || rel == "" {
		return fd, err
	}
	for _, name := range strings.Split(rel, "/") {
		if name == "" || name == "." || name == ".." {
			unix.Close(fd)
			return -1, fmt.Errorf("%s: bad path component %q", rel, name)
		}
		if err := unix.Mkdirat(fd, name, mode); err != nil && !errors.Is(err, unix.EEXIST) {
			unix.Close(fd)
			return -1, fmt.Errorf("creating %s in %s: %w", name, rel, err)
		}
		next, err := store.OpenBeneath(fd, name, unix.O_PATH|unix.O_DIRECTORY, 0)
		unix.Close(fd)
		if err != nil {
			return -1, fmt.Errorf("resolving %s beneath %s: %w", rel, root, err)
		}
		fd = next
	}
	return fd, nil
}

// chownFd sets the owner of the file open as fd (an O_PATH descriptor will do).
func chownFd(fd, uid, gid int) error {
	return unix.Fchownat(fd, "", uid, gid, unix.AT_EMPTY_PATH)
}

// chmodFd sets the permission bits of the directory open as fd. fchmod refuses O_PATH
// descriptors; chmod of the descriptor's /proc link changes the same inode.
func chmodFd(fd int, mode uint32) error { return unix.Chmod(fdPath(fd), mode) }

// bindMountFd bind-mounts the directory open as fd at dst (bindMount), the source given
// as the descriptor's /proc link.
func bindMountFd(mnt mounter, fd int, dst string, readOnly bool) error {
	return bindMount(mnt, fdPath(fd), dst, readOnly)
}

// ownedDir is makeDir of rel beneath root, then rel (the last component only) handed to
// uid:gid with permission bits mode. The caller closes the descriptor.
func ownedDir(root, rel string, uid, gid int, mode uint32) (int, error) {
	fd, err := makeDir(root, rel, 0o755)
	if err != nil {
		return -1, err
	}
	if err := chownFd(fd, uid, gid); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("handing %s to the sidecar's user: %w", rel, err)
	}
	if err := chmodFd(fd, mode); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("setting the mode of %s: %w", rel, err)
	}
	return fd, nil
}
