// Package store is a node store: the directory on one node (a tmpfs in production, any
// directory in tests) that holds the bytes of one workflow's files, shared by every pod
// view on that node, with the byte accounting that enforces the volume's size limit.
package store

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluice-io/sluice/internal/capability"
	"github.com/sluice-io/sluice/internal/pathpattern"
)

// ErrNoSpace is returned when a write would take the store past its size limit and no
// space was freed within the configured wait. A filesystem reports ENOSPC.
var ErrNoSpace = errors.New("node store is full")

// Store is one workflow's directory on one node. Files are addressed by cleaned paths
// relative to the volume root (pathpattern.Clean). Methods are safe for concurrent use.
type Store struct {
	// unlinked are told of files leaving their names (OnUnlink).
	unlinked  unlinkHooks
	mem       *tier // every path is resolved beneath a tier's root descriptor (beneath.go)
	dsk       *tier // nil: no disk tier (tier.go)
	closeOnce sync.Once
	onDisk    func(rel string) bool
	limit     int64
	diskLimit int64
	spaceWait time.Duration
	owners    Owners

	mu       sync.Mutex
	used     int64 // bytes counted against limit (memory tier)
	diskUsed int64 // bytes counted against diskLimit
	// peak and diskPeak are the most used and diskUsed have been.
	peak, diskPeak int64
	// sizes holds the size of every file the accounting knows, alloc what each has
	// allocated (extents.go): what it counts against its tier's limit.
	sizes map[string]int64
	alloc map[string]*extents
	// onDiskFiles are the files whose bytes are in the disk tier.
	onDiskFiles map[string]bool
	// Spill (spill.go): which files may move, when each was last opened, what moved.
	spillable    func(rel string) bool
	spillOn      atomic.Bool
	lastUse      map[string]uint64
	useSeq       uint64
	spilledFiles int
	spilledBytes int64
	written      writtenSpill // files being written that may live on disk (spill.go)
	nsMu         sync.RWMutex // moves hold it; every name change of the store shares it
	// renameMu makes a rename's name change and accounting move one step for Remove:
	// Files.Rename holds it across both, Remove shares it across its unlink and forget,
	// so that the unlink of a name a rename has just moved away (ENOENT, whose
	// accounting Remove drops) never drops what the rename is about to move, and the
	// forget after an unlink never drops what a rename has just moved onto the name.
	renameMu sync.RWMutex
	// renamed, if set (tests), runs in Files.Rename between the store's rename and the
	// accounting move.
	renamed func()
	// punched holds, per file, the bytes from offset 0 freed by Punch: they count no more.
	punched map[string]int64
	freed   chan struct{}
}

// Options configure a Store.
type Options struct {
	// Limit is the most bytes the store's files may allocate (extents.go: what they
	// wrote or fallocated; holes, as a truncation that extends a file makes, count
	// nothing); 0 means no limit beyond the underlying file system's.
	Limit int64
	// SpaceWait bounds how long a write that would exceed Limit waits for space to be
	// freed before it fails with ErrNoSpace. 0 fails at once.
	SpaceWait time.Duration
	// Owners, when set, is how the store keeps the owners views report; nil probes the
	// directory (ProbeOwners).
	Owners *Owners
	// Disk, when set, is the directory of the store's disk tier (tier.go): the files
	// created at the paths OnDisk accepts are kept there. DiskLimit bounds the bytes it
	// holds as Limit bounds the memory tier's (0: only its file system's size).
	Disk      string
	DiskLimit int64
	OnDisk    func(rel string) bool
}

