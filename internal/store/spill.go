package store

import (
	"encoding/binary"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sluice-io/sluice/internal/pathpattern"
)

// Spill: when a write needs space the memory tier does not have, files that may live on
// disk (Options.Spillable: committed, not pinned to memory) move to the disk tier first,
// least recently opened first; only then does the writer wait, and then fail with ENOSPC.
//
// A move copies the file into the disk tier under a temporary name, renames it into place
// there (no name is replaced), then unlinks the memory tier's name; lookups find the
// memory copy until that unlink and the disk copy after it, both whole: bytes never exist
// only half-moved. Descriptors opened before the move keep reading the memory copy,
// whose space is freed when the last of them closes. The disk copy records the inode
// number the file had (spillInoXattr), which Lstat and Fstat go on reporting, so a view's
// node ID for the file never changes. Hard-linked files, and files whose start was
// released (Punch), stay where they are. Moves and every name change of this Store are
// serialised (nsMu); another process changing the same names meanwhile is not.

// spillInoXattr holds, on a spilled file, the inode number (8 bytes, little endian) it had
// in the memory tier.
const spillInoXattr = "user.sluice.ino"

// spillPrefix names the temporary files of moves in progress.
const spillPrefix = ".sluice-spill-"

// SetSpillable lets files that spillable accepts (their volume path) move to the disk
// tier when the memory tier is full; without a disk tier it does nothing. Call it before
// the store is used; spillable must not call the store.
func (s *Store) SetSpillable(spillable func(rel string) bool) {
	if s.dsk == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.spillable = spillable
	s.spillOn.Store(spillable != nil)
}

// noteUse records that rel was opened, for the least-recently-used order of spills.
func (s *Store) noteUse(rel string) {
	if !s.spillOn.Load() {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.useSeq++
	s.lastUse[rel] = s.useSeq
}

// Spilled returns the files and bytes moved to the disk tier so far.
func (s *Store) Spilled() (files int, bytes int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.spilledFiles, s.spilledBytes
}

// spill moves files to the disk tier until need bytes of the memory tier are freed (or no
// file may move), never except (the file being written). It returns the bytes freed.
func (s *Store) spill(need int64, except string) int64 {
	s.mu.Lock()
	spillable := s.spillable
	var cands []string
	for rel := range s.sizes {
		if rel != except && !s.onDiskFiles[rel] && s.punched[rel] == 0 && s.accountedLocked(rel) > 0 {
			cands = append(cands, rel)
		}
	}
	sort.Slice(cands, func(i, j int) bool { return s.lastUse[cands[i]] < s.lastUse[cands[j]] })
	s.mu.Unlock()
	if spillable == nil {
		return 0
	}
	var freed int64
	for _, rel := range cands {
		if freed >= need {
			break
		}
		if strings.Contains(rel, spillPrefix) || !spillable(rel) {
			continue
		}
		n, err := s.move(rel)
		if err != nil {
			continue // gone, linked, or not movable: the next one
		}
		freed += n
	}
	return freed
}

// move moves the regular file rel from the memory tier to the disk tier and returns the
// bytes of the memory tier it freed.
func (s *Store) move(rel string) (int64, error) {
	s.nsMu.Lock()
	defer s.nsMu.Unlock()
	src := -1
	if err := s.atIn(s.mem, "open", rel, func(dirfd int, name string) error {
		var err error
		src, err = unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		return err
	}); err != nil {
		return 0, err
	}
	srcFile := os.NewFile(uintptr(src), rel)
	defer srcFile.Close()
	var st unix.Stat_t
	if err := unix.Fstat(src, &st); err != nil {
		return 0, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Nlink != 1 {
		return 0, fmt.Errorf("%s: not a regular file with one name", rel)
	}
	if err := s.mkdirsIn(s.dsk, pathpattern.Parent(rel)); err != nil {
		return 0, err
	}
	dir, name, err := s.parentIn(s.dsk, rel)
	if err != nil {
		return 0, err
	}
	defer unix.Close(dir)
	tmp := spillPrefix + strconv.FormatUint(st.Ino, 16)
	dst, err := unix.Openat(dir, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, st.Mode&0o7777)
	if err != nil {
		return 0, &os.PathError{Op: "spill", Path: rel, Err: err}
	}
	dstFile := os.NewFile(uintptr(dst), tmp)
	fail := func(err error) (int64, error) {
		dstFile.Close()
		_ = unix.Unlinkat(dir, tmp, 0)
		return 0, &os.PathError{Op: "spill", Path: rel, Err: err}
	}
	if err := copyData(dst, src, st.Size); err != nil { // holes stay holes (extents.go)
		return fail(err)
	}
	ino := binary.LittleEndian.AppendUint64(nil, st.Ino)
	if err := unix.Fsetxattr(dst, spillInoXattr, ino, 0); err != nil {
		return fail(err)
	}
	owner := make([]byte, 64)
	if k, err := unix.Fgetxattr(src, OwnerXattr, owner); err == nil {
		_ = unix.Fsetxattr(dst, OwnerXattr, owner[:k], 0)
	}
	_ = unix.Fchmod(dst, st.Mode&0o7777) // past the umask
	_ = unix.Fchown(dst, int(st.Uid), int(st.Gid))
	_ = unix.UtimesNanoAt(dir, tmp, []unix.Timespec{st.Atim, st.Mtim}, 0)
	if err := dstFile.Close(); err != nil {
		_ = unix.Unlinkat(dir, tmp, 0)
		return 0, &os.PathError{Op: "spill", Path: rel, Err: err}
	}
	if err := unix.Renameat2(dir, tmp, dir, name, unix.RENAME_NOREPLACE); err != nil {
		_ = unix.Unlinkat(dir, tmp, 0)
		return 0, &os.PathError{Op: "spill", Path: rel, Err: err}
	}
	// The disk copy is in place and whole; from this unlink on, lookups find it.
	if err := s.atIn(s.mem, "unlink", rel, func(dirfd int, name string) error { return unix.Unlinkat(dirfd, name, 0) }); err != nil {
		_ = unix.Unlinkat(dir, name, 0)
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	held := s.accountedLocked(rel)
	s.used -= held
	s.diskUsed += held
	s.diskPeak = max(s.diskPeak, s.diskUsed)
	s.onDiskFiles[rel] = true
	s.spilledFiles++
	s.spilledBytes += held
	s.wakeLocked()
	return held, nil
}

// diskIno is the inode number the store reports for the disk tier file at path (a
// /proc/self/fd path naming exactly one open file, or a path): the one it had in memory if
// it was spilled (spillInoXattr), else its own, own, with DiskInoBit.
func diskIno(path string, own uint64) uint64 {
	b := make([]byte, 8)
	if n, err := unix.Getxattr(path, spillInoXattr, b); err == nil && n == 8 {
		return binary.LittleEndian.Uint64(b)
	}
	return own | DiskInoBit
}
