package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluice-io/sluice/internal/pathpattern"
)

// Spill: when a write needs space the memory tier does not have, files that may live on
// disk move to the disk tier first, least recently opened first: committed files
// (SetSpillable: their bytes never change), then files still being written that no
// descriptor has open (SetSpillWritten); only then does the writer wait, and then fail
// with ENOSPC. And while the memory tier's files being written (those not committed) take
// half its limit or more, a new file that may live on disk is created in the disk tier
// (placeWritten): a file created then may grow past what the memory tier has left, and
// its writer holds it open, so it could not move later.
//
// A move copies the file into the disk tier under a temporary name, renames it into place
// there (no name is replaced), then unlinks the memory tier's name; lookups find the
// memory copy until that unlink and the disk copy after it, both whole: bytes never exist
// only half-moved. Descriptors opened before the move of a committed file keep reading
// the memory copy, whose space is freed when the last of them closes. A file being written
// moves only while no descriptor has it open, in any process: the move holds a write
// lease on it (fcntl F_SETLEASE, F_WRLCK, which the kernel grants only then), so that an
// open in another process while it copies breaks the lease and the move gives up, and
// opens through this Store wait for the move (Open shares nsMu); a writer reopening it
// later finds the disk copy. One with a descriptor open is retried, with a growing delay,
// while writers wait for space (retrySpill). The disk copy records the inode number the
// file had (spillInoXattr), which Lstat and Fstat go on reporting, so a view's node ID for
// the file never changes. Hard-linked files, files whose start was released (Punch), and
// moves that would take the disk tier past its limit stay where they are. Moves and every
// name change of this Store are serialised (nsMu); another process changing the same
// names meanwhile is not.

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

// writtenSpill is the state of the spill of files being written (SetSpillWritten).
type writtenSpill struct {
	on      atomic.Bool
	mayMove func(rel string) bool
	// retry is the delay before busy moves are tried again (retrySpill); armed, whether
	// a retry is pending. Both under Store.mu.
	retry time.Duration
	armed bool
}

// The delays between tries of a move of a file being written that a descriptor had open.
const (
	firstSpillRetry = 10 * time.Millisecond
	lastSpillRetry  = 500 * time.Millisecond
)

// errBusy: a descriptor has the file open.
var errBusy = errors.New("open elsewhere")

// SetSpillWritten lets files being written that mayMove accepts (their volume path) live
// on the disk tier: created there while the memory tier's uncommitted files take half its
// limit or more, moved there when the memory tier is full and no descriptor has them open.
// Without a disk tier it does nothing. Call it, after SetSpillable, before the store is
// used; mayMove must not call the store.
func (s *Store) SetSpillWritten(mayMove func(rel string) bool) {
	if s.dsk == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.written.mayMove = mayMove
	s.written.on.Store(mayMove != nil)
}

// placeWritten reports whether the file rel, being created, goes to the disk tier
// because the memory tier's files being written (those SetSpillable does not accept: not
// committed) already take half its limit or more, and counts it as spilled if so.
func (s *Store) placeWritten(rel string) bool {
	if !s.written.on.Load() || s.limit <= 0 || !s.written.mayMove(rel) {
		return false
	}
	s.mu.Lock()
	used, half := s.used, s.limit/2
	spillable := s.spillable
	var files []string
	var held []int64
	if used >= half {
		for r := range s.sizes {
			if n := s.accountedLocked(r); n > 0 && !s.onDiskFiles[r] {
				files, held = append(files, r), append(held, n)
			}
		}
	}
	s.mu.Unlock()
	if used < half {
		return false
	}
	for i, r := range files {
		if spillable != nil && spillable(r) {
			if used -= held[i]; used < half {
				return false
			}
		}
	}
	s.mu.Lock()
	s.spilledFiles++
	s.mu.Unlock()
	return true
}

// spill moves files to the disk tier until need bytes of the memory tier are freed (or no
// file may move), never except (the file being written): committed files first, then
// files being written that no descriptor has open. It returns the bytes freed.
func (s *Store) spill(need int64, except string) int64 {
	s.mu.Lock()
	spillable, mayMove := s.spillable, s.written.mayMove
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
	var written []string
	for _, rel := range cands {
		if freed >= need {
			break
		}
		if strings.Contains(rel, spillPrefix) {
			continue
		}
		if !spillable(rel) {
			if mayMove != nil && mayMove(rel) {
				written = append(written, rel)
			}
			continue
		}
		n, err := s.move(rel, false)
		if err != nil {
			continue // gone, linked, or not movable: the next one
		}
		freed += n
	}
	busy := false
	for _, rel := range written {
		if freed >= need {
			break
		}
		n, err := s.move(rel, true)
		if errors.Is(err, errBusy) {
			busy = true
		}
		if err != nil {
			continue
		}
		freed += n
	}
	if freed < need && busy {
		s.retrySpill()
	}
	return freed
}

