// Package store is a node store: the directory on one node (a tmpfs in production, any
// directory in tests) that holds the bytes of one workflow's files, shared by every pod
// view on that node, with the byte accounting that enforces the volume's size limit.
package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
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
	mem       *tier // every path is resolved beneath a tier's root descriptor (beneath.go)
	dsk       *tier // nil: no disk tier (tier.go)
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
	sizes          map[string]int64
	// onDiskFiles are the files whose bytes are in the disk tier.
	onDiskFiles map[string]bool
	// Spill (spill.go): which files may move, when each was last opened, what moved.
	spillable    func(rel string) bool
	spillOn      atomic.Bool
	lastUse      map[string]uint64
	useSeq       uint64
	spilledFiles int
	spilledBytes int64
	nsMu         sync.RWMutex // moves hold it; every name change of the store shares it
	// punched holds, per file, the bytes from offset 0 freed by Punch: they count no more.
	punched map[string]int64
	freed   chan struct{}
}

// Options configure a Store.
type Options struct {
	// Limit is the most bytes (sum of logical file sizes) the store holds; 0 means no
	// limit beyond the underlying file system's.
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
// Sizes of files already in it count towards the limit.
//
// With Options.Disk, the disk tier's directory is opened (created) too. Errors name the
// directory.
func New(dir string, opts Options) (*Store, error) {
	mem, err := openTier(dir, false)
	if err != nil {
		return nil, err
	}
	s := &Store{mem: mem, limit: opts.Limit, spaceWait: opts.SpaceWait, sizes: map[string]int64{},
		punched: map[string]int64{}, onDiskFiles: map[string]bool{}, lastUse: map[string]uint64{}, freed: make(chan struct{})}
	if opts.Owners != nil {
		s.owners = *opts.Owners
	} else {
		chown, _ := capability.Effective(capability.Chown)
		s.owners = ProbeOwners(mem.dir, chown)
	}
	if opts.Disk != "" {
		if s.dsk, err = openTier(opts.Disk, true); err != nil {
			unix.Close(mem.root)
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
			s.sizes[rel] = info.Size()
			if t.disk {
				s.onDiskFiles[rel] = true
				s.diskUsed += info.Size()
			} else {
				s.used += info.Size()
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

// Close releases the store's root descriptors. The files stay.
func (s *Store) Close() error {
	if s.dsk != nil {
		unix.Close(s.dsk.root)
	}
	return unix.Close(s.mem.root)
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

// Reserve accounts for file rel growing to at least end bytes, before the bytes are
// written, against the limit of the tier that holds it. If that would exceed the limit it
// waits up to the store's SpaceWait (and at most until ctx is done) for space to be
// freed, then fails with ErrNoSpace naming the tier, leaving the accounting unchanged:
// nothing is half-written.
func (s *Store) Reserve(ctx context.Context, rel string, end int64) error {
	var deadline <-chan time.Time
	for {
		s.mu.Lock()
		cur := s.sizes[rel]
		grow := end - cur
		if grow <= 0 {
			s.mu.Unlock()
			return nil
		}
		disk := s.onDiskLocked(rel)
		used, limit := &s.used, s.limit
		if disk {
			used, limit = &s.diskUsed, s.diskLimit
		}
		if limit <= 0 || *used+grow <= limit {
			s.sizes[rel] = end
			*used += grow
			s.peak, s.diskPeak = max(s.peak, s.used), max(s.diskPeak, s.diskUsed)
			s.mu.Unlock()
			return nil
		}
		freed := s.freed
		had := *used
		spill := !disk && s.spillable != nil
		s.mu.Unlock()
		if spill && s.spill(grow-(limit-had), rel) > 0 {
			continue // files moved to the disk tier: look again
		}
		if deadline == nil {
			if s.spaceWait <= 0 {
				return fmt.Errorf("%s needs %d more bytes, %d of the %s's %d used: %w", rel, grow, had, tierName(disk), limit, ErrNoSpace)
			}
			t := time.NewTimer(s.spaceWait)
			defer t.Stop()
			deadline = t.C
		}
		select {
		case <-freed:
		case <-deadline:
			return fmt.Errorf("%s needs %d more bytes, %d of the %s's %d used after waiting %s: %w", rel, grow, had, tierName(disk), limit, s.spaceWait, ErrNoSpace)
		case <-ctx.Done():
			return fmt.Errorf("%s waiting for space: %w", rel, ctx.Err())
		}
	}
}

// Resize records that rel now has size bytes (a truncate); shrinking frees space.
func (s *Store) Resize(rel string, size int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	before := s.accountedLocked(rel)
	s.sizes[rel] = size
	if s.punched[rel] > size {
		s.punched[rel] = size
	}
	delta := s.accountedLocked(rel) - before
	s.countLocked(rel, delta)
	if delta < 0 {
		s.wakeLocked()
	}
}

// accountedLocked is what rel counts against the limit: its size less what was punched.
func (s *Store) accountedLocked(rel string) int64 { return s.sizes[rel] - s.punched[rel] }

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
	freed := upto - s.punched[rel]
	s.punched[rel] = upto
	s.countLocked(rel, -freed)
	s.wakeLocked()
	return freed, nil
}

// Remove unlinks the file rel from the store and stops counting it (Unlink, then
// Forget). It returns the bytes the name held that were still counted (its size less what
// Punch freed before), or an error wrapping os.ErrNotExist when rel was already gone (its
// accounting is dropped all the same).
func (s *Store) Remove(rel string) (int64, error) {
	var held int64
	if st, err := s.Lstat(rel); err == nil {
		held = st.Size - s.Punched(rel)
	}
	if err := s.Unlink(rel); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			s.Forget(rel)
		}
		return 0, err
	}
	s.Forget(rel)
	return held, nil
}

// Punched returns how many bytes from the start of rel Punch has freed.
func (s *Store) Punched(rel string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.punched[rel]
}

// Forget records that rel was removed, freeing its bytes.
func (s *Store) Forget(rel string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.sizes[rel]; ok {
		s.countLocked(rel, -s.accountedLocked(rel))
		delete(s.sizes, rel)
		delete(s.punched, rel)
		s.wakeLocked()
	}
	delete(s.onDiskFiles, rel)
}

// Rename moves the accounting of oldRel to newRel (replacing what newRel had).
func (s *Store) Rename(oldRel, newRel string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.sizes[newRel]; ok {
		s.countLocked(newRel, -s.accountedLocked(newRel))
		delete(s.punched, newRel)
		s.wakeLocked()
	}
	delete(s.onDiskFiles, newRel)
	if s.onDiskFiles[oldRel] {
		s.onDiskFiles[newRel] = true
		delete(s.onDiskFiles, oldRel)
	}
	if size, ok := s.sizes[oldRel]; ok {
		s.sizes[newRel] = size
		delete(s.sizes, oldRel)
		if p, ok := s.punched[oldRel]; ok {
			s.punched[newRel] = p
			delete(s.punched, oldRel)
		}
	}
}

func (s *Store) wakeLocked() {
	close(s.freed)
	s.freed = make(chan struct{})
}
