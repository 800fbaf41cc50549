package streamfs

import (
	"context"
	"errors"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/pathpattern"
	"github.com/sluice-io/sluice/internal/takeover"
)

// Open opens a file. Writing is allowed only to the step's outputs. A consumer's open of a
// governed file waits until it may open it (exists, and committed under Update), whatever
// its flags: O_NONBLOCK has no effect on the open of a regular file (POSIX), and GNU gzip
// and xz set it on every input. The wait is usually over before Open (Lookup waited);
// Open waits on a node revived after a restart of the server.
func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if n.unnamed() {
		return n.tmpOpen(flags)
	}
	p := n.rel()
	writing := flags&syscall.O_ACCMODE != syscall.O_RDONLY || flags&syscall.O_TRUNC != 0
	_, consumer := n.consumerOf(p)
	waited := false // on this placeholder node: the kernel needs the file's size (announceSize)
	if writing {
		if errno := n.mayWrite(p); errno != 0 {
			return nil, 0, errno
		}
	} else if consumer && !n.v.sem.CanOpen(p) {
		if errno := n.waitVisible(ctx, p, "open"); errno != 0 {
			return nil, 0, errno
		}
		// The kernel's attributes of this inode predate the file (a placeholder's size,
		// 0), and splice reads (sendfile: busybox cat) trust its size without asking. On
		// the placeholder's own node the open goes on once the kernel has the file's size
		// (announceSize): the inode a program stat()ed before its open is then the one it
		// opened, which GNU cp checks ("replaced while being copied"). Otherwise, ESTALE
		// makes the VFS walk the path again with LOOKUP_REVAL, whose fresh LOOKUP gives
		// the real node and size, and open once more, which no longer waits.
		if !takeover.IsPlaceholder(n.StableAttr().Ino) {
			return nil, 0, syscall.ESTALE
		}
		waited = true
	}
	h, errno := n.openNamed(flags, writing)
	if errno != 0 {
		return nil, 0, errno
	}
	p, fd := h.path(), h.fd
	if waited && n.announceSize(ctx, p, fd) != 0 {
		n.v.names.unregister(h)
		syscall.Close(fd)
		return nil, 0, syscall.ESTALE
	}
	if !n.v.rules.Resolve(p).Governed() {
		h.ungovernedPassthrough()
	}
	if writing {
		n.v.writers.Begin()
		return h, h.writeOpenFlags(flags), 0
	}
	// No handle needs its close(2) to reach the server: closes are counted at RELEASE, and
	// writes go through to the store as they come (no write-back cache, no locks), so a
	// FLUSH has nothing to do. FOPEN_NOFLUSH spares that round trip.
	st := n.v.sem.Status(p)
	if st.Governed() && st.Committed {
		// Committed bytes never change: the kernel may read them from the store file
		// itself (FUSE passthrough, see View.Passthrough) once they are all in the store.
		// Until then the view serves the reads, fetching each one's range from the node
		// that wrote it as the reader gets there (servedRead).
		h.size = st.Size
		h.kind = kindCommitted
		if n.servedRead(p, st.Size) {
			h.kind = kindServed
		}
		if consumer && st.Size > 0 && h.kind == kindCommitted && n.v.passthrough.Load() {
			n.v.noteInput()
		}
	}
	if consumer {
		n.v.sem.NoteOpened(p)
		n.v.noteInputOpened(st.Generation, p)
		if st.Committed && st.Rule != nil && st.Rule.Lifetime == v1alpha1.LifetimeConsumed {
			// Read through the server, so that a read to the end is seen (kindToEnd).
			if h.kind.served() {
				h.kind = kindServedToEnd
			} else {
				h.kind = kindToEnd
			}
			h.size = st.Size
			return h, fuse.FOPEN_DIRECT_IO | fuse.FOPEN_NOFLUSH, 0
		}
		if st.Committed {
			h.notePassthroughOpen(h.size)
			if h.kind == kindCommitted && n.v.passthrough.Load() {
				// A kept registration of the file's backing, or a new one kept after
				// the last close (backing.go); go-fuse registers none for this handle.
				if srv := n.v.notifier.Load(); srv != nil {
					key := backingKey{ino: n.StableAttr().Ino, gen: st.Generation}
					if bk, ok := n.v.pages.backings.acquire(srv, key, h.fd); ok {
						if n.v.pages.backings.grant(ctx, bk) {
							h.backed = bk
						} else {
							n.v.pages.backings.release(srv, bk)
						}
					}
				}
			}
			return h, fuse.FOPEN_KEEP_CACHE | fuse.FOPEN_NOFLUSH, 0
		}
		// Not committed: the kernel must ask us for every read (its idea of the size is
		// stale) and must not cache pages that may not be written yet.
		h.kind, h.gen = kindGated, st.Generation
		return h, fuse.FOPEN_DIRECT_IO | fuse.FOPEN_NOFLUSH, 0
	}
	return h, fuse.FOPEN_NOFLUSH, 0
}

