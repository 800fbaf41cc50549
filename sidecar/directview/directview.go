// Package directview serves a pod's Sluice volume in direct mode, for clusters where pods
// cannot use FUSE: the app containers see a plain directory of the node's tmpfs (the CSI
// node plugin bind-mounts it), and the pod's sidecar keeps that directory and the
// workflow's node store in step with inotify.
//
// What the app writes is ingested: when a file the step may write (an output, or a path no
// rule governs) is closed after writing (IN_CLOSE_WRITE), the bytes appended since the
// last close are copied into the node store and reported to the semantics engine and the
// transport as a FUSE view would report them (Create, Write, Close), so the CAPIO-CL
// commit rules, streaming to other pods and permanent outputs work unchanged.
//
// What others commit is placed: when the engine commits a file this pod did not write, it
// is copied from the node store into the directory, read-only (never hard-linked: the app
// could write the store's bytes through a link), so an app sees a governed file
// only once it is committed (commit-gated visibility). There are no blocking opens or
// reads: an app that opens a file before its commit gets ENOENT, as on any directory, and
// must wait for it itself (for example by polling). A file's bytes become visible to
// other pods at each close, not at each write, and a file must be written sequentially:
// bytes rewritten below the length already ingested are not seen unless the file also
// shrank (then it is ingested again from the start).
package directview

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"

	"github.com/sluice-io/sluice/internal/filestate"
	"github.com/sluice-io/sluice/internal/pathpattern"
	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/store"
)

// Semantics is what a direct view reports the app's writes to and asks about paths: the
// semantics engine, or the transport peer that wraps it (which also implements
// filestate.DataSink and publishes the bytes). The events of store.Events reach it
// through the view's store.Files, with the bytes and names they describe.
type Semantics interface {
	store.Events
	Rules() *semantics.RuleSet
	Close(p string) error
	Status(p string) semantics.FileStatus
}

// Options configure a direct view.
type Options struct {
	// Step and Instance identify the step instance whose app writes the directory; the
	// step decides which paths are ingested (those it may write, semantics.RuleSet.MayWrite).
	Step     string
	Instance int // 0-based
	// Log receives one line per file ingested or placed at V(1), and every failure.
	Log logr.Logger
}

// Stats count what a direct view did. Byte counts are in bytes.
type Stats struct {
	// BytesIngested are bytes of the app's files copied into the node store.
	BytesIngested int64
	// FilesPlaced counts committed files of other pods copied into the directory.
	FilesPlaced int64
	// Errors counts files that could not be ingested or placed (each is logged).
	Errors int64
}

// tmpPrefix names the view's own temporary entries in the directory, which it ignores.
const tmpPrefix = ".sluice-"

// chunk is the copy unit of ingestion in bytes: the transport's largest data message.
const chunk = 1 << 20

// watchMask is what the view watches in each directory of the tree.
const watchMask = unix.IN_CREATE | unix.IN_CLOSE_WRITE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO |
	unix.IN_DELETE | unix.IN_EXCL_UNLINK | unix.IN_ONLYDIR

// output is an app file the view ingests.
type output struct {
	ingested int64 // bytes copied into the store, from offset 0
	closes   int   // closes seen (IN_CLOSE_WRITE)
}

// View keeps one pod's direct-mode directory and the workflow's node store in step. Its
// state is owned by the goroutine run starts; Committed and Sync talk to it through
// channels.
type View struct {
	dir   string
	dirfd int // O_PATH descriptor of dir: every path of the app's is resolved beneath it
	store *store.Store
	sem   Semantics
	files *store.Files      // writes to the store, told to sem (set by Start)
	fetch filestate.Fetcher // nil when every byte is written on this node
	rules *semantics.RuleSet
	opts  Options
	log   logr.Logger

	ino     *os.File
	watches map[int32]string   // watch descriptor -> directory, relative ("." for the root)
	outputs map[string]*output // app files being ingested, by relative path
	placed  map[string]bool    // paths the view created in the directory (files and directories)
	refused map[string]bool    // app files the step may not write, logged once
	// fetching are committed files written on other nodes whose bytes are being
	// fetched before they are placed.
	fetching map[string]bool

	qmu     sync.Mutex
	queue   []string      // committed paths to place
	qsignal chan struct{} // capacity 1: the queue grew
	syncReq chan chan error
	markers map[string]chan error // sync barriers in flight, by marker file name
	nmarker int
	done    chan struct{}
	wg      sync.WaitGroup

	bytesIngested, filesPlaced, errors atomic.Int64
}

