package store

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sluice-io/sluice/internal/pathpattern"
)

// Every file operation on the store resolves its path beneath the store's root
// descriptor: no component may be a symlink (a step that swaps a directory for a symlink
// to anywhere must not make the server read or write there), ".." never appears (paths
// are cleaned), and resolution never leaves the store's file system. The last component
// is used with the *at calls and AT_SYMLINK_NOFOLLOW / O_NOFOLLOW, so that a symlink
// there is the symlink itself, never its target. Open resolves the whole path in one
// openat2(2) call with the same flags (a symlink as the last component is ELOOP), since it
// is on the path of every open(2) in a view.

// resolveFlags are the openat2(2) resolve flags of every lookup beneath the root
// (Linux >= 5.6).
const resolveFlags = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// maxResolve is the longest path handed to one openat2 call; longer paths (the kernel's
// PATH_MAX is 4096 bytes) are resolved a piece at a time.
const maxResolve = 3072

// openRoot opens the store directory as an O_PATH descriptor.
func openRoot(dir string) (int, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("opening node store %s: %w", dir, err)
	}
	return fd, nil
}

// Parent resolves the directory that holds the cleaned volume path rel beneath the
// store's root, following no symlink (openat2 RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|
// RESOLVE_NO_MAGICLINKS|RESOLVE_NO_XDEV). It returns an O_PATH descriptor of that
// directory, which the caller closes, and rel's last component ("." for the root). Errors
// are the kernel's (ELOOP when a directory on the way is a symlink, ENOENT, ENOTDIR,
// EXDEV) wrapped in an *os.PathError naming rel, or pathpattern's for an unclean path.
func (s *Store) Parent(rel string) (dirfd int, name string, err error) {
	return s.parentIn(s.mem, rel)
}

// parentIn is Parent beneath the root of tier t.
func (s *Store) parentIn(t *tier, rel string) (dirfd int, name string, err error) {
	c, err := pathpattern.Clean(rel)
	if err != nil {
		return -1, "", err
	}
	dir, name := ".", c
	if i := strings.LastIndexByte(c, '/'); i >= 0 {
		dir, name = c[:i], c[i+1:]
	}
	fd, err := s.walkIn(t, dir)
	if err != nil {
		return -1, "", &os.PathError{Op: "resolve", Path: rel, Err: err}
	}
	return fd, name, nil
}

// openDir opens the cleaned directory path dir beneath the memory tier's root as an
// O_PATH descriptor.
func (s *Store) openDir(dir string) (int, error) { return s.walkIn(s.mem, dir) }

// walkIn opens the cleaned directory path dir beneath the root of tier t as an O_PATH
// descriptor, which the caller closes ("." or "": a copy of the root's), resolving at
// most maxResolve bytes of it per openat2(2) call.
func (s *Store) walkIn(t *tier, dir string) (int, error) {
	fd := -1 // ours once set: the directory resolved so far
	if dir == "." || dir == "" {
		err := t.withRoot(func(root int) (err error) {
			fd, err = unix.FcntlInt(uintptr(root), unix.F_DUPFD_CLOEXEC, 0)
			return err
		})
		return fd, err
	}
	for dir != "." && dir != "" {
		piece := dir
		if len(piece) > maxResolve {
			cut := strings.LastIndexByte(piece[:maxResolve], '/')
			if cut <= 0 {
				if fd >= 0 {
					unix.Close(fd)
				}
				return -1, unix.ENAMETOOLONG
			}
			piece = piece[:cut]
		}
		dir = strings.TrimPrefix(dir[len(piece):], "/")
		how := &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: resolveFlags}
		var next int
		var err error
		if fd < 0 {
			err = t.withRoot(func(root int) (err error) {
				next, err = unix.Openat2(root, piece, how)
				return err
			})
		} else {
			next, err = unix.Openat2(fd, piece, how)
			unix.Close(fd)
		}
		if err != nil {
			return -1, err
		}
		fd = next
	}
	return fd, nil
}

// at runs fn with the parent directory of rel and rel's last component, in the tier that
// holds rel (locate).
func (s *Store) at(op, rel string, fn func(dirfd int, name string) error) error {
	return s.atIn(s.locate(rel), op, rel, fn)
}