// spillNote completes the error of a write the memory tier (disk false) had no room for
// although it could spill (spill): what the disk tier holds, when it has a limit.
func (s *Store) spillNote(disk, spill bool) string {
	if disk || !spill {
		return ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.diskLimit <= 0 {
		return ""
	}
	return fmt.Sprintf("; the disk tier has %d of its %d used", s.diskUsed, s.diskLimit)
}

// retrySpill wakes the writers waiting for space after a delay, so that they try again to
// move the files being written that a descriptor had open (a writer's close reaches the
// store only when the kernel releases the file); the delay doubles up to lastSpillRetry
// while moves fail, and starts again from firstSpillRetry after one succeeds.
func (s *Store) retrySpill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.written.armed {
		return
	}
	s.written.retry = min(max(2*s.written.retry, firstSpillRetry), lastSpillRetry)
	s.written.armed = true
	time.AfterFunc(s.written.retry, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.written.armed = false
		s.wakeLocked()
	})
}

// move moves the regular file rel from the memory tier to the disk tier and returns the
// bytes of the memory tier it freed. A file being written (written) moves only while no
// descriptor has it open (errBusy otherwise).
func (s *Store) move(rel string, written bool) (int64, error) {
	s.nsMu.Lock()
	defer s.nsMu.Unlock()
	src := -1
	if err := s.atIn(s.mem, "open", rel, func(dirfd int, name string) error {
		var err error
		src, err = unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		return err
	}); err != nil {
		return 0, err
	}
	srcFile := os.NewFile(uintptr(src), rel)
	defer srcFile.Close()
	if written {
		// Granted only if no other descriptor has the file open; from then on an open of
		// it in another process breaks the lease (and waits until it is given up).
		if _, err := unix.FcntlInt(uintptr(src), unix.F_SETLEASE, unix.F_WRLCK); err != nil {
			if errors.Is(err, unix.EAGAIN) {
				return 0, fmt.Errorf("%s: %w", rel, errBusy)
			}
			return 0, &os.PathError{Op: "lease", Path: rel, Err: err}
		}
		defer unix.FcntlInt(uintptr(src), unix.F_SETLEASE, unix.F_UNLCK)
	}
	var st unix.Stat_t
	if err := unix.Fstat(src, &st); err != nil {
		return 0, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Nlink != 1 {
		return 0, fmt.Errorf("%s: not a regular file with one name", rel)
	}
	s.mu.Lock()
	held, full := s.accountedLocked(rel), s.diskLimit > 0 && s.diskUsed+s.accountedLocked(rel) > s.diskLimit
	s.mu.Unlock()
	if full {
		return 0, fmt.Errorf("%s: its %d bytes do not fit in the disk tier: %w", rel, held, ErrNoSpace)
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
	if written {
		// An open in another process since the lease was granted would go on with the
		// memory copy: the move gives up, the disk copy goes.
		if kind, err := unix.FcntlInt(uintptr(src), unix.F_GETLEASE, 0); err != nil || kind != unix.F_WRLCK {
			_ = unix.Unlinkat(dir, name, 0)
			return 0, fmt.Errorf("%s: opened while moving: %w", rel, errBusy)
		}
	}
	// The disk copy is in place and whole; from this unlink on, lookups find it.
	s.leaving(s.mem, rel)
	if err := s.atIn(s.mem, "unlink", rel, func(dirfd int, name string) error { return unix.Unlinkat(dirfd, name, 0) }); err != nil {
		_ = unix.Unlinkat(dir, name, 0)
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	held = s.accountedLocked(rel)
	s.used -= held
	s.diskUsed += held
	s.diskPeak = max(s.diskPeak, s.diskUsed)
	s.onDiskFiles[rel] = true
	s.spilledFiles++
	s.spilledBytes += held
	if written {
		s.written.retry = 0
	}
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