// New prepares a direct view of dir (the pod's directory) over store st. It watches dir at once, so nothing the app writes after New
// returns is missed, and queues commits (Committed) from then on; both are handled once
// Start is called. Errors: dir missing or inotify unavailable (EMFILE when the user's
// inotify instance limit is reached).
func New(dir string, st *store.Store, opts Options) (*View, error) {
	if opts.Log.GetSink() == nil {
		opts.Log = logr.Discard()
	}
	dirfd, err := store.OpenDirNoFollow(dir)
	if err != nil {
		return nil, fmt.Errorf("the direct volume: %w", err)
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		unix.Close(dirfd)
		return nil, fmt.Errorf("inotify for the direct volume %s: %w", dir, err)
	}
	v := &View{
		dir: dir, dirfd: dirfd, store: st, opts: opts, log: opts.Log,
		// A non-blocking descriptor in an *os.File uses the runtime's poller: Read parks
		// the goroutine and Close wakes it.
		ino:     os.NewFile(uintptr(fd), "inotify"),
		watches: map[int32]string{}, outputs: map[string]*output{}, placed: map[string]bool{}, refused: map[string]bool{},
		markers: map[string]chan error{},
		qsignal: make(chan struct{}, 1), syncReq: make(chan chan error), done: make(chan struct{}),
	}
	if err := v.watch("."); err != nil {
		v.ino.Close()
		unix.Close(dirfd)
		return nil, err
	}
	return v, nil
}

// Committed is the engine's commit callback (semantics.Observer.Commit): it queues the
// committed path to be placed in the directory. It never blocks.
func (v *View) Committed(fs semantics.FileStatus) { v.enqueue(fs.Path) }

// enqueue queues path p to be placed; it never blocks.
func (v *View) enqueue(p string) {
	v.qmu.Lock()
	v.queue = append(v.queue, p)
	v.qmu.Unlock()
	select {
	case v.qsignal <- struct{}{}:
	default:
	}
}

// Start handles the app's writes, reporting them to sem, and the workflow's commits until
// Stop. Files already in the directory (written before New) are ingested without a
// close: their closes were not seen, so Sync counts one for each at the end.
func (v *View) Start(sem Semantics) {
	v.sem, v.rules = sem, sem.Rules()
	v.files = v.store.Files(sem)
	v.fetch, _ = sem.(filestate.Fetcher)
	v.fetching = map[string]bool{}
	events := make(chan []byte)
	v.wg.Add(2)
	go func() {
		defer v.wg.Done()
		defer close(events)
		buf := make([]byte, 64<<10)
		for {
			n, err := v.ino.Read(buf)
			if err != nil {
				if !errors.Is(err, os.ErrClosed) {
					v.log.Error(err, "reading inotify events; the direct volume is no longer ingested")
				}
				return
			}
			b := append([]byte(nil), buf[:n]...)
			select {
			case events <- b:
			case <-v.done:
				return
			}
		}
	}()
	go func() {
		defer v.wg.Done()
		v.scan(".")
		for {
			select {
			case b, ok := <-events:
				if !ok {
					events = nil
					continue
				}
				v.handle(b)
			case <-v.qsignal:
				v.placeQueued()
			case reply := <-v.syncReq:
				v.barrier(reply)
			case <-v.done:
				return
			}
		}
	}()
}

// Sync is called once the app containers have exited: it ingests everything the app
// wrote that is not ingested yet (files written through mmap, or whose close was missed)
// and counts one close of each output whose close the view never saw, so its commit rule
// can hold. It returns the first failure, or ctx's error.
func (v *View) Sync(ctx context.Context) error {
	reply := make(chan error, 1)
	select {
	case v.syncReq <- reply:
	case <-ctx.Done():
		return fmt.Errorf("syncing the direct volume: %w", ctx.Err())
	case <-v.done:
		return errors.New("syncing the direct volume: the view is stopped")
	}
	select {
	case err := <-reply:
		return err
	case <-ctx.Done():
		return fmt.Errorf("syncing the direct volume: %w", ctx.Err())
	}
}