// atIn is at in tier t. A name in the root itself is used relative to the root's own
// descriptor, without a copy of it.
func (s *Store) atIn(t *tier, op, rel string, fn func(dirfd int, name string) error) error {
	c, err := pathpattern.Clean(rel)
	if err != nil {
		return err
	}
	i := strings.LastIndexByte(c, '/')
	if i < 0 { // a name in the root
		err = t.withRoot(func(root int) error { return fn(root, c) })
	} else {
		dirfd, werr := s.walkIn(t, c[:i])
		if werr != nil {
			return &os.PathError{Op: "resolve", Path: rel, Err: werr}
		}
		err = fn(dirfd, c[i+1:])
		unix.Close(dirfd)
	}
	if err != nil {
		return &os.PathError{Op: op, Path: rel, Err: t.noInodes(err)}
	}
	return nil
}

// Lstat returns the status of rel itself (a symlink is not followed), as the syscall
// package's Stat_t that go-fuse takes, with the owner the store keeps for it (Owners).
func (s *Store) Lstat(rel string) (syscall.Stat_t, error) {
	if s.owners == OwnersXattr {
		return s.lstatOwned(rel)
	}
	var st syscall.Stat_t
	t := s.locate(rel)
	if t.disk {
		err := s.withPathIn(t, "lstat", rel, func(path string, ust *unix.Stat_t) error {
			st = *(*syscall.Stat_t)(unsafe.Pointer(ust))
			st.Ino = diskIno(path, st.Ino)
			return nil
		})
		return st, err
	}
	err := s.atIn(t, "lstat", rel, func(dirfd int, name string) error {
		// unix.Stat_t and syscall.Stat_t are the same kernel struct stat.
		return unix.Fstatat(dirfd, name, (*unix.Stat_t)(unsafe.Pointer(&st)), unix.AT_SYMLINK_NOFOLLOW)
	})
	return st, err
}

// Open opens rel with open(2) flags and mode (for O_CREAT), never following a symlink in
// its last component (O_NOFOLLOW: ELOOP) and close-on-exec. The caller closes the
// descriptor.
//
// With a disk tier, an existing rel is opened in the tier that holds it; a file created
// (O_CREAT, absent from both tiers) goes to the disk tier when Options.OnDisk says so or
// the memory tier is taken by files being written (spill.go), its directories made there
// as in the memory tier, and to the memory tier otherwise.
func (s *Store) Open(rel string, flags int, mode uint32) (int, error) {
	if s.written.on.Load() {
		s.nsMu.RLock() // a file being written may be moving to the disk tier (spill.go)
		defer s.nsMu.RUnlock()
	}
	t := s.mem
	if s.dsk != nil {
		var err error
		if t, err = s.placeFile(rel, flags&unix.O_CREAT != 0); err != nil {
			return -1, err
		}
	}
	fd, err := s.openIn(t, rel, flags, mode)
	if err == nil && t.disk && flags&unix.O_CREAT != 0 {
		s.markDisk(rel)
	}
	if err == nil {
		s.noteUse(rel)
	}
	return fd, err
}

// openFlags are the open(2) flags Open passes on to openat2(2), which refuses any other
// (the kernel's VALID_OPEN_FLAGS; a FUSE OPEN may carry __FMODE_EXEC, for one).
const openFlags = unix.O_ACCMODE | unix.O_CREAT | unix.O_EXCL | unix.O_NOCTTY | unix.O_TRUNC | unix.O_APPEND |
	unix.O_NONBLOCK | unix.O_SYNC | unix.O_DSYNC | unix.O_ASYNC | unix.O_DIRECT | unix.O_LARGEFILE |
	unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_NOATIME

// openIn opens rel in tier t as Open says: with one openat2(2) call beneath the tier's root
// (the same resolve flags as every lookup, which also refuse a symlink as the last
// component, ELOOP), or, for a path longer than one call resolves, its parent first.
func (s *Store) openIn(t *tier, rel string, flags int, mode uint32) (int, error) {
	c, err := pathpattern.Clean(rel)
	if err != nil {
		return -1, err
	}
	if len(c) > maxResolve {
		fd := -1
		err := s.atIn(t, "open", rel, func(dirfd int, name string) error {
			var err error
			fd, err = unix.Openat(dirfd, name, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode)
			return err
		})
		return fd, err
	}
	how := unix.OpenHow{Flags: uint64(flags&openFlags | unix.O_NOFOLLOW | unix.O_CLOEXEC), Resolve: resolveFlags}
	if flags&unix.O_CREAT != 0 {
		how.Mode = uint64(mode & 0o7777) // openat2 refuses a mode without O_CREAT, and file type bits
	}
	fd := -1
	err = t.withRoot(func(root int) (err error) {
		fd, err = unix.Openat2(root, c, &how)
		return err
	})
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: rel, Err: t.noInodes(err)}
	}
	return fd, nil
}

