package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/sluice-io/sluice/internal/pathpattern"
)

// A node store has a memory tier (its directory, a tmpfs in production) and, optionally,
// a disk tier (Options.Disk: a directory on the node's disk). One namespace spans both:
// directories, symlinks and special files live in the memory tier; a regular file lives in
// the tier where it was created — the disk tier when Options.OnDisk says so for its path
// (CAPIO-CL storage: the workflow's tiers.fs) or when the memory tier is taken by files
// being written (spill.go), the memory tier otherwise — and stays there when renamed or
// linked, unless spill moves it to the disk tier. The disk tier repeats the directories
// its files need. Each tier has its own byte accounting and limit. Lookups look in the
// memory tier first.

// DiskInoBit is set in the inode numbers the store reports for files of the disk tier
// (Lstat, Fstat), so that they never equal a memory tier file's: views use inode numbers
// as FUSE node IDs.
const DiskInoBit = 1 << 61

// tier is one tier's root.
type tier struct {
	// root is the O_PATH descriptor of the tier's directory, used only through withRoot:
	// Close may run while an operation resolves beneath it.
	root *os.File
	rc   syscall.RawConn
	dir  string // absolute directory
	dev  uint64 // st_dev of its file system
	disk bool
}

// withRoot runs fn with the descriptor of the tier's root, which stays open until fn
// returns even when the store is closed meanwhile (the descriptor is closed when the
// last such use ends, so its number is never reused under an operation). After close it
// returns an error wrapping os.ErrClosed and does not run fn; otherwise fn's error.
func (t *tier) withRoot(fn func(root int) error) error {
	var ferr error
	if err := t.rc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return fmt.Errorf("node store %s: %w", t.dir, os.ErrClosed)
	}
	return ferr
}

// close releases the tier's root descriptor once no operation uses it (withRoot): a
// detached mount it holds is freed with it.
func (t *tier) close() error { return t.root.Close() }

func openTier(dir string, disk bool) (*tier, error) {
	if _, err := makeOpenDir(dir); err != nil {
		return nil, fmt.Errorf("creating node store %s: %w", dir, err)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("node store %s: %w", dir, err)
	}
	root, err := openRoot(abs)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(root, &st); err != nil {
		unix.Close(root)
		return nil, fmt.Errorf("node store %s: %w", abs, err)
	}
	f := os.NewFile(uintptr(root), abs)
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("node store %s: %w", abs, err)
	}
	return &tier{root: f, rc: rc, dir: abs, dev: st.Dev, disk: disk}, nil
}

// exists reports whether rel names an entry of tier t.
func (s *Store) exists(t *tier, rel string) bool {
	_, err := s.lstatIn(t, rel)
	return err == nil
}

// lstatIn is lstat(2) of rel in tier t, without the owner the store keeps.
func (s *Store) lstatIn(t *tier, rel string) (syscall.Stat_t, error) {
	var st syscall.Stat_t
	err := s.atIn(t, "lstat", rel, func(dirfd int, name string) error {
		return unix.Fstatat(dirfd, name, (*unix.Stat_t)(unsafe.Pointer(&st)), unix.AT_SYMLINK_NOFOLLOW)
	})
	return st, err
}

// locate returns the tier holding rel: the memory tier unless only the disk tier has it
// (and the memory tier when neither has, so that errors name the namespace's tier).
func (s *Store) locate(rel string) *tier {
	if s.dsk == nil || s.exists(s.mem, rel) || !s.exists(s.dsk, rel) {
		return s.mem
	}
	return s.dsk
}