// Stop stops handling events; the directory is left as it is (the CSI node plugin removes
// it when the volume is unpublished).
func (v *View) Stop() {
	select {
	case <-v.done:
		return
	default:
	}
	close(v.done)
	v.ino.Close()
	v.wg.Wait()
	unix.Close(v.dirfd)
}

// Stats returns the view's counters.
func (v *View) Stats() Stats {
	return Stats{BytesIngested: v.bytesIngested.Load(), FilesPlaced: v.filesPlaced.Load(), Errors: v.errors.Load()}
}

// abs returns the directory's path of the relative path rel.
func (v *View) abs(rel string) string { return filepath.Join(v.dir, filepath.FromSlash(rel)) }

// The app writes the directory, and may replace any entry with a symlink (to the
// sidecar's credentials, to the node store): every path is resolved beneath the
// directory's descriptor with no symlink followed (store.OpenBeneath), and the view acts
// on the descriptors it gets.

// open opens rel beneath the directory with open(2) flags, following no symlink.
func (v *View) open(rel string, flags int) (int, error) {
	if rel == "." || rel == "" {
		return unix.Openat(v.dirfd, ".", flags|unix.O_CLOEXEC, 0)
	}
	return store.OpenBeneath(v.dirfd, rel, flags, 0)
}

// exists reports whether rel is in the directory (a symlink there counts: it is the
// app's).
func (v *View) exists(rel string) bool {
	parent, name := pathpattern.Parent(rel), rel[strings.LastIndexByte(rel, '/')+1:]
	pfd, err := v.open(parent, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return false
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	return unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil
}

// watch adds an inotify watch on directory rel.
func (v *View) watch(rel string) error {
	fd, err := v.open(rel, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return fmt.Errorf("watching %s: %w", v.abs(rel), err)
	}
	defer unix.Close(fd)
	// Not v.ino.Fd(), which races with Stop's Close of the descriptor (go test -race saw
	// it): Control holds a reference on the descriptor for the call.
	rc, err := v.ino.SyscallConn()
	if err != nil {
		return fmt.Errorf("watching %s: %w", v.abs(rel), err)
	}
	var wd int
	if cerr := rc.Control(func(ino uintptr) {
		wd, err = unix.InotifyAddWatch(int(ino), "/proc/self/fd/"+strconv.Itoa(fd), watchMask)
	}); cerr != nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("watching %s: %w", v.abs(rel), err)
	}
	v.watches[int32(wd)] = rel
	return nil
}

// handle handles one read of inotify events.
func (v *View) handle(b []byte) {
	for len(b) >= unix.SizeofInotifyEvent {
		// struct inotify_event: int wd; uint32 mask, cookie, len; char name[len].
		ev := struct {
			Wd   int32
			Mask uint32
		}{int32(binary.NativeEndian.Uint32(b[0:])), binary.NativeEndian.Uint32(b[4:])}
		end := unix.SizeofInotifyEvent + int(binary.NativeEndian.Uint32(b[12:]))
		if end > len(b) {
			return
		}
		name := strings.TrimRight(string(b[unix.SizeofInotifyEvent:end]), "\x00")
		b = b[end:]
		if ev.Mask&unix.IN_Q_OVERFLOW != 0 {
			v.log.Info("inotify queue overflowed; rescanning the direct volume")
			v.scan(".")
			continue
		}
		parent, ok := v.watches[ev.Wd]
		if ev.Mask&unix.IN_IGNORED != 0 {
			delete(v.watches, ev.Wd)
			continue
		}
		if reply, ok := v.markers[name]; ok && parent == "." && ev.Mask&unix.IN_CREATE != 0 {
			// Every event before the marker's creation has been handled.
			delete(v.markers, name)
			reply <- v.sync()
			continue
		}
		if !ok || name == "" || strings.HasPrefix(name, tmpPrefix) {
			continue
		}
		created := ev.Mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0
		rel := name
		if parent != "." {
			rel = parent + "/" + name
		}
		isDir := ev.Mask&unix.IN_ISDIR != 0
		if created && v.placed[rel] {
			continue // the view's own link, copy or directory
		}
		switch {
		case ev.Mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0 && isDir:
			v.dirCreated(rel)
		case ev.Mask&unix.IN_CREATE != 0:
			v.fileCreated(rel)
		case ev.Mask&unix.IN_CLOSE_WRITE != 0:
			v.fileCreated(rel) // a no-op unless its creation was missed
			v.ingest(rel, true)
		case ev.Mask&unix.IN_MOVED_TO != 0:
			// A file renamed into the tree counts as created, written and closed once,
			// as the engine counts a rename (the write-then-rename idiom).
			v.removed(rel)
			v.fileCreated(rel)
			v.ingest(rel, true)
		case ev.Mask&(unix.IN_DELETE|unix.IN_MOVED_FROM) != 0:
			v.removed(rel)
		}
	}
}