// New opens (creating it if needed, mode 0777 as an emptyDir) the store directory dir.
// What files already in it have allocated (their data, SEEK_DATA) counts towards the
// limit.
//
// With Options.Disk, the disk tier's directory is opened (created) too. Errors name the
// directory.
func New(dir string, opts Options) (*Store, error) {
	mem, err := openTier(dir, false)
	if err != nil {
		return nil, err
	}
	s := &Store{mem: mem, limit: opts.Limit, spaceWait: opts.SpaceWait, sizes: map[string]int64{}, alloc: map[string]*extents{},
		punched: map[string]int64{}, onDiskFiles: map[string]bool{}, lastUse: map[string]uint64{}, freed: make(chan struct{})}
	if opts.Owners != nil {
		s.owners = *opts.Owners
	} else {
		chown, _ := capability.Effective(capability.Chown)
		if s.owners, err = ProbeOwners(mem.dir, chown); err != nil {
			mem.close()
			return nil, fmt.Errorf("node store %s: %w", mem.dir, err)
		}
	}
	if opts.Disk != "" {
		if s.dsk, err = openTier(opts.Disk, true); err != nil {
			mem.close()
			return nil, err
		}
		s.onDisk, s.diskLimit = opts.OnDisk, opts.DiskLimit
	}
	for _, t := range []*tier{s.mem, s.dsk} {
		if t == nil {
			continue
		}
		err = filepath.WalkDir(t.dir, func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !d.Type().IsRegular() {
				return err
			}
			info, err := d.Info()
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(t.dir, p)
			rel = filepath.ToSlash(rel)
			e, err := scanExtents(p, info.Size())
			if err != nil {
				return err
			}
			s.sizes[rel], s.alloc[rel] = info.Size(), e
			if t.disk {
				s.onDiskFiles[rel] = true
				s.diskUsed += e.total()
			} else {
				s.used += e.total()
			}
			return nil
		})
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("scanning node store %s: %w", t.dir, err)
		}
	}
	return s, nil
}

// Close releases the store's root descriptors once no operation in progress uses them;
// the files stay. A long-lived process calls it when it is done with the store, after
// every view over it: a descriptor kept open would keep a detached memory tier's tmpfs,
// and every byte in it, alive. An operation after Close fails with an error wrapping
// os.ErrClosed. Close is idempotent.
func (s *Store) Close() error {
	var err error
	s.closeOnce.Do(func() {
		if s.dsk != nil {
			s.dsk.close()
		}
		err = s.mem.close()
	})
	return err
}

// Dir returns the store's absolute directory (its memory tier's).
func (s *Store) Dir() string { return s.mem.dir }

// Path returns the absolute path in the store of the cleaned volume path rel, in the tier
// that holds it (the memory tier's when none does). It refuses (ErrDotDot etc., from
// pathpattern.Clean) anything that could leave the store.
func (s *Store) Path(rel string) (string, error) {
	c, err := pathpattern.Clean(rel)
	if err != nil {
		return "", err
	}
	t := s.locate(c)
	if c == "." {
		return t.dir, nil
	}
	return filepath.Join(t.dir, filepath.FromSlash(c)), nil
}

// Limit returns the size limit in bytes (0: none).
func (s *Store) Limit() int64 { return s.limit }

// Used returns the bytes accounted to files in the store's memory tier.
func (s *Store) Used() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.used
}

// reserveUpTo accounts for file rel being written from its start up to end: every byte
// before end that is not counted yet, except those Punch released, is counted before it
// is written (a writer that writes a file in order, from offset 0). ReserveAt counts only
// the range it is given. See ReserveAt for the wait and the error.
func (s *Store) reserveUpTo(ctx context.Context, rel string, end int64) error {
	_, err := s.reserve(ctx, rel, -1, end, true)
	return err
}

// ReserveAt accounts for the bytes [off, end) of file rel, before they are written,
// against the limit of the tier that holds it: the bytes of that range the file has not
// allocated yet count (a write into a hole, as a truncation that extended the file left
// it, allocates). The file's size grows to end. If that would exceed the limit it
// waits up to the store's SpaceWait (and at most until ctx is done) for space to be
// freed, then fails with ErrNoSpace naming the tier, leaving the accounting unchanged:
// nothing is half-written.
//
// A writer reserves through Files.WriteAt, which also writes and tells. ReserveAt is for
// the transport's fetcher, which stores bytes the file state knows already (written on
// another node: no event) with its own write, keeping the file's modification time.
func (s *Store) ReserveAt(ctx context.Context, rel string, off, end int64) error {
	_, err := s.reserve(ctx, rel, off, end, true)
	return err
}

