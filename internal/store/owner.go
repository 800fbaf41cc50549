package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sluice-io/sluice/internal/pathpattern"
)

// Owners is how a store keeps the owner and group that the views report for its files,
// so that the kernel can check permissions (the default_permissions mount option) as on a
// local file system.
type Owners int

const (
	// OwnersNone keeps no owners: views report the store files' own (the server's) and
	// must mount without default_permissions, since every caller would look like a
	// stranger to files it created.
	OwnersNone Owners = iota
	// OwnersReal changes the store files' own owner and group (chown(2), which needs
	// CAP_CHOWN: `sluice run` as root).
	OwnersReal
	// OwnersXattr records them in the store file's extended attribute OwnerXattr (an
	// unprivileged sidecar; tmpfs keeps user.* attributes since Linux 6.6). Symlinks and
	// special files cannot carry user.* attributes (xattr(7)): they report the server's.
	OwnersXattr
)

// OwnerXattr is the extended attribute where OwnersXattr keeps a file's owner: 8 bytes,
// uid then gid, little endian. Views hide it from steps.
const OwnerXattr = "user.sluice.owner"

// String names the mode for logs.
func (o Owners) String() string {
	switch o {
	case OwnersReal:
		return "chown"
	case OwnersXattr:
		return "xattr"
	default:
		return "none"
	}
}

// ProbeOwners says how a store in dir can keep owners: OwnersReal when mayChown (the
// store's server holds CAP_CHOWN), else OwnersXattr when a file in dir takes the user.*
// attribute OwnerXattr (tried on a temporary file, removed again), else OwnersNone when
// dir's file system takes no user attributes (ENOTSUP: tmpfs before Linux 6.6). Any
// other failure (no temporary file could be made: a full tier, one out of inodes, too
// many open files) is returned as an error, never taken for OwnersNone: that would mount
// a view without the kernel's permission checks (default_permissions). dir must exist.
func ProbeOwners(dir string, mayChown bool) (Owners, error) {
	if mayChown {
		return OwnersReal, nil
	}
	f, err := os.CreateTemp(dir, ".sluice-owner-probe-*")
	if err != nil {
		return OwnersNone, fmt.Errorf("probing whether %s keeps owners: %w", dir, err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	err = unix.Fsetxattr(int(f.Fd()), OwnerXattr, encodeOwner(0, 0), 0)
	switch {
	case err == nil:
		return OwnersXattr, nil
	case errors.Is(err, unix.ENOTSUP), errors.Is(err, unix.EOPNOTSUPP):
		return OwnersNone, nil
	}
	return OwnersNone, fmt.Errorf("probing whether %s keeps owners: setting %s: %w", dir, OwnerXattr, err)
}

// Owners returns how the store keeps owners.
func (s *Store) Owners() Owners { return s.owners }

func encodeOwner(uid, gid uint32) []byte {
	b := make([]byte, 8)
	binary.LittleEndian.PutUint32(b, uid)
	binary.LittleEndian.PutUint32(b[4:], gid)
	return b
}

// ownerFromXattr reads the recorded owner of the file behind path (a /proc/self/fd link);
// ok is false when none is recorded.
func ownerFromXattr(path string) (uid, gid uint32, ok bool) {
	var b [8]byte
	n, err := unix.Getxattr(path, OwnerXattr, b[:])
	if err != nil || n != 8 {
		return 0, 0, false
	}
	return binary.LittleEndian.Uint32(b[:]), binary.LittleEndian.Uint32(b[4:]), true
}

// carriesXattr reports whether a file of type mode can hold a user.* attribute.
func carriesXattr(mode uint32) bool {
	t := mode & unix.S_IFMT
	return t == unix.S_IFREG || t == unix.S_IFDIR
}

// SetOwner sets the owner uid and group gid (-1 keeps one) that views report for rel, as
// the store keeps them (Owners): with OwnersNone it does nothing.
func (s *Store) SetOwner(rel string, uid, gid int) error {
	switch s.owners {
	case OwnersReal:
		return s.Lchown(rel, uid, gid)
	case OwnersXattr:
		return s.withPath("chown", rel, func(path string, st *unix.Stat_t) error {
			return setOwnerXattr(path, st, uid, gid)
		})
	}
	return nil
}

// SetOwnerFd is SetOwner for an open descriptor of a store file.
func (s *Store) SetOwnerFd(fd int, uid, gid int) error {
	switch s.owners {
	case OwnersReal:
		return unix.Fchown(fd, uid, gid)
	case OwnersXattr:
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return err
		}
		return setOwnerXattr("/proc/self/fd/"+strconv.Itoa(fd), &st, uid, gid)
	}
	return nil
}

func setOwnerXattr(path string, st *unix.Stat_t, uid, gid int) error {
	if !carriesXattr(st.Mode) {
		return nil
	}
	if uid < 0 || gid < 0 {
		u, g, ok := ownerFromXattr(path)
		if !ok {
			u, g = st.Uid, st.Gid
		}
		if uid < 0 {
			uid = int(u)
		}
		if gid < 0 {
			gid = int(g)
		}
	}
	return unix.Setxattr(path, OwnerXattr, encodeOwner(uint32(uid), uint32(gid)), 0)
}

// Fstat returns the status of an open store file, with the owner the store keeps for it.
//
// A disk tier file's inode number carries DiskInoBit.
func (s *Store) Fstat(fd int) (syscall.Stat_t, error) {
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return st, err
	}
	if s.dsk != nil && st.Dev == s.dsk.dev {
		st.Ino = diskIno("/proc/self/fd/"+strconv.Itoa(fd), st.Ino)
	}
	if s.owners == OwnersXattr && carriesXattr(st.Mode) {
		if u, g, ok := ownerFromXattr("/proc/self/fd/" + strconv.Itoa(fd)); ok {
			st.Uid, st.Gid = u, g
		}
	}
	return st, nil
}