// mayIngest reports whether the app's file rel is one the view ingests, logging once a
// governed path the step may not write (it stays in this pod's directory only).
func (v *View) mayIngest(rel string) bool {
	if v.placed[rel] {
		return false
	}
	if v.rules.MayWrite(v.opts.Step, rel) {
		return true
	}
	if !v.refused[rel] {
		v.refused[rel] = true
		v.log.Info("the app wrote a file its step does not declare as an output; it stays in this pod's directory",
			"path", rel, "step", v.opts.Step, "instance", v.opts.Instance)
	}
	return false
}

// dirCreated starts watching a directory the app created (or moved in), records it, and
// handles what it already holds.
func (v *View) dirCreated(rel string) {
	if v.placed[rel] {
		return
	}
	if err := v.watch(rel); err != nil {
		v.fail(err, "watching a directory the app created", rel)
		return
	}
	if v.mayIngest(rel) {
		if err := v.store.MkdirAll(rel); err != nil {
			v.fail(err, "creating a directory in the node store", rel)
		}
		_ = v.sem.Create(rel, true)
	}
	v.scan(rel)
}

// fileCreated records the creation of the app's file rel.
func (v *View) fileCreated(rel string) {
	if !v.mayIngest(rel) {
		return
	}
	if _, ok := v.outputs[rel]; ok {
		return
	}
	if s := v.sem.Status(rel); s.Governed() && s.Committed {
		v.fail(semantics.ErrCommitted, "the app created a file that is already committed", rel)
		return
	}
	if err := v.store.MkdirAll(pathpattern.Parent(rel)); err != nil {
		v.fail(err, "creating a directory in the node store", rel)
		return
	}
	f, err := v.files.Create(rel)
	if err != nil {
		v.fail(err, "creating a file in the node store", rel)
		return
	}
	f.Close()
	v.outputs[rel] = &output{}
}

// scan walks directory rel: new subdirectories are watched, files not seen yet recorded
// and ingested (without a close), files seen before ingested up to their current size.
func (v *View) scan(rel string) {
	var entries []os.DirEntry
	fd, err := v.open(rel, unix.O_RDONLY|unix.O_DIRECTORY)
	if err == nil {
		d := os.NewFile(uintptr(fd), v.abs(rel))
		entries, err = d.ReadDir(-1)
		d.Close()
	}
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			v.fail(err, "listing a directory of the direct volume", rel)
		}
		return
	}
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, tmpPrefix) {
			continue
		}
		child := name
		if rel != "." {
			child = rel + "/" + name
		}
		switch {
		case e.IsDir():
			if !v.watching(child) {
				v.dirCreated(child)
			} else {
				v.scan(child)
			}
		case e.Type().IsRegular():
			v.fileCreated(child)
			v.ingest(child, false)
		}
	}
}

// watching reports whether directory rel is watched.
func (v *View) watching(rel string) bool {
	for _, r := range v.watches {
		if r == rel {
			return true
		}
	}
	return false
}