// reserve counts the range [off, end) of rel (off < 0: from what Punch released) as
// allocated, growing the recorded size to end when grow is set, and returns the ranges it
// added (for unreserve).
func (s *Store) reserve(ctx context.Context, rel string, off, end int64, grow bool) ([]span, error) {
	var deadline <-chan time.Time
	for {
		s.mu.Lock()
		from := off
		if from < 0 {
			from = s.punched[rel]
		}
		e := s.extentsLocked(rel)
		gaps := e.gaps(from, end)
		var need int64
		for _, g := range gaps {
			need += g.end - g.off
		}
		if need == 0 {
			if grow && end > s.sizes[rel] {
				s.sizes[rel] = end
			}
			s.mu.Unlock()
			return nil, nil
		}
		disk := s.onDiskLocked(rel)
		used, limit := &s.used, s.limit
		if disk {
			used, limit = &s.diskUsed, s.diskLimit
		}
		if limit <= 0 || *used+need <= limit {
			for _, g := range gaps {
				e.add(g.off, g.end)
			}
			if grow && end > s.sizes[rel] {
				s.sizes[rel] = end
			}
			*used += need
			if disk && (s.onDisk == nil || !s.onDisk(rel)) {
				s.spilledBytes += need // a file in the disk tier because memory was full (spill.go)
			}
			s.peak, s.diskPeak = max(s.peak, s.used), max(s.diskPeak, s.diskUsed)
			s.mu.Unlock()
			return gaps, nil
		}
		freed := s.freed
		had := *used
		spill := !disk && s.spillable != nil
		s.mu.Unlock()
		if spill && s.spill(need-(limit-had), rel) > 0 {
			continue // files moved to the disk tier: look again
		}
		if deadline == nil {
			if s.spaceWait <= 0 {
				return nil, fmt.Errorf("%s needs %d more bytes, %d of the %s's %d used%s: %w", rel, need, had, tierName(disk), limit, s.spillNote(disk, spill), ErrNoSpace)
			}
			t := time.NewTimer(s.spaceWait)
			defer t.Stop()
			deadline = t.C
		}
		select {
		case <-freed:
		case <-deadline:
			return nil, fmt.Errorf("%s needs %d more bytes, %d of the %s's %d used after waiting %s%s: %w", rel, need, had, tierName(disk), limit, s.spaceWait, s.spillNote(disk, spill), ErrNoSpace)
		case <-ctx.Done():
			return nil, fmt.Errorf("%s waiting for space: %w", rel, ctx.Err())
		}
	}
}

// unreserve takes back the ranges a reserve of rel added, whose bytes were not
// allocated after all.
func (s *Store) unreserve(rel string, added []span) {
	if len(added) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.freeLocked(rel, added)
}

// freeLocked takes the ranges out of rel's extents and its tier's count.
func (s *Store) freeLocked(rel string, ranges []span) {
	e := s.alloc[rel]
	var freed int64
	for _, r := range ranges {
		freed += e.remove(r.off, r.end)
	}
	if freed > 0 {
		s.countLocked(rel, -freed)
		s.wakeLocked()
	}
}

// extentsLocked returns rel's extents, made (empty, size 0) if the accounting did not
// know the file.
func (s *Store) extentsLocked(rel string) *extents {
	e := s.alloc[rel]
	if e == nil {
		e = &extents{}
		s.alloc[rel] = e
		if _, ok := s.sizes[rel]; !ok {
			s.sizes[rel] = 0
		}
	}
	return e
}