// placeFile returns the tier in which to open the file rel: the one holding it, or, when
// creating it, the disk tier if Options.OnDisk says so or the memory tier is taken by
// files being written (placeWritten, spill.go); its directories are made there as the
// memory tier has them: the parent must exist in the memory tier.
func (s *Store) placeFile(rel string, create bool) (*tier, error) {
	if s.exists(s.mem, rel) {
		return s.mem, nil
	}
	if s.exists(s.dsk, rel) {
		return s.dsk, nil
	}
	if !create || (s.onDisk == nil || !s.onDisk(rel)) && !s.placeWritten(rel) {
		return s.mem, nil
	}
	parent := pathpattern.Parent(rel)
	if st, err := s.lstatIn(s.mem, parent); err != nil {
		return nil, err
	} else if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return nil, &os.PathError{Op: "open", Path: rel, Err: unix.ENOTDIR}
	}
	if err := s.mkdirsIn(s.dsk, parent); err != nil {
		return nil, err
	}
	return s.dsk, nil
}

// mkdirsIn creates the directory rel and those above it in tier t (mode 0777, as the
// memory tier's are made).
func (s *Store) mkdirsIn(t *tier, rel string) error {
	c, err := pathpattern.Clean(rel)
	if err != nil || c == "." {
		return err
	}
	if _, err := s.lstatIn(t, c); err == nil {
		return nil
	}
	if err := s.mkdirsIn(t, pathpattern.Parent(c)); err != nil {
		return err
	}
	err = s.atIn(t, "mkdir", c, func(dirfd int, name string) error {
		if err := unix.Mkdirat(dirfd, name, 0o777); err != nil && !errors.Is(err, unix.EEXIST) {
			return err
		}
		return unix.Fchmodat(dirfd, name, 0o777, 0)
	})
	return err
}

// markDisk records that the file rel is in the disk tier (its bytes count against the
// disk tier's limit).
func (s *Store) markDisk(rel string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.onDiskFiles[rel] {
		return
	}
	s.onDiskFiles[rel] = true
	if held := s.accountedLocked(rel); held != 0 {
		s.used -= held
		s.diskUsed += held
	}
}

// renameTiers is RenameAt with a disk tier.
func (s *Store) renameTiers(oldRel, newRel string, flags uint) error {
	st, err := s.Lstat(oldRel)
	if err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		// The memory tier's directory is the name; the disk tier's follows it.
		if err := s.renameIn(s.mem, oldRel, newRel, flags); err != nil {
			return err
		}
		if s.exists(s.dsk, oldRel) {
			if err := s.mkdirsIn(s.dsk, pathpattern.Parent(newRel)); err != nil {
				return err
			}
			if err := s.renameIn(s.dsk, oldRel, newRel, flags&^unix.RENAME_NOREPLACE); err != nil {
				return fmt.Errorf("renaming %s to %s in the disk tier: %w", oldRel, newRel, err)
			}
		}
		return nil
	}
	from := s.locate(oldRel)
	other := s.mem
	if from == s.mem {
		other = s.dsk
	}
	inOther := s.exists(other, newRel)
	switch {
	case inOther && flags&unix.RENAME_NOREPLACE != 0:
		return &os.PathError{Op: "rename", Path: newRel, Err: unix.EEXIST}
	case inOther && flags&unix.RENAME_EXCHANGE != 0:
		return &os.PathError{Op: "rename", Path: newRel, Err: unix.EXDEV}
	}
	if from.disk {
		if err := s.mkdirsIn(from, pathpattern.Parent(newRel)); err != nil {
			return err
		}
	}
	if err := s.renameIn(from, oldRel, newRel, flags); err != nil {
		return err
	}
	if inOther {
		// The name now belongs to the renamed file: the one it replaced goes.
		s.leaving(other, newRel)
		if err := s.atIn(other, "unlink", newRel, func(dirfd int, name string) error { return unix.Unlinkat(dirfd, name, 0) }); err != nil && !errors.Is(err, unix.ENOENT) {
			return err
		}
	}
	return nil
}