// ingest copies the bytes of the app's file rel appended since the last ingestion into
// the node store, reporting them (Write, and to the sink), then one close if closed.
func (v *View) ingest(rel string, closed bool) {
	out, ok := v.outputs[rel]
	if !ok {
		return
	}
	if s := v.sem.Status(rel); s.Governed() && s.Committed {
		if closed {
			v.log.Info("the app wrote a file after its commit; the change stays in this pod's directory", "path", rel)
		}
		return
	}
	src, err := store.OpenRegularBeneath(v.dirfd, rel, unix.O_RDONLY, 0)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) { // removed since: its IN_DELETE follows
			v.fail(err, "opening the app's file", rel)
		}
		return
	}
	defer src.Close()
	info, err := src.Stat()
	if err != nil {
		v.fail(err, "reading the app's file", rel)
		return
	}
	dst, err := v.store.OpenFile(rel, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		v.fail(err, "opening the node store's copy", rel)
		return
	}
	defer dst.Close()
	size := info.Size()
	if size < out.ingested {
		// The file shrank: it was rewritten. Ingest it again from the start.
		if err := v.files.Truncate(rel, int(dst.Fd()), 0); err != nil {
			v.fail(err, "truncating the node store's copy", rel)
			return
		}
		out.ingested = 0
	}
	buf := make([]byte, min(int64(chunk), max(size-out.ingested, 1)))
	for out.ingested < size {
		n, err := src.ReadAt(buf[:min(int64(len(buf)), size-out.ingested)], out.ingested)
		if n == 0 && err != nil {
			if !errors.Is(err, io.EOF) { // EOF: truncated since the stat
				v.fail(err, "reading the app's file", rel)
			}
			break
		}
		// Reserve, write, tell the engine and the transport (store.Files.WriteAt).
		if _, err := v.files.WriteAt(context.Background(), rel, int(dst.Fd()), buf[:n], out.ingested); err != nil {
			var refused *store.ReserveError
			if errors.As(err, &refused) {
				v.fail(err, "ingesting the app's file", rel)
			} else {
				v.fail(err, "writing the node store's copy", rel)
			}
			return
		}
		out.ingested += int64(n)
		v.bytesIngested.Add(int64(n))
	}
	if closed {
		out.closes++
		_ = v.sem.Close(rel)
	}
	v.log.V(1).Info("ingested", "path", rel, "bytes", out.ingested, "closed", closed)
}

// removed handles the app unlinking (or renaming away) rel: an output not committed yet is
// removed from the node store and the engine (from the engine and the store's accounting
// even when the store's copy cannot be unlinked); a committed one stays (its readers' view is
// immutable); a placed file is forgotten.
func (v *View) removed(rel string) {
	if v.placed[rel] {
		delete(v.placed, rel)
		return
	}
	if _, ok := v.outputs[rel]; !ok {
		return
	}
	delete(v.outputs, rel)
	if s := v.sem.Status(rel); s.Governed() && s.Committed {
		return
	}
	if err := v.files.Remove(rel); err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			v.fail(err, "removing the node store's copy", rel)
		}
		// The app's file is gone all the same: the engine and the accounting forget it.
		v.files.Forget(rel)
	}
}

// placeQueued places every queued committed path.
func (v *View) placeQueued() {
	v.qmu.Lock()
	q := v.queue
	v.queue = nil
	v.qmu.Unlock()
	for _, p := range q {
		v.place(p)
	}
}

// place makes committed path p visible in the directory. A directory is created; a file
// this pod wrote itself stays the app's; another pod's file is copied from the store,
// read-only: never a hard link to the store's file, which an app could write through
// (the store's bytes are what every other reader of the workflow sees).
func (v *View) place(p string) {
	st := v.sem.Status(p)
	if !st.Exists {
		return
	}
	if st.IsDir {
		if _, ok := v.outputs[p]; ok || v.placed[p] {
			return
		}
		if v.exists(p) {
			return
		}
		v.mkdirs(p)
		return
	}
	if _, ok := v.outputs[p]; ok {
		return
	}
	if v.placed[p] {
		return
	}
	if v.exists(p) {
		return // the app has a file of its own there
	}
	if v.fetch != nil && v.fetch.Remote(p, 0, st.Size) {
		// Written on another node: its bytes are fetched first, off the loop, and the
		// file is queued again once they are in the store.
		if !v.fetching[p] {
			v.fetching[p] = true
			go v.fetchThenPlace(p, st.Size)
		}
		return
	}
	delete(v.fetching, p)
	v.mkdirs(pathpattern.Parent(p))
	v.placed[p] = true
	err := v.copyIn(p)
	if err != nil {
		delete(v.placed, p)
		v.fail(err, "placing a committed file in the direct volume", p)
		return
	}
	v.filesPlaced.Add(1)
	v.log.V(1).Info("placed committed file", "path", p, "bytes", st.Size)
}

