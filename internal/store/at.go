package store

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/sluice-io/sluice/internal/pathpattern"
)

// The functions below resolve paths beneath any directory descriptor with the same rules
// as the store's own operations (beneath.go): the whole path in one openat2(2) call with
// RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|RESOLVE_NO_MAGICLINKS|RESOLVE_NO_XDEV and
// O_NOFOLLOW, so that a symlink anywhere on the path, the last component included, fails
// (ELOOP) instead of being followed. Privileged code uses them on directories an
// unprivileged process can write (the host state of a node's sidecars, the CSI plugin's
// workflow directories).

// OpenDirNoFollow opens the directory path as an O_PATH descriptor, refusing a symlink as
// its last component (O_NOFOLLOW: ENOTDIR/ELOOP). The caller closes it.
func OpenDirNoFollow(path string) (int, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return fd, nil
}

// OpenBeneath opens the cleaned relative path rel beneath the directory open as dirfd
// with open(2) flags and, with O_CREAT, permission bits mode; no component of rel may be
// a symlink (ELOOP), nor leave dirfd's tree or its mount (EXDEV). The descriptor is
// close-on-exec; the caller closes it.
func OpenBeneath(dirfd int, rel string, flags int, mode uint32) (int, error) {
	c, err := pathpattern.Clean(rel)
	if err != nil {
		return -1, err
	}
	if len(c) > maxResolve {
		return -1, &os.PathError{Op: "open", Path: rel, Err: unix.ENAMETOOLONG}
	}
	how := unix.OpenHow{Flags: uint64(flags&(openFlags|unix.O_PATH) | unix.O_NOFOLLOW | unix.O_CLOEXEC), Resolve: resolveFlags}
	if flags&unix.O_CREAT != 0 {
		how.Mode = uint64(mode & 0o7777)
	}
	for {
		fd, err := unix.Openat2(dirfd, c, &how)
		if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
			continue // a rename elsewhere raced the lookup (RESOLVE_BENEATH)
		}
		if err != nil {
			return -1, &os.PathError{Op: "open", Path: rel, Err: err}
		}
		return fd, nil
	}
}

// OpenRegularBeneath is OpenBeneath that also refuses anything but a regular file (a
// FIFO, a device, a directory): ELOOP for a symlink, EINVAL otherwise. O_NONBLOCK is
// added for the open itself, so that a FIFO planted there cannot block the caller, and
// cleared again once the file is known to be regular.
func OpenRegularBeneath(dirfd int, rel string, flags int, mode uint32) (*os.File, error) {
	fd, err := OpenBeneath(dirfd, rel, flags|unix.O_NONBLOCK, mode)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, &os.PathError{Op: "stat", Path: rel, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, &os.PathError{Op: "open", Path: rel, Err: fmt.Errorf("not a regular file (mode %o): %w", st.Mode, unix.EINVAL)}
	}
	if flags&unix.O_NONBLOCK == 0 {
		fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
		if err == nil {
			_, err = unix.FcntlInt(uintptr(fd), unix.F_SETFL, fl&^unix.O_NONBLOCK)
		}
		if err != nil {
			unix.Close(fd)
			return nil, &os.PathError{Op: "fcntl", Path: rel, Err: err}
		}
	}
	return os.NewFile(uintptr(fd), rel), nil
}

// MkdirBeneath creates the directory rel (its parent must exist) beneath dirfd with
// permission bits mode, resolving the parent without symlinks; an existing directory is
// a success, an existing symlink or file is not (ENOTDIR).
func MkdirBeneath(dirfd int, rel string, mode uint32) error {
	c, err := pathpattern.Clean(rel)
	if err != nil {
		return err
	}
	parent, name := pathpattern.Parent(c), c
	if i := len(parent); parent != "." {
		name = c[i+1:]
	}
	pfd := dirfd
	if parent != "." {
		if pfd, err = OpenBeneath(dirfd, parent, unix.O_PATH|unix.O_DIRECTORY, 0); err != nil {
			return err
		}
		defer unix.Close(pfd)
	}
	err = unix.Mkdirat(pfd, name, mode)
	if errors.Is(err, unix.EEXIST) {
		var st unix.Stat_t
		if err := unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return &os.PathError{Op: "mkdir", Path: rel, Err: err}
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return &os.PathError{Op: "mkdir", Path: rel, Err: unix.ENOTDIR}
		}
		return nil
	}
	if err != nil {
		return &os.PathError{Op: "mkdir", Path: rel, Err: err}
	}
	return nil
}
