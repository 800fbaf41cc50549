package transport

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluice-io/sluice/internal/store"
)

// hostState is what the peers of one host know about the host's materialiser: whether
// this peer is it, how far into the stream it has stored every byte and namespace change
// of the other hosts, and which files it could not store.
type hostState interface {
	// Acquire blocks until this peer is the host's materialiser, or ctx is done.
	Acquire(ctx context.Context) error
	// Progress is the stream sequence through which the materialiser has stored
	// everything (0: nothing yet).
	Progress() uint64
	// WaitProgress blocks until Progress() >= seq, or ctx is done.
	WaitProgress(ctx context.Context, seq uint64) error
	// SetProgress records that everything through seq is stored (materialiser only).
	SetProgress(seq uint64) error
	// MarkFailed records that the bytes of p could not be stored, and why.
	MarkFailed(p, reason string) error
	// Failed returns why the bytes of p could not be stored, or "".
	Failed(p string) string
	// Close releases the materialiser role (if held) and stops watching.
	Close()
}

// progressSignal is a monotone sequence with a broadcast on every advance.
type progressSignal struct {
	seq atomic.Uint64
	mu  sync.Mutex
	ch  chan struct{}
}

func newProgressSignal() *progressSignal { return &progressSignal{ch: make(chan struct{})} }

func (s *progressSignal) load() uint64 { return s.seq.Load() }

// advance raises the sequence to seq (never lowers it) and wakes the waiters.
func (s *progressSignal) advance(seq uint64) {
	for {
		cur := s.seq.Load()
		if seq <= cur {
			return
		}
		if s.seq.CompareAndSwap(cur, seq) {
			break
		}
	}
	s.mu.Lock()
	close(s.ch)
	s.ch = make(chan struct{})
	s.mu.Unlock()
}

func (s *progressSignal) wait(ctx context.Context, seq uint64) error {
	for {
		s.mu.Lock()
		ch := s.ch
		s.mu.Unlock()
		if s.seq.Load() >= seq {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("waiting for the host's materialiser to store stream sequence %d (at %d): %w", seq, s.seq.Load(), ctx.Err())
		}
	}
}

// memHost is the state of a host with a single peer (sluice run --nodes): the peer is
// always the materialiser and nothing needs to be shared.
type memHost struct {
	progress *progressSignal
	mu       sync.Mutex
	failed   map[string]string
}

func newMemHost() *memHost {
	return &memHost{progress: newProgressSignal(), failed: map[string]string{}}
}

func (h *memHost) Acquire(context.Context) error { return nil }
func (h *memHost) Progress() uint64              { return h.progress.load() }
func (h *memHost) WaitProgress(ctx context.Context, seq uint64) error {
	return h.progress.wait(ctx, seq)
}
func (h *memHost) SetProgress(seq uint64) error { h.progress.advance(seq); return nil }
func (h *memHost) MarkFailed(p, reason string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.failed[p] = reason
	return nil
}
func (h *memHost) Failed(p string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.failed[p]
}
func (h *memHost) Close() {}

// dirHost is the state of a host whose peers (the sidecars of one workflow's pods on one
// Kubernetes node) share a state directory next to the node store:
//
//	materialiser.lock  flock(2)ed by the materialiser; released when its process dies
//	progress           16 bytes: the sequence and its complement (a torn read is detected)
//	failed/<sha256>    one file per path whose bytes could not be stored: path, reason
//
// Waiters learn of progress through inotify, never by polling.
type dirHost struct {
	dir      string
	dirfd    int // O_PATH descriptor of dir: every file is resolved beneath it
	progress *progressSignal
	pf       *os.File // the progress file, read and (by the materialiser) written

	lockMu sync.Mutex
	lock   *os.File // held while this peer is the materialiser
	closed bool

	watch *os.File      // inotify descriptor, non-blocking (the runtime poller wakes reads); nil: polled
	stop  chan struct{} // closed by Close to end the polling (watch nil)
	done  chan struct{}
}

// progressPoll is how often the progress file is read when the kernel gives no inotify
// watch on it: fs.inotify.max_user_instances and max_user_watches count per user on the
// node, and any pod may run as the sidecars' user and take them all
// (docs/security.md, "One user for every workflow").
const progressPoll = 20 * time.Millisecond

// openDirHost opens (creating it if needed) the host state in dir and starts watching
// the materialiser's progress. Every file of the state is opened beneath dir's descriptor
// with no symlink followed (store.OpenBeneath) and must be a regular file: the directory
// is written by unprivileged sidecars, and the CSI plugin's store server, which runs as
// root, opens the same files.
func openDirHost(dir string) (*dirHost, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("host state directory %s: %w", dir, err)
	}
	dirfd, err := store.OpenDirNoFollow(dir)
	if err != nil {
		return nil, fmt.Errorf("host state directory: %w", err)
	}
	if err := store.MkdirBeneath(dirfd, "failed", 0o755); err != nil {
		unix.Close(dirfd)
		return nil, fmt.Errorf("host state directory %s: %w", dir, err)
	}
	pf, err := store.OpenRegularBeneath(dirfd, "progress", unix.O_CREAT|unix.O_RDWR, 0o644)
	if err != nil {
		unix.Close(dirfd)
		return nil, fmt.Errorf("host progress file in %s: %w", dir, err)
	}
	h := &dirHost{dir: dir, dirfd: dirfd, progress: newProgressSignal(), pf: pf, stop: make(chan struct{}), done: make(chan struct{})}
	if fd, err := watchProgress(pf); err == nil {
		h.watch = os.NewFile(uintptr(fd), "inotify")
	}
	h.reload()
	go h.watchLoop()
	return h, nil
}