// openNamed opens the store file of n (store.Files.Open: an open with O_TRUNC truncates,
// and the accounting and the semantics hear of it) and registers its handle under the
// file's name (openNames), with no rename in between; writing is the handle's.
func (n *node) openNamed(flags uint32, writing bool) (*handle, syscall.Errno) {
	n.v.names.ns.RLock()
	defer n.v.names.ns.RUnlock()
	p := n.rel()
	fd, err := n.v.files.Open(p, int(flags)&^(syscall.O_CREAT|syscall.O_EXCL|syscall.O_NONBLOCK), 0)
	if err != nil {
		return nil, toErrno(err)
	}
	h := &handle{n: n, fd: fd, write: writing}
	n.v.names.register(h, p)
	return h, 0
}

// announceSize gives the kernel the size of the committed file p, open as fd, whose open
// waited on this placeholder node, before the open returns: splice and sendfile read up to the size
// the kernel holds for the inode without asking (Linux filemap_splice_read), and it holds
// the placeholder's 0. The one FUSE message that sets an inode's size is a store into its
// page cache (FUSE_NOTIFY_STORE, which extends the size to the end of what it stores), so
// the file's last byte, final since the file is committed, is stored there. A file not
// committed yet is read through the server only (direct I/O), which knows its size. It
// returns the errno of a failure to fetch, read or store that byte.
func (n *node) announceSize(ctx context.Context, p string, fd int) syscall.Errno {
	st := n.v.sem.Status(p)
	if !st.Committed || st.Size == 0 {
		return 0
	}
	if errno := n.v.fetched(ctx, p, st.Size-1, st.Size); errno != 0 {
		return errno
	}
	last := make([]byte, 1)
	if k, err := syscall.Pread(fd, last, st.Size-1); err != nil || k != 1 {
		return syscall.EIO
	}
	return n.WriteCache(st.Size-1, last)
}

// servedRead decides whether a read-only handle of the committed file p, of size bytes,
// is served by the view (true) rather than offered to the kernel for passthrough, and
// counts it (the handle's Release drops the count). A file some of whose bytes were written on
// another node and are not in this node's store yet is served: the kernel would read the
// store file's holes as zeros, and fetching the whole file at open would make the reader
// wait for bytes it may never read and keep it from computing while they arrive. Once
// one handle of the inode is served, so is every later one until the last is released:
// the kernel refuses a passthrough open of an inode that has cached opens (Linux
// fs/fuse/iomode.c: the open fails with EIO), and go-fuse registers a backing file for
// any passthrough open. The count is taken before the kernel sees the open and dropped
// after the kernel dropped it (RELEASE), so it never says "none" while the kernel has one.
func (n *node) servedRead(p string, size int64) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.served.N() == 0 && (n.v.fetch == nil || !n.v.fetch.Remote(p, 0, size)) {
		return false
	}
	n.served.Begin()
	return true
}

// Create creates and opens a new file; only the step's outputs (or ungoverned paths).
// The new file belongs to the caller (own) with exactly the mode asked for; a file that
// exists already (made meanwhile through another view) is opened as it is, and truncated
// as any open with O_TRUNC truncates, unless the caller asked for O_EXCL.
func (n *node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	if errno := checkName(name); errno != 0 {
		return nil, nil, 0, errno
	}
	n.v.names.ns.RLock() // as Open
	defer n.v.names.ns.RUnlock()
	p := n.child(name)
	if errno := n.mayWrite(p); errno != 0 {
		return nil, nil, 0, errno
	}
	n.ensureParent(p)
	// A new file is empty: nothing to truncate, nothing to tell but its creation.
	fd, err := n.v.files.Open(p, int(flags)&^syscall.O_TRUNC|syscall.O_CREAT|syscall.O_EXCL, mode&0o7777)
	created := err == nil
	if errors.Is(err, syscall.EEXIST) && flags&syscall.O_EXCL == 0 {
		// Made meanwhile (another view, the transport): an open of an existing file,
		// whose O_TRUNC the accounting and the semantics hear of (store.Files.Open).
		fd, err = n.v.files.Open(p, int(flags)&^syscall.O_CREAT, 0)
	}
	if err != nil {
		return nil, nil, 0, n.v.makeErrno("create", p, err)
	}
	st, errno := n.ownedStat(ctx, p, fd, mode, created)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	_ = n.v.sem.Create(p, false)
	n.v.noteCreated(p)
	n.v.writers.Begin()
	ch := n.newChild(ctx, p, &st, out)
	h := &handle{n: n, fd: fd, write: true}
	n.v.names.register(h, p)
	if !n.v.rules.Resolve(p).Governed() {
		h.ungovernedPassthrough()
	}
	return ch, h, h.writeOpenFlags(flags), 0
}