// OpenTmpfile creates an unnamed regular file in the directory dir (open(2) with
// O_TMPFILE, Linux >= 3.11), dir resolved beneath the root, and returns its descriptor,
// opened with flags (an access mode, O_EXCL to forbid a name ever) and permission bits
// mode. The file has no name until LinkFd gives it one; its bytes are freed when its last
// descriptor closes.
//
// The file is in the memory tier, whatever name it gets.
func (s *Store) OpenTmpfile(dir string, flags int, mode uint32) (int, error) {
	dirfd, err := s.openDir(dir)
	if err != nil {
		return -1, &os.PathError{Op: "resolve", Path: dir, Err: err}
	}
	defer unix.Close(dirfd)
	fd, err := unix.Openat(dirfd, ".", flags|unix.O_TMPFILE|unix.O_CLOEXEC, mode)
	if err != nil {
		return -1, &os.PathError{Op: "open O_TMPFILE in", Path: dir, Err: s.mem.noInodes(err)}
	}
	return fd, nil
}

// LinkFd gives the file open as fd (an OpenTmpfile file, or any other) the new name rel,
// beneath the root, as linkat(2) of /proc/self/fd/N with AT_SYMLINK_FOLLOW does: unlike
// AT_EMPTY_PATH it needs no CAP_DAC_READ_SEARCH, so an unprivileged sidecar may do it.
func (s *Store) LinkFd(fd int, rel string) error {
	s.nsMu.RLock()
	defer s.nsMu.RUnlock()
	return s.atIn(s.mem, "link", rel, func(dirfd int, name string) error {
		return unix.Linkat(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(fd), dirfd, name, unix.AT_SYMLINK_FOLLOW)
	})
}

// OpenFile is Open returning an *os.File named after rel.
func (s *Store) OpenFile(rel string, flags int, mode uint32) (*os.File, error) {
	fd, err := s.Open(rel, flags, mode)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), rel), nil
}

// Mkdir creates the directory rel with permission bits mode.
// Directories live in the memory tier (the disk tier repeats those its files need).
func (s *Store) Mkdir(rel string, mode uint32) error {
	return s.atIn(s.mem, "mkdir", rel, func(dirfd int, name string) error { return unix.Mkdirat(dirfd, name, mode) })
}

// MkdirAll creates rel and every missing directory above it (mode 0777 whatever the
// umask, as makeOpenDir), beneath the root; a component that exists and is not a
// directory (or is a symlink) fails.
func (s *Store) MkdirAll(rel string) error {
	c, err := pathpattern.Clean(rel)
	if err != nil || c == "." {
		return err
	}
	if st, err := s.lstatIn(s.mem, c); err == nil {
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return &os.PathError{Op: "mkdir", Path: rel, Err: unix.ENOTDIR}
		}
		return nil
	}
	if parent := pathpattern.Parent(c); parent != "." {
		if err := s.MkdirAll(parent); err != nil {
			return err
		}
	}
	if err := s.Mkdir(c, 0o777); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return nil
		}
		return err
	}
	return s.Chmod(c, 0o777)
}

// unlink removes the file (or symlink) rel, and nothing of its accounting: Remove and
// Files.Remove do both.
func (s *Store) unlink(rel string) error {
	s.nsMu.RLock()
	defer s.nsMu.RUnlock()
	s.leaving(s.locate(rel), rel)
	return s.at("unlink", rel, func(dirfd int, name string) error { return unix.Unlinkat(dirfd, name, 0) })
}

// Rmdir removes the empty directory rel: with a disk tier, its copy there first (which
// must be empty too, ENOTEMPTY otherwise), then the memory tier's.
func (s *Store) Rmdir(rel string) error {
	s.nsMu.RLock()
	defer s.nsMu.RUnlock()
	if s.dsk != nil {
		err := s.atIn(s.dsk, "rmdir", rel, func(dirfd int, name string) error { return unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR) })
		if err != nil && !errors.Is(err, unix.ENOENT) {
			return err
		}
	}
	return s.atIn(s.mem, "rmdir", rel, func(dirfd int, name string) error { return unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR) })
}

// renameAt moves oldRel to newRel with renameat2(2) flags (RENAME_NOREPLACE,
// RENAME_EXCHANGE, or 0). It moves the bytes, not the accounting (moveAccounting; Files.Rename
// does both). With a disk
// tier a file stays in its tier (a name it replaces in the other tier is removed), a
// directory is renamed in both, and RENAME_EXCHANGE across tiers fails with EXDEV.
func (s *Store) renameAt(oldRel, newRel string, flags uint) error {
	s.nsMu.RLock()
	defer s.nsMu.RUnlock()
	if s.dsk != nil {
		return s.renameTiers(oldRel, newRel, flags)
	}
	return s.renameIn(s.mem, oldRel, newRel, flags)
}