// WalkFiles calls fn with the inode number the store reports (Lstat) and the volume path
// of every entry below the root, in both tiers (a directory once), stopping at fn's
// first error. The resumption of a restarted view uses it to find a node ID's path.
func (s *Store) WalkFiles(fn func(ino uint64, rel string) error) error {
	tiers := []*tier{s.mem}
	if s.dsk != nil {
		tiers = append(tiers, s.dsk)
	}
	for _, t := range tiers {
		err := filepath.WalkDir(t.dir, func(p string, d os.DirEntry, err error) error {
			if err != nil || p == t.dir {
				return nil
			}
			if t.disk && d.IsDir() {
				return nil // the memory tier's copy names it
			}
			info, err := d.Info()
			if err != nil {
				return nil
			}
			st, ok := info.Sys().(*syscall.Stat_t)
			if !ok {
				return nil
			}
			rel, _ := filepath.Rel(t.dir, p)
			ino := st.Ino
			if t.disk {
				if strings.HasPrefix(d.Name(), spillPrefix) {
					return nil // a move in progress
				}
				ino = diskIno(p, ino)
			}
			return fn(ino, filepath.ToSlash(rel))
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// DiskDir returns the disk tier's directory ("" without one).
func (s *Store) DiskDir() string {
	if s.dsk == nil {
		return ""
	}
	return s.dsk.dir
}

// DiskLimit returns the disk tier's limit in bytes (0: none beyond its file system's).
func (s *Store) DiskLimit() int64 { return s.diskLimit }

// DiskUsed returns the bytes accounted to files of the disk tier.
func (s *Store) DiskUsed() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.diskUsed
}

// Peaks returns the most bytes the memory tier and the disk tier have held (as counted
// against their limits) since the store was opened.
func (s *Store) Peaks() (memory, disk int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return max(s.peak, s.used), max(s.diskPeak, s.diskUsed)
}

// onDiskLocked reports whether rel's bytes count against the disk tier.
func (s *Store) onDiskLocked(rel string) bool { return s.onDiskFiles[rel] }

// ErrNoInodes is matched (errors.Is) by the error of an operation that needed a new inode
// in a tier whose file system has none left (a tmpfs of the node plugin's bounds its
// inodes from its size, csi-driver/memtier.go): an *InodesError, which also unwraps to
// ENOSPC, the errno the kernel gave and a view answers.
var ErrNoInodes = errors.New("out of inodes")

// InodesError says that a tier ran out of inodes.
type InodesError struct {
	// Tier is "memory tier" or "disk tier"; Dir is its directory (for a memory tier on a
	// cluster, store/<namespace>/<workflow> of the node store, which names the workflow).
	Tier, Dir string
	// Files is how many inodes its file system has, all in use.
	Files uint64
}

func (e *InodesError) Error() string {
	return fmt.Sprintf("the %s (%s) is out of inodes: all %d are in use (a tier holds one inode per 8 KiB of its size, at least 1,024: docs/kubernetes.md)", e.Tier, e.Dir, e.Files)
}

// Is makes errors.Is(err, ErrNoInodes) true.
func (e *InodesError) Is(target error) bool { return target == ErrNoInodes }

// Unwrap gives the errno the kernel answered, ENOSPC.
func (e *InodesError) Unwrap() error { return unix.ENOSPC }

// noInodes returns err, or an *InodesError naming t when err is ENOSPC and t's file
// system has no free inode left (a create that found no space for a name's block is
// still ENOSPC alone).
func (t *tier) noInodes(err error) error {
	if !errors.Is(err, unix.ENOSPC) {
		return err
	}
	var st unix.Statfs_t
	if t.withRoot(func(root int) error { return unix.Fstatfs(root, &st) }) != nil || st.Files == 0 || st.Ffree > 0 {
		return err
	}
	return &InodesError{Tier: tierName(t.disk), Dir: t.dir, Files: st.Files}
}

// tierName names a file's tier in errors.
func tierName(disk bool) string {
	if disk {
		return "disk tier"
	}
	return "memory tier"
}