// lstatOwned is Lstat under OwnersXattr: the file's status with its recorded owner.
func (s *Store) lstatOwned(rel string) (syscall.Stat_t, error) {
	var out syscall.Stat_t
	t := s.locate(rel)
	err := s.withPathIn(t, "lstat", rel, func(path string, st *unix.Stat_t) error {
		// unix.Stat_t and syscall.Stat_t are the same kernel struct stat.
		out = *(*syscall.Stat_t)(unsafe.Pointer(st))
		if carriesXattr(st.Mode) {
			if u, g, ok := ownerFromXattr(path); ok {
				out.Uid, out.Gid = u, g
			}
		}
		if t.disk {
			out.Ino = diskIno(path, out.Ino)
		}
		return nil
	})
	return out, err
}

// withPath opens rel itself (O_PATH|O_NOFOLLOW: a symlink is the link, never its target)
// and runs fn with the descriptor's /proc/self/fd path, which names exactly the opened
// file (no lookup by name happens again), and its status.
func (s *Store) withPath(op, rel string, fn func(path string, st *unix.Stat_t) error) error {
	return s.withPathIn(s.locate(rel), op, rel, fn)
}

// withPathIn is withPath in tier t.
func (s *Store) withPathIn(t *tier, op, rel string, fn func(path string, st *unix.Stat_t) error) error {
	return s.atIn(t, op, rel, func(dirfd int, name string) error {
		fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return err
		}
		return fn("/proc/self/fd/"+strconv.Itoa(fd), &st)
	})
}

// Getxattr reads the extended attribute name of rel into dest (len(dest) == 0 asks for
// the size), returning the attribute's size in bytes; errors are the kernel's (ENODATA,
// ERANGE) wrapped with rel.
func (s *Store) Getxattr(rel, name string, dest []byte) (int, error) {
	var n int
	err := s.withPath("getxattr", rel, func(path string, _ *unix.Stat_t) error {
		var err error
		n, err = unix.Getxattr(path, name, dest)
		return err
	})
	return n, err
}

// Setxattr sets the extended attribute name of rel to data, with setxattr(2) flags
// (XATTR_CREATE, XATTR_REPLACE).
func (s *Store) Setxattr(rel, name string, data []byte, flags int) error {
	return s.withPath("setxattr", rel, func(path string, _ *unix.Stat_t) error {
		return unix.Setxattr(path, name, data, flags)
	})
}

// Removexattr removes the extended attribute name of rel.
func (s *Store) Removexattr(rel, name string) error {
	return s.withPath("removexattr", rel, func(path string, _ *unix.Stat_t) error {
		return unix.Removexattr(path, name)
	})
}

// Listxattr lists rel's extended attribute names into dest (NUL-terminated each;
// len(dest) == 0 asks for the size), returning the list's size in bytes.
func (s *Store) Listxattr(rel string, dest []byte) (int, error) {
	var n int
	err := s.withPath("listxattr", rel, func(path string, _ *unix.Stat_t) error {
		var err error
		n, err = unix.Listxattr(path, dest)
		return err
	})
	return n, err
}

// Link makes newRel a hard link to the file oldRel (linkat(2), no symlink followed), in
// the tier that holds oldRel.
func (s *Store) Link(oldRel, newRel string) error {
	s.nsMu.RLock()
	defer s.nsMu.RUnlock()
	t := s.locate(oldRel)
	if t.disk {
		if err := s.mkdirsIn(t, pathpattern.Parent(newRel)); err != nil {
			return err
		}
	}
	err := s.atIn(t, "link", oldRel, func(olddir int, oldName string) error {
		newdir, newName, err := s.parentIn(t, newRel)
		if err != nil {
			return err
		}
		defer unix.Close(newdir)
		return unix.Linkat(olddir, oldName, newdir, newName, 0)
	})
	if err == nil && t.disk {
		s.markDisk(newRel)
	}
	return err
}

// Mknod creates the special file (FIFO, socket, device) or empty regular file rel with
// mknod(2)'s mode (type and permission bits) and device number dev.
func (s *Store) Mknod(rel string, mode uint32, dev int) error {
	return s.atIn(s.mem, "mknod", rel, func(dirfd int, name string) error {
		return unix.Mknodat(dirfd, name, mode, dev)
	})
}

// makeOpenDir creates dir (and its parents) with mode 0777 whatever the process umask,
// as an emptyDir's root is: which step may write there is for the permissions the views
// report, not for the server's umask.
func makeOpenDir(dir string) (created bool, err error) {
	if _, err := os.Stat(dir); err == nil {
		return false, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return false, err
	}
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return false, err
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		return true, fmt.Errorf("chmod %s: %w", filepath.Clean(dir), err)
	}
	return true, nil
}