// Fallocate is fallocate(2) of the store file fd, which is rel, with the accounting:
// mode 0 and FALLOC_FL_ZERO_RANGE allocate the range (growing the file), with
// FALLOC_FL_KEEP_SIZE they allocate it without changing the size; the range is reserved
// first, as a write's is (ReserveAt), and released again if the call fails.
// FALLOC_FL_PUNCH_HOLE|FALLOC_FL_KEEP_SIZE frees it. Other modes (collapse, insert,
// unshare) fail with EOPNOTSUPP, as tmpfs's do.
func (s *Store) Fallocate(ctx context.Context, rel string, fd int, mode uint32, off, length int64) error {
	if off < 0 || length <= 0 {
		return &os.PathError{Op: "fallocate", Path: rel, Err: unix.EINVAL}
	}
	if off > math.MaxInt64-length {
		return &os.PathError{Op: "fallocate", Path: rel, Err: unix.EFBIG}
	}
	end := off + length
	switch mode {
	case 0, unix.FALLOC_FL_KEEP_SIZE, unix.FALLOC_FL_ZERO_RANGE, unix.FALLOC_FL_ZERO_RANGE | unix.FALLOC_FL_KEEP_SIZE:
		added, err := s.reserve(ctx, rel, off, end, mode&unix.FALLOC_FL_KEEP_SIZE == 0)
		if err != nil {
			return err
		}
		if err := unix.Fallocate(fd, mode, off, length); err != nil {
			s.unreserve(rel, added)
			return &os.PathError{Op: "fallocate", Path: rel, Err: err}
		}
		return nil
	case unix.FALLOC_FL_PUNCH_HOLE | unix.FALLOC_FL_KEEP_SIZE:
		if err := unix.Fallocate(fd, mode, off, length); err != nil {
			return &os.PathError{Op: "fallocate", Path: rel, Err: err}
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		s.freeLocked(rel, []span{{off, end}})
		return nil
	default:
		return &os.PathError{Op: "fallocate", Path: rel, Err: unix.EOPNOTSUPP}
	}
}

// resize records that rel now has size bytes (a truncate): a file that shrinks frees
// what it had allocated past its new end; one that grows allocates nothing (the new bytes
// are a hole, until written).
func (s *Store) resize(rel string, size int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old, known := s.sizes[rel]
	s.sizes[rel] = size
	if s.punched[rel] > size {
		s.punched[rel] = size
	}
	if known && size < old {
		s.freeLocked(rel, []span{{size, math.MaxInt64}})
	}
}

// recount adds to rel's extents what the store file open as fd holds as data (SEEK_DATA,
// SEEK_HOLE) and records its size: for bytes written to it without a reservation (a
// passthrough write, which the kernel makes by itself). What was counted stays counted.
// It moves fd's offset.
func (s *Store) recount(rel string, fd int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return &os.PathError{Op: "fstat", Path: rel, Err: err}
	}
	spans, err := dataSpans(fd, st.Size)
	if err != nil {
		return &os.PathError{Op: "lseek", Path: rel, Err: err}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.extentsLocked(rel)
	var added int64
	for _, sp := range spans {
		added += e.add(sp.off, sp.end)
	}
	s.sizes[rel] = st.Size
	s.countLocked(rel, added)
	s.peak, s.diskPeak = max(s.peak, s.used), max(s.diskPeak, s.diskUsed)
	return nil
}

// scanExtents returns the data of the file at path (of size bytes) as extents.
func scanExtents(path string, size int64) (*extents, error) {
	e := &extents{}
	if size == 0 {
		return e, nil
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	spans, err := dataSpans(fd, size)
	if err != nil {
		return nil, &os.PathError{Op: "lseek", Path: path, Err: err}
	}
	for _, sp := range spans {
		e.add(sp.off, sp.end)
	}
	return e, nil
}

// accountedLocked is what rel counts against the limit: what it has allocated.
func (s *Store) accountedLocked(rel string) int64 { return s.alloc[rel].total() }

// countLocked adds delta bytes to the count of rel's tier.
func (s *Store) countLocked(rel string, delta int64) {
	if s.onDiskLocked(rel) {
		s.diskUsed += delta
	} else {
		s.used += delta
	}
}

// Punch frees the first upto bytes of the regular file rel (fallocate(2)
// FALLOC_FL_PUNCH_HOLE, keeping its size: they read as zeros from then on, and the caller
// must not let anyone read them) and stops counting them against the limit, waking writers
// that wait for space. upto is rounded down to a multiple of 4 KiB pages; a range punched
// already is not punched again. It returns the bytes newly freed.
func (s *Store) Punch(rel string, upto int64) (int64, error) {
	upto &^= 4095
	s.mu.Lock()
	from := s.punched[rel]
	if size := s.sizes[rel]; upto > size {
		upto = size &^ 4095
	}
	s.mu.Unlock()
	if upto <= from {
		return 0, nil
	}
	fd, err := s.Open(rel, unix.O_WRONLY, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	if err := unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, from, upto-from); err != nil {
		return 0, &os.PathError{Op: "punch", Path: rel, Err: err}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if upto <= s.punched[rel] {
		return 0, nil
	}
	s.punched[rel] = upto
	freed := s.alloc[rel].remove(0, upto)
	s.countLocked(rel, -freed)
	s.wakeLocked()
	return freed, nil
}

// Remove unlinks the file (or symlink) rel from the store and stops counting it (unlink,
// then forget), telling nobody: for names no rule sees (a link or a special file a view
// takes back) and for the observers that delete released files; a writer removes with
// Files.Remove. It returns the bytes of its size that Punch had not freed before, or an error
// wrapping os.ErrNotExist when rel was already gone (its accounting is dropped all the
// same: another process sharing the store, such as another sidecar of the node, removed
// it; a rename through this Store is never caught halfway, see renameMu).
func (s *Store) Remove(rel string) (int64, error) {
	s.renameMu.RLock()
	defer s.renameMu.RUnlock()
	var held int64
	if st, err := s.Lstat(rel); err == nil {
		held = st.Size - s.punchedUpTo(rel)
	}
	if err := s.unlink(rel); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			s.forget(rel)
		}
		return 0, err
	}
	s.forget(rel)
	return held, nil
}

// punchedUpTo returns how many bytes from the start of rel Punch has freed.
func (s *Store) punchedUpTo(rel string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.punched[rel]
}

// forget records that rel was removed, freeing its bytes.
func (s *Store) forget(rel string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.forgetLocked(rel)
}

// forgetLocked is forget with s.mu held.
func (s *Store) forgetLocked(rel string) {
	if _, ok := s.sizes[rel]; ok {
		s.countLocked(rel, -s.accountedLocked(rel))
		delete(s.sizes, rel)
		delete(s.alloc, rel)
		delete(s.punched, rel)
		s.wakeLocked()
	}
	delete(s.onDiskFiles, rel)
}

// moveAccounting moves the accounting of oldRel to newRel (replacing what newRel had),
// after renameAt moved the name.
func (s *Store) moveAccounting(oldRel, newRel string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.forgetLocked(newRel)
	s.putLocked(newRel, s.takeLocked(oldRel))
}

// moveTreeAccounting is moveAccounting for a directory, after renameAt moved it: the
// accounting of every file beneath oldRel moves to the same path beneath newRel. What was
// counted beneath newRel is dropped (a directory renamed over another replaces only an
// empty one, so those files were gone already).
func (s *Store) moveTreeAccounting(oldRel, newRel string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.forgetLocked(newRel)
	s.putLocked(newRel, s.takeLocked(oldRel))
	for _, k := range s.beneathLocked(newRel) {
		s.forgetLocked(k)
	}
	for _, k := range s.beneathLocked(oldRel) {
		s.putLocked(newRel+k[len(oldRel):], s.takeLocked(k))
	}
}

// exchangeAccounting swaps the accounting of a and b, after renameAt exchanged the names
// (RENAME_EXCHANGE); with trees (one of them is a directory), that of the files beneath
// them too.
func (s *Store) exchangeAccounting(a, b string, trees bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	swapKeys(s.sizes, a, b)
	swapKeys(s.alloc, a, b)
	swapKeys(s.punched, a, b)
	swapKeys(s.onDiskFiles, a, b)
	if !trees {
		return
	}
	moved := map[string]accounting{}
	for _, k := range s.beneathLocked(a) {
		moved[b+k[len(a):]] = s.takeLocked(k)
	}
	for _, k := range s.beneathLocked(b) {
		moved[a+k[len(b):]] = s.takeLocked(k)
	}
	for k, e := range moved {
		s.putLocked(k, e)
	}
}

// accounting is what the store counts of one file, taken out of its maps to be put back
// under another name (takeLocked, putLocked): its tier's count does not change.
type accounting struct {
	size, punched     int64
	sized, wasPunched bool
	alloc             *extents
	onDisk            bool
}

// takeLocked removes the accounting of rel from the maps, without changing any count.
func (s *Store) takeLocked(rel string) accounting {
	var a accounting
	a.size, a.sized = s.sizes[rel]
	a.punched, a.wasPunched = s.punched[rel]
	a.alloc, a.onDisk = s.alloc[rel], s.onDiskFiles[rel]
	delete(s.sizes, rel)
	delete(s.alloc, rel)
	delete(s.punched, rel)
	delete(s.onDiskFiles, rel)
	return a
}

// putLocked records a under rel, which the maps do not know.
func (s *Store) putLocked(rel string, a accounting) {
	if a.sized {
		s.sizes[rel] = a.size
	}
	if a.alloc != nil {
		s.alloc[rel] = a.alloc
	}
	if a.wasPunched {
		s.punched[rel] = a.punched
	}
	if a.onDisk {
		s.onDiskFiles[rel] = true
	}
}

// beneathLocked returns the paths beneath the directory dir the accounting knows.
func (s *Store) beneathLocked(dir string) []string {
	prefix := dir + "/"
	var keys []string
	for k := range s.sizes {
		if strings.HasPrefix(k, prefix) {
			keys = append(keys, k)
		}
	}
	for k := range s.onDiskFiles {
		if _, counted := s.sizes[k]; !counted && strings.HasPrefix(k, prefix) {
			keys = append(keys, k)
		}
	}
	return keys
}

// swapKeys swaps the entries of keys a and b of m (an absent one stays absent).
func swapKeys[V any](m map[string]V, a, b string) {
	va, oka := m[a]
	vb, okb := m[b]
	delete(m, a)
	delete(m, b)
	if oka {
		m[b] = va
	}
	if okb {
		m[a] = vb
	}
}

func (s *Store) wakeLocked() {
	close(s.freed)
	s.freed = make(chan struct{})
}