// ensureParent creates, in the store, the directory that holds p when this view shows it
// as an implied directory that does not exist yet (a plain file created in it makes it).
func (n *node) ensureParent(p string) {
	parent := pathpattern.Parent(p)
	if parent == "." || !n.v.rules.ImpliedDir(parent, n.v.opts.Step) {
		return
	}
	_ = n.v.store.MkdirAll(parent)
}

func (n *node) Read(ctx context.Context, f fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	return f.(*handle).Read(ctx, dest, off)
}

func (n *node) Write(ctx context.Context, f fs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	return f.(*handle).Write(ctx, data, off)
}

func (n *node) Release(ctx context.Context, f fs.FileHandle) syscall.Errno {
	if r, ok := f.(fs.FileReleaser); ok {
		return r.Release(ctx)
	}
	return 0
}

func (n *node) Flush(ctx context.Context, f fs.FileHandle) syscall.Errno {
	if h, ok := f.(*handle); ok {
		return h.Flush(ctx)
	}
	return 0
}

func (n *node) Fsync(ctx context.Context, f fs.FileHandle, flags uint32) syscall.Errno {
	if h, ok := f.(*handle); ok {
		return toErrno(syscall.Fsync(h.fd))
	}
	return 0
}

func (n *node) Allocate(ctx context.Context, f fs.FileHandle, off uint64, size uint64, mode uint32) syscall.Errno {
	h, ok := f.(*handle)
	if !ok || !h.write {
		return syscall.EBADF
	}
	// The store counts what the range allocates (or frees) against the limit.
	h.moving.RLock()
	defer h.moving.RUnlock()
	return toErrno(n.v.store.Fallocate(ctx, h.path(), h.fd, mode, int64(off), int64(size)))
}

// Lseek seeks the store file. SEEK_DATA and SEEK_HOLE on a file some of whose bytes
// were written on another node and are not fetched yet answer as if every byte were data:
// those bytes are holes in the store file until they are fetched, and a program that maps
// a file's data before copying it (cp, tar, rsync on a file with few blocks) would
// otherwise copy them as zeros. On a consumer's handle of a file not committed yet they
// answer as a read at the offset would, waiting for its bytes (handle.gatedSeek).
func (n *node) Lseek(ctx context.Context, f fs.FileHandle, off uint64, whence uint32) (uint64, syscall.Errno) {
	h := f.(*handle)
	if r, errno, ok := h.gatedSeek(ctx, int64(off), int(whence)); ok {
		return uint64(r), errno // a file not committed yet: as a read at off
	}
	if (whence == unix.SEEK_DATA || whence == unix.SEEK_HOLE) && h.path() != "" && n.v.fetch != nil {
		var st syscall.Stat_t
		if err := syscall.Fstat(h.fd, &st); err != nil {
			return 0, toErrno(err)
		}
		if n.v.fetch.Remote(h.path(), 0, st.Size) {
			switch {
			case int64(off) >= st.Size:
				return 0, syscall.ENXIO
			case whence == unix.SEEK_DATA:
				return off, 0
			default:
				return uint64(st.Size), 0
			}
		}
	}
	r, err := unix.Seek(h.fd, int64(off), int(whence))
	return uint64(r), toErrno(err)
}

// CopyFileRange is refused so that the kernel falls back to read and write, which the
// rules see.
func (n *node) CopyFileRange(ctx context.Context, fhIn fs.FileHandle, offIn uint64, out *fs.Inode, fhOut fs.FileHandle, offOut uint64, length uint64, flags uint64) (uint32, syscall.Errno) {
	return 0, syscall.ENOSYS
}
