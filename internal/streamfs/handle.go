package streamfs

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/sluice-io/sluice/internal/pathpattern"
	"github.com/sluice-io/sluice/internal/store"
)

// handle is an open file: a descriptor of the store file, plus what the rules say about
// reading it.
type handle struct {
	n  *node
	fd int
	// at is the volume path of the file now (path): the name it was opened by, or the one
	// a rename through the view gave it since (openNames); nil for an O_TMPFILE file.
	// moving is held shared by each write and by the release, and exclusively by a
	// rename that moves the handle, so that neither sees the name change midway.
	at     atomic.Pointer[string]
	moving sync.RWMutex
	// write: opened for writing (the open's access mode, or O_TRUNC).
	write bool
	// kind is how the handle's reads are served and what its release tells the rules.
	kind kind
	// backed is the view's kept backing registration the kernel reads this handle's
	// committed file through (backing.go); nil when go-fuse registers it, or none.
	backed *backing
	// gen is the Generation of the file a gated handle opened: a read after the file was
	// withdrawn gets EIO, never another attempt's bytes.
	gen uint64
	// backing, of a kindBacked handle, is a descriptor of the store file opened for
	// reading and writing that an ungoverned file's handle offers the kernel as its
	// backing file (ungovernedPassthrough); sizeAtOpen is the file's size when it was
	// opened.
	backing    int
	sizeAtOpen int64
	// size is the size of the committed file a kindCommitted, kindServed or to-end handle
	// opened.
	size int64
	// read is how far a gated handle has read contiguously from the file's start, and
	// told how far the semantics last heard of (Semantics.ReadProgress).
	mu         sync.Mutex
	read, told int64
	// openedPassthrough is the size this read-only handle added to the view's
	// Stats.BytesOpenedPassthrough at its open (notePassthroughOpen); a read that reaches
	// the server takes it back out.
	openedPassthrough atomic.Int64
}

// kind is what a handle is, decided at its open (node.Open, node.Create, tmpfile): how the
// kernel and the view serve its reads and what its release tells the rules. Whether it
// may write is apart (handle.write), and matters only to kindPlain, kindTmpfile and
// kindBacked: the other kinds are read-only.
type kind uint8

const (
	// kindPlain is served by the view with no rule in its way beyond the write checks: a
	// writer's handle, a producer's read of its own file not committed yet, an ungoverned
	// file the kernel does not serve itself.
	kindPlain kind = iota
	// kindTmpfile is a handle of an O_TMPFILE file (tmpfile): path is empty, no rule sees
	// its writes and closes.
	kindTmpfile
	// kindBacked is an ungoverned file's handle the kernel may serve from the store file
	// itself, through the backing descriptor (ungovernedPassthrough).
	kindBacked
	// kindGated is a consumer's handle on a governed file not committed at open; every
	// read asks the semantics how many bytes it may return.
	kindGated
	// kindCommitted is a read-only handle of a committed file, all in the store, which
	// the kernel may serve from the store file itself (PassthroughFd).
	kindCommitted
	// kindServed is a read-only handle of a committed file that the view serves
	// (node.servedRead): each read first fetches its range where another node wrote it.
	kindServed
	// kindToEnd is a consumer's handle of a committed Consumed file, read through the
	// server (no passthrough, no page cache) so that a read to its end is seen: at
	// release, the semantics hear of it (Semantics.ReadToEnd) and may free the file
	// before the consumer exits.
	kindToEnd
	// kindServedToEnd is kindToEnd of a file the view serves, as kindServed.
	kindServedToEnd
)

// served reports whether the view serves the handle's reads of a committed file, fetching
// each range first, and holds one of its node's served opens (node.servedRead).
func (k kind) served() bool { return k == kindServed || k == kindServedToEnd }

// toEnd reports whether the handle's release tells the semantics that it read the file to
// its end (kindToEnd).
func (k kind) toEnd() bool { return k == kindToEnd || k == kindServedToEnd }