// watchProgress returns an inotify descriptor watching the progress file open as pf: the
// inode (its /proc/self/fd link), never a name. It fails when the user's inotify
// instances or watches are used up (EMFILE, ENOSPC).
func watchProgress(pf *os.File) (int, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return -1, fmt.Errorf("inotify: %w", err)
	}
	if _, err := unix.InotifyAddWatch(fd, "/proc/self/fd/"+strconv.Itoa(int(pf.Fd())), unix.IN_MODIFY); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("watching %s: %w", pf.Name(), err)
	}
	return fd, nil
}

// reload reads the progress file and advances the in-memory signal.
func (h *dirHost) reload() {
	var b [16]byte
	for i := 0; i < 8; i++ {
		n, _ := h.pf.ReadAt(b[:], 0)
		if n < 16 {
			return // never written
		}
		v, check := binary.LittleEndian.Uint64(b[:8]), binary.LittleEndian.Uint64(b[8:])
		if v == ^check {
			h.progress.advance(v)
			return
		}
		// torn read of a write in progress: read again
	}
}

func (h *dirHost) watchLoop() {
	defer close(h.done)
	if h.watch == nil {
		t := time.NewTicker(progressPoll)
		defer t.Stop()
		for {
			select {
			case <-h.stop:
				return
			case <-t.C:
				h.reload()
			}
		}
	}
	buf := make([]byte, 4096)
	for {
		if _, err := h.watch.Read(buf); err != nil {
			return // closed
		}
		h.reload()
	}
}

// materialiserLock is the file of a host's state directory its materialiser holds.
const materialiserLock = "materialiser.lock"

// HostJoined reports whether a peer has joined the host whose state directory is dir:
// the first peer of a host makes its materialiser lock there when it joins (Config.StateDir),
// and the file stays after the peer ends.
func HostJoined(dir string) bool {
	st, err := os.Lstat(filepath.Join(dir, materialiserLock))
	return err == nil && st.Mode().IsRegular()
}

func (h *dirHost) Acquire(ctx context.Context) error {
	f, err := store.OpenRegularBeneath(h.dirfd, materialiserLock, unix.O_CREAT|unix.O_RDWR, 0o644)
	if err != nil {
		return fmt.Errorf("materialiser lock in %s: %w", h.dir, err)
	}
	got := make(chan error, 1)
	go func() { got <- unix.Flock(int(f.Fd()), unix.LOCK_EX) }()
	select {
	case err := <-got:
		if err != nil {
			f.Close()
			return fmt.Errorf("locking %s: %w", f.Name(), err)
		}
	case <-ctx.Done():
		// The flock may still succeed later: release it then.
		go func() { <-got; f.Close() }()
		return ctx.Err()
	}
	h.lockMu.Lock()
	defer h.lockMu.Unlock()
	if h.closed {
		f.Close()
		return errors.New("host state closed")
	}
	h.lock = f
	// What the previous materialiser stored is on record; take it as the start.
	h.reload()
	return nil
}

func (h *dirHost) Progress() uint64 { return h.progress.load() }

func (h *dirHost) WaitProgress(ctx context.Context, seq uint64) error {
	return h.progress.wait(ctx, seq)
}

func (h *dirHost) SetProgress(seq uint64) error {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], seq)
	binary.LittleEndian.PutUint64(b[8:], ^seq)
	if _, err := h.pf.WriteAt(b[:], 0); err != nil {
		return fmt.Errorf("recording materialiser progress %d: %w", seq, err)
	}
	h.progress.advance(seq)
	return nil
}

func failedName(p string) string {
	sum := sha256.Sum256([]byte(p))
	return hex.EncodeToString(sum[:])
}

// MarkFailed writes failed/<sha256>.tmp, created anew (O_CREAT|O_EXCL: whatever was at
// that name, a planted symlink included, is removed first and never opened), then renames
// it over failed/<sha256> (rename replaces a symlink there, never its target).
func (h *dirHost) MarkFailed(p, reason string) error {
	name := failedName(p)
	tmp := name + ".tmp"
	failed, err := store.OpenBeneath(h.dirfd, "failed", unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return fmt.Errorf("recording that %s could not be stored: %w", p, err)
	}
	defer unix.Close(failed)
	var f *os.File
	for try := 0; ; try++ {
		f, err = store.OpenRegularBeneath(failed, tmp, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY, 0o644)
		if err == nil || !errors.Is(err, unix.EEXIST) || try == 1 {
			break
		}
		if err := unix.Unlinkat(failed, tmp, 0); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("recording that %s could not be stored: removing failed/%s: %w", p, tmp, err)
		}
	}
	if err != nil {
		return fmt.Errorf("recording that %s could not be stored: %w", p, err)
	}
	_, err = f.Write([]byte(p + "\n" + reason))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(failed, tmp, failed, name)
	}
	if err != nil {
		_ = unix.Unlinkat(failed, tmp, 0)
		return fmt.Errorf("recording that %s could not be stored: %w", p, err)
	}
	return nil
}

func (h *dirHost) Failed(p string) string {
	f, err := store.OpenRegularBeneath(h.dirfd, "failed/"+failedName(p), unix.O_RDONLY, 0)
	if err != nil {
		return ""
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 64<<10))
	if err != nil {
		return ""
	}
	path, reason, ok := strings.Cut(string(b), "\n")
	if !ok || path != p {
		return ""
	}
	return reason
}

func (h *dirHost) Close() {
	h.lockMu.Lock()
	if h.closed {
		h.lockMu.Unlock()
		return
	}
	h.closed = true
	if h.lock != nil {
		h.lock.Close() // releases the flock
		h.lock = nil
	}
	h.lockMu.Unlock()
	if h.watch != nil {
		h.watch.Close()
	}
	close(h.stop)
	<-h.done
	h.pf.Close()
	unix.Close(h.dirfd)
}