// renameIn is renameat2(2) of oldRel to newRel, both in tier t.
func (s *Store) renameIn(t *tier, oldRel, newRel string, flags uint) error {
	if flags&unix.RENAME_NOREPLACE == 0 {
		s.leaving(t, newRel) // the file renamed onto it replaces it (or, exchanged, moves)
	}
	return s.atIn(t, "rename", oldRel, func(olddir int, oldName string) error {
		newdir, newName, err := s.parentIn(t, newRel)
		if err != nil {
			return err
		}
		defer unix.Close(newdir)
		return unix.Renameat2(olddir, oldName, newdir, newName, flags)
	})
}

// Symlink creates rel as a symlink to target (stored as given; the store never follows
// it).
func (s *Store) Symlink(target, rel string) error {
	return s.atIn(s.mem, "symlink", rel, func(dirfd int, name string) error { return unix.Symlinkat(target, dirfd, name) })
}

// Readlink returns the target of the symlink rel.
func (s *Store) Readlink(rel string) (string, error) {
	var target string
	err := s.at("readlink", rel, func(dirfd int, name string) error {
		buf := make([]byte, unix.PathMax)
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return err
		}
		target = string(buf[:n])
		return nil
	})
	return target, err
}

// Chmod sets the permission bits of rel. A symlink's own mode cannot be changed
// (EOPNOTSUPP, as lchmod on Linux); its target is never touched.
func (s *Store) Chmod(rel string, mode uint32) error {
	return s.withPath("chmod", rel, func(path string, st *unix.Stat_t) error {
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			return unix.EOPNOTSUPP
		}
		// An O_PATH descriptor cannot be fchmod'ed; its /proc/self/fd path can.
		return unix.Chmod(path, mode)
	})
}

// Lchown sets the owner and group of rel itself (-1 keeps one).
func (s *Store) Lchown(rel string, uid, gid int) error {
	return s.at("chown", rel, func(dirfd int, name string) error {
		return unix.Fchownat(dirfd, name, uid, gid, unix.AT_SYMLINK_NOFOLLOW)
	})
}

// UtimesNano sets the access and modification times of rel itself (utimensat with
// AT_SYMLINK_NOFOLLOW; unix.UTIME_OMIT keeps one).
func (s *Store) UtimesNano(rel string, ts []unix.Timespec) error {
	return s.at("utimes", rel, func(dirfd int, name string) error {
		return unix.UtimesNanoAt(dirfd, name, ts, unix.AT_SYMLINK_NOFOLLOW)
	})
}

// truncate sets the size of the regular file rel in bytes, and nothing of its accounting
// (resize; Files.Truncate does both).
func (s *Store) truncate(rel string, size int64) error {
	fd, err := s.Open(rel, unix.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, size); err != nil {
		return &os.PathError{Op: "truncate", Path: rel, Err: err}
	}
	return nil
}

// ReadDir lists the directory rel (no symlink followed on the way); with a disk tier,
// the files it holds there too.
func (s *Store) ReadDir(rel string) ([]os.DirEntry, error) {
	entries, err := s.readDirIn(s.mem, rel)
	if err != nil || s.dsk == nil {
		return entries, err
	}
	more, err := s.readDirIn(s.dsk, rel)
	if err != nil {
		return entries, nil // no file of the directory is on disk
	}
	seen := make(map[string]bool, len(entries))
	for _, e := range entries {
		seen[e.Name()] = true
	}
	for _, e := range more {
		if !seen[e.Name()] {
			entries = append(entries, e)
		}
	}
	return entries, nil
}

func (s *Store) readDirIn(t *tier, rel string) ([]os.DirEntry, error) {
	fd := -1
	err := s.atIn(t, "open", rel, func(dirfd int, name string) error {
		var err error
		fd, err = unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		return err
	})
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	return f.ReadDir(-1)
}

// LinkOut makes dst (a path outside the store) a hard link to the store's file rel, with
// no symlink followed on the store's side (linkat(2) without AT_SYMLINK_FOLLOW).
func (s *Store) LinkOut(rel, dst string) error {
	return s.at("link", rel, func(dirfd int, name string) error {
		return unix.Linkat(dirfd, name, unix.AT_FDCWD, dst, 0)
	})
}