// String names the kind, for logs and tests.
func (k kind) String() string {
	switch k {
	case kindPlain:
		return "plain"
	case kindTmpfile:
		return "tmpfile"
	case kindBacked:
		return "backed"
	case kindGated:
		return "gated"
	case kindCommitted:
		return "committed"
	case kindServed:
		return "served"
	case kindToEnd:
		return "to-end"
	case kindServedToEnd:
		return "served-to-end"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// path returns the volume path of the file h has open now (handle.at): "" for an
// O_TMPFILE file.
func (h *handle) path() string {
	if p := h.at.Load(); p != nil {
		return *p
	}
	return ""
}

// progressStep is how much further a gated handle reads before it reports its progress.
const progressStep = 256 << 10

// noteRead records that a gated handle read k bytes at off and reports how far it has
// read contiguously, so that a Consumed NoUpdate file's start can be released once every
// consumer is past it.
func (h *handle) noteRead(off int64, k int) {
	h.mu.Lock()
	if off > h.read || off+int64(k) <= h.read {
		h.mu.Unlock()
		return
	}
	h.read = off + int64(k)
	if h.read-h.told < progressStep {
		h.mu.Unlock()
		return
	}
	h.told = h.read
	at := h.read
	h.mu.Unlock()
	v := h.n.v
	v.sem.ReadProgress(h.path(), v.opts.Step, v.opts.Instance, at)
}

var _ fs.FilePassthroughFder = (*handle)(nil)

// PassthroughFd offers the store file of a read-only handle of a committed file to the
// kernel (FUSE passthrough, Linux >= 6.9): go-fuse registers it as the handle's backing
// file, and reads, splice and mmap then bypass the server. Registering needs
// CAP_SYS_ADMIN; without it go-fuse falls back to serving reads (View.Passthrough).
func (h *handle) PassthroughFd() (int, bool) {
	if h.kind == kindBacked {
		return h.backing, h.n.v.passthrough.Load()
	}
	return h.fd, h.kind == kindCommitted && h.backed == nil && h.n.v.passthrough.Load()
}

// notePassthroughOpen counts the open of h, of a file of size bytes, in the view's
// Stats.BytesOpenedPassthrough when it is a read-only handle whose reads the kernel
// serves from the store file itself (FUSE passthrough): the server never sees those
// reads, so the report counts the file's size at each such open, the bytes a program
// that reads the file once to its end reads. Open calls it once h is final (after the
// Consumed and served decisions); a handle the server serves is not counted.
func (h *handle) notePassthroughOpen(size int64) {
	v := h.n.v
	if h.write || h.kind != kindCommitted && h.kind != kindBacked || !v.passthrough.Load() || size <= 0 {
		return
	}
	if h.openedPassthrough.Swap(size) == 0 {
		v.bytesOpenedPassthrough.Add(size)
	}
}

// servedAfterAll takes back what notePassthroughOpen counted for h once a read of h
// reaches the server: the kernel did not use passthrough for it (go-fuse could not
// register the backing file), and its reads are counted as they come.
func (h *handle) servedAfterAll() {
	if h.openedPassthrough.Load() == 0 {
		return
	}
	if size := h.openedPassthrough.Swap(0); size > 0 {
		h.n.v.bytesOpenedPassthrough.Add(-size)
	}
}

// writeOpenFlags returns the FOPEN flags of h, opened for writing with the open(2) flags
// flags. No write handle needs its close(2) to reach the server (FOPEN_NOFLUSH: closes are
// counted at RELEASE). A write-only handle the server serves also takes direct I/O
// (FOPEN_DIRECT_IO): each write(2) goes to the server from the writer's own pages, without
// a copy into the kernel's page cache, and without the security.capability GETXATTR the
// kernel's cached write path asks before every write (file_remove_privs); it sets
// FUSE_WRITE_KILL_SUIDGID instead, which the server honours (killSuidgid). A handle that
// can read keeps the page cache, through which a shared writable mmap(2) of it writes (an
// O_WRONLY descriptor cannot be mapped at all). The kernel keeps the two coherent: cached
// pages are dropped when the file's modification time changes (FUSE_AUTO_INVAL_DATA).
func (h *handle) writeOpenFlags(flags uint32) uint32 {
	if flags&syscall.O_ACCMODE == syscall.O_WRONLY && h.kind != kindBacked {
		return fuse.FOPEN_NOFLUSH | fuse.FOPEN_DIRECT_IO
	}
	return fuse.FOPEN_NOFLUSH
}

// killSuidgid clears the set-user-ID bit, and the set-group-ID bit of a group-executable
// file, of the file h writes, named p, as a write by a caller without CAP_FSETID does on a local
// file system (should_remove_suid). The kernel asks the server to do it for a direct I/O
// write (FUSE_WRITE_KILL_SUIDGID, see pageReads).
func (h *handle) killSuidgid(p string) {
	v := h.n.v
	st, err := v.store.Lstat(p)
	if err != nil {
		return
	}
	kill := uint32(syscall.S_ISUID)
	if st.Mode&syscall.S_IXGRP != 0 {
		kill |= syscall.S_ISGID
	}
	if st.Mode&kill != 0 {
		_ = v.store.Chmod(p, st.Mode&0o7777&^kill)
	}
}

// ungovernedPassthrough lets the kernel read and write the ungoverned file h opened from
// the store file itself (FUSE passthrough, Linux >= 6.9), as on tmpfs: no rule waits on
// it, commits it or sends its bytes anywhere, so the server has nothing to see between
// open and release. go-fuse registers one backing file per inode and gives it to every
// later open of the inode (the kernel refuses to mix passthrough and cached opens), so
// the backing descriptor is opened for reading and writing whatever this open asked for:
// the kernel still checks each open's own access mode. When the store file cannot be
// opened so, h stays on the server; so does every handle of a view served through a FUSE
// device a restarted sidecar takes over (Options.Device): the successor resumes the open
// handles of the first (resumer), which must see their requests (and an unprivileged
// sidecar cannot register backing files anyway).
func (h *handle) ungovernedPassthrough() {
	v := h.n.v
	if !v.passthrough.Load() || v.opts.Device != nil {
		return
	}
	bfd, err := v.store.Open(h.path(), syscall.O_RDWR, 0)
	if err != nil {
		return
	}
	var st syscall.Stat_t
	if syscall.Fstat(bfd, &st) != nil {
		syscall.Close(bfd)
		return
	}
	h.backing, h.kind, h.sizeAtOpen = bfd, kindBacked, st.Size
	h.notePassthroughOpen(st.Size)
}

// settleBacking runs at the release of an ungoverned file's passthrough handle: writes
// the kernel made to the store file by itself are counted (the view's written bytes, as
// the file's growth since open) and the store's byte accounting learns the file's size,
// if the name h has now (renames through the view carry it along, openNames) still names
// the file h wrote (it may have been removed, or renamed by someone else, since).
// A passthrough write is not held to the node store's size limit while it happens; it
// fails only when the file system under the store is full, as on tmpfs, and the writer
// sees that failure itself (docs/semantics.md, "The fast path").
func (h *handle) settleBacking() {
	defer syscall.Close(h.backing)
	if !h.write {
		return
	}
	v := h.n.v
	var st syscall.Stat_t
	if syscall.Fstat(h.fd, &st) != nil {
		return
	}
	if grew := st.Size - h.sizeAtOpen; grew > 0 {
		v.bytesWritten.Add(grew)
		v.bytesPassedThrough.Add(grew)
	}
	// Same size and modification time: the name still holds this file (inode numbers
	// differ between the store's tiers, see store.DiskInoBit).
	if cur, err := v.store.Lstat(h.path()); err == nil && cur.Size == st.Size && cur.Mtim == st.Mtim {
		_ = v.files.Recount(h.path(), h.fd) // what the writes allocated
	}
}

var (
	_ fs.FileReleaser = (*handle)(nil)
	_ fs.FileFlusher  = (*handle)(nil)
)

// Read returns bytes at off. On a gated handle it waits until at least one byte at off is
// readable (NoUpdate: written; Update: committed) or the file is committed and off is at
// its end (EOF, never before commit).
func (h *handle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	v := h.n.v
	want := len(dest)
	h.servedAfterAll()
	if h.kind == kindGated && v.pages.pageRead(ctx) && !h.committed() {
		// The kernel filling its page cache (splice, sendfile, copy_file_range, a
		// mapping's page fault): it would stop at the size written so far and call that
		// the end, and keep a page half written. EINVAL makes those calls fail, and
		// programs fall back to read(2) (pageReads). Once the file is committed its
		// bytes and size are final, and the page cache may hold them (mmap of an input
		// read to its commit, FUSE_DIRECT_IO_ALLOW_MMAP).
		return nil, syscall.EINVAL
	}
	if h.kind == kindGated {
		// A withdrawn file (semantics.Engine.Withdraw) ends the wait below with EIO.
		n, eof, _ := v.sem.WaitRead(probe, h.path(), h.gen, off)
		if n == 0 && !eof {
			errno := v.wait(ctx, v.waitOn("read", h.path()), func(ctx context.Context) error {
				var err error
				n, eof, err = v.sem.WaitRead(ctx, h.path(), h.gen, off)
				return err
			})
			if errno != 0 {
				return nil, errno
			}
		}
		if eof {
			return fuse.ReadResultData(nil), 0
		}
		if int64(want) > n {
			want = int(n)
		}
		if errno := v.fetched(ctx, h.path(), off, off+int64(want)); errno != 0 {
			return nil, errno
		}
	} else if h.kind.served() && off < h.size {
		if errno := v.fetched(ctx, h.path(), off, min(off+int64(want), h.size)); errno != 0 {
			return nil, errno
		}
	}
	k, err := syscall.Pread(h.fd, dest[:want], off)
	if err != nil {
		return nil, toErrno(err)
	}
	if h.kind == kindGated || h.kind.toEnd() {
		h.noteRead(off, k)
	}
	v.noteRead(k, h.kind == kindGated || h.kind != kindTmpfile && v.rules.Resolve(h.path()).Governed())
	return fuse.ReadResultData(dest[:k]), 0
}

// gatedSeek answers SEEK_DATA and SEEK_HOLE (whence) at off on a gated handle whose file
// is not committed yet, as a read at off would (ok false for any other handle or whence):
// it waits until a byte at off is readable, then says that the data starts at off
// (SEEK_DATA) and runs to the end of what is readable now (SEEK_HOLE); at the commit's end
// it is ENXIO. The store file's own answer would put a hole, the end of the data, at the
// size written so far, and a program that copies a file's data extents by SEEK_DATA and
// SEEK_HOLE (GNU cp and install when the store file has few blocks, as one written on
// another node has while its bytes are fetched) would end its copy there, silently.
func (h *handle) gatedSeek(ctx context.Context, off int64, whence int) (int64, syscall.Errno, bool) {
	if h.kind != kindGated || whence != unix.SEEK_DATA && whence != unix.SEEK_HOLE || off < 0 || h.committed() {
		return 0, 0, false
	}
	v := h.n.v
	n, eof, _ := v.sem.WaitRead(probe, h.path(), h.gen, off)
	if n == 0 && !eof {
		errno := v.wait(ctx, v.waitOn("seek", h.path()), func(ctx context.Context) error {
			var err error
			n, eof, err = v.sem.WaitRead(ctx, h.path(), h.gen, off)
			return err
		})
		if errno != 0 {
			return 0, errno, true
		}
	}
	switch {
	case eof:
		return 0, syscall.ENXIO, true
	case whence == unix.SEEK_DATA:
		return off, 0, true
	default:
		return off + n, 0, true
	}
}

// committed reports whether the file a gated handle opened is committed now (the same
// file: not withdrawn and made again since).
func (h *handle) committed() bool {
	st := h.n.v.sem.Status(h.path())
	return st.Committed && st.Generation == h.gen
}

// Write writes data at off through store.Files.WriteAt, which reserves the space in the
// store first (which may wait, then fail with ENOSPC: a write is never silently
// shortened), then tells the semantics and, through its DataSink, the transport.
func (h *handle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	v := h.n.v
	if !h.write {
		return 0, syscall.EBADF
	}
	if h.kind == kindTmpfile {
		return h.anonWrite(ctx, data, off)
	}
	h.moving.RLock() // the file's name stays p until the write is told (openNames)
	defer h.moving.RUnlock()
	p := h.path()
	if s := v.sem.Status(p); s.Governed() && (s.Committed || fixedByLink(h.fd)) {
		return 0, syscall.EPERM
	}
	// Reserve, write, tell the engine and the transport (store.Files.WriteAt).
	k, err := v.files.WriteAt(ctx, p, h.fd, data, off)
	if err != nil {
		var refused *store.ReserveError
		if errors.As(err, &refused) {
			v.opts.Log.Error(nil, "write refused: node store full", "path", p, "step", v.opts.Step,
				"instance", v.opts.Instance, "offset", off, "bytes", len(data), "err", err.Error())
		}
		h.poison(p, off, len(data), err)
		return uint32(k), toErrno(err)
	}
	if v.pages.killPrivs(ctx) {
		h.killSuidgid(p)
	}
	v.bytesWritten.Add(int64(k))
	return uint32(k), 0
}

// poison records that the governed file h writes can never be complete: a write of n
// bytes at off failed with err, and the writer may go on as if it had not (many programs
// ignore a failed write, or exit 0 after one). p is the file's name (handle.path). The file never commits and its readers
// get EIO naming the failure (semantics.Engine.Poison).
func (h *handle) poison(p string, off int64, n int, err error) {
	v := h.n.v
	reason := fmt.Sprintf("a write of %d bytes at offset %d by step %s instance %d failed: %v", n, off, v.opts.Step, v.opts.Instance, err)
	if perr := v.sem.Poison(p, reason); perr == nil {
		v.opts.Log.Error(nil, "file poisoned: it will never commit", "path", pathpattern.Printable(p), "reason", reason)
	}
}

// Flush would be called at every close(2) of a descriptor, but every handle is opened
// with FOPEN_NOFLUSH: there is nothing to do, closes are counted at Release.
func (h *handle) Flush(ctx context.Context) syscall.Errno { return 0 }

// Release closes the store descriptor; for a handle opened for writing it counts one
// close of the file (CAPIO-CL on_close).
func (h *handle) Release(ctx context.Context) syscall.Errno {
	if h.kind != kindTmpfile {
		h.moving.RLock() // the name the close is told under stays the file's (openNames)
		defer h.moving.RUnlock()
		defer h.n.v.names.unregister(h)
	}
	if h.kind == kindBacked {
		h.settleBacking()
	}
	err := syscall.Close(h.fd)
	if h.backed != nil {
		if srv := h.n.v.notifier.Load(); srv != nil {
			h.n.v.pages.backings.release(srv, h.backed)
		}
	}
	if h.kind.served() {
		h.n.served.End()
	}
	if h.write && h.kind != kindTmpfile {
		_ = h.n.v.sem.Close(h.path())
		h.n.v.writers.End()
	}
	if h.kind.toEnd() {
		h.mu.Lock()
		read := h.read
		h.mu.Unlock()
		if read >= h.size {
			v := h.n.v
			v.sem.ReadToEnd(h.path(), v.opts.Step, v.opts.Instance)
		}
	}
	return toErrno(err)
}

// dirHandle lists a directory. In a consumer view, governed entries are listed only when
// visible (NoUpdate: created; Update: committed); a governed directory's listing does not
// end until the directory is committed, entries being returned as they appear.
type dirHandle struct {
	n      *node
	path   string
	stream bool
	// settle: a plain directory that may still get entries this view's step declares as
	// inputs; its listing ends once their producers have exited (Engine.PendingListing).
	settle bool

	emitted map[string]bool
	queue   []fuse.DirEntry
	started bool
	inBatch int
	done    bool
}

var (
	_ fs.FileReaddirenter = (*dirHandle)(nil)
	_ fs.FileSeekdirer    = (*dirHandle)(nil)
	_ fs.FileReleasedirer = (*dirHandle)(nil)
)

// scan queues the visible entries not returned yet.
func (d *dirHandle) scan() syscall.Errno {
	v := d.n.v
	if d.emitted == nil {
		d.emitted = map[string]bool{}
	}
	if !d.started {
		d.started = true
		d.queue = append(d.queue, fuse.DirEntry{Name: ".", Mode: syscall.S_IFDIR}, fuse.DirEntry{Name: "..", Mode: syscall.S_IFDIR})
	}
	entries, err := v.store.ReadDir(d.path)
	if err != nil {
		if errno := toErrno(err); errno != syscall.ENOENT || !v.rules.ImpliedDir(d.path, v.opts.Step) {
			return errno
		}
		entries = nil // an implied directory not created yet lists as empty
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Name() < entries[j].Name() })
	for _, e := range entries {
		name := e.Name()
		if d.emitted[name] {
			continue
		}
		child := d.n.child(name)
		if _, consumer := d.n.consumerOf(child); consumer && !v.sem.Visible(child) {
			continue
		}
		d.emitted[name] = true
		st, err := v.store.Lstat(child)
		if err != nil {
			continue // removed meanwhile
		}
		d.queue = append(d.queue, fuse.DirEntry{Name: name, Mode: st.Mode, Ino: st.Ino})
	}
	return 0
}

// Readdirent returns the next entry, or nil to end the current batch. An empty batch is
// the end of the directory, so a streaming listing with nothing new blocks (bounded by the
// wait timeout) until an entry appears or the directory commits.
func (d *dirHandle) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	v := d.n.v
	for {
		if len(d.queue) == 0 && !d.done {
			// Look at the directory's state before scanning, so an entry created between
			// the scan and the wait still wakes us.
			var changed <-chan struct{}
			var committed bool // complete: nothing can appear in it any more
			if d.settle {
				changed = v.sem.AnyChange()
				committed = len(v.sem.PendingListing(d.path, v.opts.Step)) == 0
			} else {
				changed = v.sem.Changed(d.path)
				committed = !d.stream || v.sem.Status(d.path).Committed
			}
			if errno := d.scan(); errno != 0 {
				return nil, errno
			}
			if len(d.queue) == 0 {
				switch {
				case committed:
					d.done = true
				case d.inBatch > 0:
					d.inBatch = 0
					return nil, 0 // let the reader have what it got so far
				default:
					errno := v.wait(ctx, v.waitOn("readdir", d.path), func(ctx context.Context) error {
						if d.settle {
							// a plain directory: an entry appears, or a producer exits
							select {
							case <-changed:
								return nil
							case <-ctx.Done():
								return fmt.Errorf("listing %s, which steps %s may still add inputs of step %s to: %w",
									pathpattern.Printable(d.path), strings.Join(v.sem.PendingListing(d.path, v.opts.Step), ", "), v.opts.Step, ctx.Err())
							}
						}
						// WaitDir ends when the directory commits or never can (its
						// producers exited, or one failed with no retries left: an error
						// naming the rule and the failed producer); the listing also goes
						// on at the directory's next change (a new entry), which cancels
						// the wait.
						wctx, cancel := context.WithCancel(ctx)
						defer cancel()
						stop := make(chan struct{})
						defer close(stop)
						go func() {
							select {
							case <-changed:
								cancel()
							case <-stop:
							}
						}()
						_, err := v.sem.WaitDir(wctx, d.path)
						if err != nil && wctx.Err() != nil && ctx.Err() == nil {
							return nil // changed: scan again
						}
						return err
					})
					if errno != 0 {
						return nil, errno
					}
					continue
				}
			}
		}
		if len(d.queue) == 0 {
			d.inBatch = 0
			return nil, 0
		}
		e := d.queue[0]
		d.queue = d.queue[1:]
		d.inBatch++
		return &e, 0
	}
}

// Seekdir supports rewinddir (offset 0): the listing starts over.
func (d *dirHandle) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	if off != 0 {
		return syscall.EINVAL
	}
	*d = dirHandle{n: d.n, path: d.path, stream: d.stream}
	return 0
}

// Releasedir ends the listing.
func (d *dirHandle) Releasedir(ctx context.Context, releaseFlags uint32) {}