// fetchThenPlace fetches the size bytes of the committed file p written on another node
// into the store, then queues it to be placed; a failure (the node holding the bytes is
// gone) is logged and counted, and the file is not placed.
func (v *View) fetchThenPlace(p string, size int64) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-v.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	if err := v.fetch.Fetch(ctx, p, 0, size); err != nil {
		if ctx.Err() == nil {
			v.fail(err, "fetching a committed file written on another node", p)
		}
		return
	}
	v.enqueue(p)
}

// mkdirs creates directory rel and its parents in the directory, writable by the app
// whatever user it runs as, marking those it creates as placed.
func (v *View) mkdirs(rel string) {
	if rel == "." || rel == "" {
		return
	}
	if v.exists(rel) {
		return
	}
	v.mkdirs(pathpattern.Parent(rel))
	v.placed[rel] = true
	if err := store.MkdirBeneath(v.dirfd, rel, 0o777); err != nil {
		delete(v.placed, rel)
		v.fail(err, "creating a directory in the direct volume", rel)
		return
	}
	if fd, err := v.open(rel, unix.O_PATH|unix.O_DIRECTORY); err == nil {
		_ = unix.Chmod("/proc/self/fd/"+strconv.Itoa(fd), 0o777) // past the umask
		unix.Close(fd)
	}
	if err := v.watch(rel); err != nil {
		v.fail(err, "watching a directory of the direct volume", rel)
	}
}

// copyIn copies the store's file p into the directory, read-only (mode 0444, the
// sidecar's), through a temporary name made with O_EXCL in p's directory (resolved
// without symlinks) and renamed into place unless the app made p meanwhile.
func (v *View) copyIn(p string) error {
	src, err := v.store.OpenFile(p, os.O_RDONLY, 0)
	if err != nil {
		return err
	}
	defer src.Close()
	dir, err := v.open(pathpattern.Parent(p), unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	defer unix.Close(dir)
	name := p[strings.LastIndexByte(p, '/')+1:]
	tmp := fmt.Sprintf("%scopy-%d", tmpPrefix, v.filesPlaced.Load())
	_ = unix.Unlinkat(dir, tmp, 0)
	f, err := store.OpenRegularBeneath(dir, tmp, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY, 0o444)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, src)
	if err == nil {
		err = f.Chmod(0o444) // past the umask
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat2(dir, tmp, dir, name, unix.RENAME_NOREPLACE)
	}
	if err != nil {
		_ = unix.Unlinkat(dir, tmp, 0)
		return err
	}
	return nil
}

// barrier runs sync once the events queued before it are handled: it creates a marker
// file in the directory, whose IN_CREATE comes after every earlier event (inotify keeps
// one queue per instance), and syncs when handling it. Without a marker (the directory
// refuses it) it syncs at once.
func (v *View) barrier(reply chan error) {
	v.nmarker++
	name := fmt.Sprintf("%ssync-%d", tmpPrefix, v.nmarker)
	f, err := store.OpenRegularBeneath(v.dirfd, name, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY, 0o600)
	if err != nil {
		v.log.Info("syncing without a barrier", "reason", err.Error())
		reply <- v.sync()
		return
	}
	f.Close()
	_ = unix.Unlinkat(v.dirfd, name, 0)
	v.markers[name] = reply
}

// sync is Sync, run by the event goroutine.
func (v *View) sync() error {
	before := v.errors.Load()
	v.scan(".")
	for rel, out := range v.outputs {
		v.ingest(rel, out.closes == 0)
	}
	if n := v.errors.Load() - before; n > 0 {
		return fmt.Errorf("%d files of the direct volume could not be ingested (see the log)", n)
	}
	return nil
}

// fail logs a failure on rel and counts it.
func (v *View) fail(err error, what, rel string) {
	v.errors.Add(1)
	v.log.Error(err, what, "path", rel, "step", v.opts.Step, "instance", v.opts.Instance)
}
