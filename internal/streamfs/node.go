package streamfs

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/inflight"
	"github.com/sluice-io/sluice/internal/pathpattern"
	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/takeover"
)

// node is a file or directory of a view, addressed by its volume path; its bytes live at
// the same path in the store.
type node struct {
	fs.Inode
	v *View
	// fixed is the path of a node outside the tree: a placeholder an earlier server gave
	// the kernel, revived by its ID (LookupNode).
	fixed string
	// tmp is set for a file made with O_TMPFILE (Tmpfile).
	tmp *tmpfile
	// served counts the open read-only handles of this committed file that the view
	// serves itself, in the kernel's cached I/O mode (servedRead); mu makes its decision
	// and count one step.
	mu     sync.Mutex
	served inflight.Count
}

var (
	_ fs.NodeLookuper       = (*node)(nil)
	_ fs.NodeGetattrer      = (*node)(nil)
	_ fs.NodeSetattrer      = (*node)(nil)
	_ fs.NodeOpener         = (*node)(nil)
	_ fs.NodeCreater        = (*node)(nil)
	_ fs.NodeMkdirer        = (*node)(nil)
	_ fs.NodeUnlinker       = (*node)(nil)
	_ fs.NodeRmdirer        = (*node)(nil)
	_ fs.NodeRenamer        = (*node)(nil)
	_ fs.NodeSymlinker      = (*node)(nil)
	_ fs.NodeReadlinker     = (*node)(nil)
	_ fs.NodeOpendirHandler = (*node)(nil)
	_ fs.NodeStatfser       = (*node)(nil)
	_ fs.NodeAccesser       = (*node)(nil)
	_ fs.NodeGetattrer      = (*node)(nil)
	_ fs.NodeReader         = (*node)(nil)
	_ fs.NodeWriter         = (*node)(nil)
	_ fs.NodeReleaser       = (*node)(nil)
	_ fs.NodeFlusher        = (*node)(nil)
	_ fs.NodeFsyncer        = (*node)(nil)
	_ fs.NodeAllocater      = (*node)(nil)
	_ fs.NodeLseeker        = (*node)(nil)
	_ fs.NodeCopyFileRanger = (*node)(nil)
	_ fs.NodeLinker         = (*node)(nil)
	_ fs.NodeMknoder        = (*node)(nil)
	_ fs.NodeGetxattrer     = (*node)(nil)
	_ fs.NodeSetxattrer     = (*node)(nil)
	_ fs.NodeRemovexattrer  = (*node)(nil)
	_ fs.NodeListxattrer    = (*node)(nil)
)

// checkName refuses a new name that is not UTF-8 with EILSEQ, the errno for an illegal
// byte sequence: workflow paths are UTF-8 (pathpattern.Clean), and a name no rule could
// match must not be mistaken for a missing file.
func checkName(name string) syscall.Errno {
	if !utf8.ValidString(name) {
		return syscall.EILSEQ
	}
	return 0
}

// rel returns the node's cleaned volume path ("." for the root).
func (n *node) rel() string {
	if n.fixed != "" {
		return n.fixed
	}
	p := n.Path(n.v.root.EmbeddedInode())
	if p == "" {
		return "."
	}
	return p
}

func (n *node) child(name string) string {
	if p := n.rel(); p != "." {
		return p + "/" + name
	}
	return name
}

// governed reports whether a rule governs p and this view must wait on it (it is not one
// of p's producers).
func (n *node) consumerOf(p string) (semantics.Resolution, bool) {
	res := n.v.rules.Resolve(p)
	return res, res.Managed() && !n.v.producer(p)
}

// setAttr fills out from st and sets the cache lifetime: long for committed (immutable)
// files, none for everything that may still change.
//
// A NoUpdate file still being written shows the size written so far, in every view. A
// consumer's read(2) past it waits for more bytes and ends at the commit's EOF (handle.Read);
// the kernel's own copies, which would stop at that size without asking (splice, sendfile,
// copy_file_range within the mount), are refused on such a file so that programs fall back
// to read(2) (View.pageRead).
func (n *node) fillAttr(p string, st *syscall.Stat_t, out *fuse.Attr) time.Duration {
	out.FromStat(st)
	if st.Mode&syscall.S_IFMT == syscall.S_IFDIR {
		// The kernel checks a directory's mode and owner on every path walk through it
		// (default_permissions), asking for its attributes when they are not cached: a
		// directory's may be up to dirAttrTimeout old, as NFS clients cache them.
		// Waiting for a directory never depends on them (a placeholder caches nothing).
		if _, consumer := n.consumerOf(p); consumer {
			n.v.dirs.stable(p, st.Ino, out)
		}
		return dirAttrTimeout
	}
	s := n.v.sem.Status(p)
	if !s.Managed() {
		return 0
	}
	if s.Committed {
		// A committed file's times are stable on every node: its change time is its
		// modification time. The store file's own change time moves when a node stores
		// bytes of it fetched from the node that wrote them (the fetcher gives the
		// modification time back, but the change time cannot be set), and tar, cpio and
		// htslib compare times before and after reading a file.
		out.Ctime, out.Ctimensec = out.Mtime, out.Mtimensec
		return n.v.opts.CommittedTimeout
	}
	return 0
}

// dirAttrTimeout is how long the kernel may cache an existing directory's attributes.
const dirAttrTimeout = time.Second

func (n *node) newChild(ctx context.Context, p string, st *syscall.Stat_t, out *fuse.EntryOut) *fs.Inode {
	ttl := n.fillAttr(p, st, &out.Attr)
	entry := ttl
	if st.Mode&syscall.S_IFMT == syscall.S_IFDIR && entry < time.Second {
		// A directory's name is stable: caching it saves a lookup per path component.
		entry = time.Second
	}
	out.SetEntryTimeout(entry)
	out.SetAttrTimeout(ttl)
	return n.NewInode(ctx, &node{v: n.v}, fs.StableAttr{Mode: st.Mode & syscall.S_IFMT, Ino: st.Ino})
}

// Lookup finds name in the directory. A consumer's lookup of a governed file it may not
// open yet waits as open() does (exists, and committed under Update), then answers with
// the file's own attributes and inode: a program that stat()s a name before it opens it
// (tar, cp, du, make, rsync) never sees a size, type or inode number the file will not
// have. Under NoUpdate the wait ends at the file's first byte (startedStream). A governed
// directory waits for its creation (listing it waits further, OpendirHandle). A name
// inside a declared directory waits for its creation, then for its commit if it is a
// file. A governed name that can never appear (every producer exited) is ENOENT.
//
// The kernel holds the parent directory's lock shared during a LOOKUP: while one thread
// of a step waits here, another thread of the same step cannot create, rename or remove
// names in that same directory of its view until the wait ends (other steps' views are
// other mounts and are not affected).
func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if errno := checkName(name); errno != 0 {
		return nil, errno
	}
	p := n.child(name)
	res, consumer := n.consumerOf(p)
	st, err := n.v.store.Lstat(p)
	if !consumer {
		if err == nil {
			return n.newChild(ctx, p, &st, out), 0
		}
		if errno := toErrno(err); errno != syscall.ENOENT || !n.v.rules.ImpliedDir(p, n.v.opts.Step) || res.Managed() {
			return nil, errno
		}
		if len(n.v.rules.ListingRules(p, n.v.opts.Step)) == 0 {
			// A step that declares no input there sees the directory (empty) before the
			// producer creates it, so that its lookups of governed files in it can wait
			// and it may make plain files in it.
			return n.placeholder(ctx, p, syscall.S_IFDIR|0o555, out), 0
		}
		// A directory that governed files this step declares as inputs will live in: the
		// lookup waits until it exists (waitImpliedDir), so that the step sees the
		// directory's own inode and times, never a stand-in's.
		if errno := n.waitImpliedDir(ctx, p); errno != 0 {
			return nil, errno
		}
		if st, err = n.v.store.Lstat(p); err != nil {
			return nil, toErrno(err)
		}
		return n.newChild(ctx, p, &st, out), 0
	}
	if res.Dir != "" && err != nil && toErrno(err) == syscall.ENOENT {
		// A name inside a declared directory may become a file or a subdirectory; which
		// one is unknown until it exists, and a regular-file placeholder for a future
		// subdirectory would fail the rest of the path walk with ENOTDIR.
		if errno := n.v.wait(ctx, n.v.waitOn("lookup", p), func(ctx context.Context) error {
			_, err := n.v.sem.WaitExists(ctx, p)
			return err
		}); errno != 0 {
			return nil, errno
		}
		st, err = n.v.store.Lstat(p)
	}
	isDir := res.Dir == "" && res.Rule.Type == v1alpha1.FileTypeDirectory
	if err == nil && (n.visible(p, isDir) || res.Dir != "" && st.Mode&syscall.S_IFMT == syscall.S_IFDIR) {
		// (a subdirectory inside a declared directory is a plain directory once it exists)
		return n.newChild(ctx, p, &st, out), 0
	}
	if s := n.v.sem.Status(p); !s.Exists && s.ProducersExited {
		return nil, syscall.ENOENT
	}
	if errno := n.waitVisible(ctx, p, "lookup"); errno != 0 {
		return nil, errno
	}
	st, err = n.v.store.Lstat(p)
	if err != nil {
		return nil, toErrno(err)
	}
	return n.newChild(ctx, p, &st, out), 0
}

// waitImpliedDir blocks a lookup of p, a plain directory that governed files will live in
// (RuleSet.ImpliedDir), that this view's step declares inputs in (RuleSet.ListingRules)
// and that is not in the store, until it is there; ENOENT once none of those inputs can
// appear any more (every instance of every step making them has exited:
// Engine.PendingListing, which also ends a listing of it), as on any file system. A
// stand-in directory answered at once has an inode and times the directory made later
// does not have (rsync -a: "Too many levels of symbolic links", the kernel meeting the
// real directory under two parents). The directory appears in the store when a producer
// of this node makes it (Engine.Create of a plain directory wakes AnyChange), or, made on
// another node, when the transport creates the first governed file in it (the
// materialiser makes the parents before the engine records the creation).
func (n *node) waitImpliedDir(ctx context.Context, p string) syscall.Errno {
	step := n.v.opts.Step
	exists := func() bool {
		st, err := n.v.store.Lstat(p)
		return err == nil && st.Mode&syscall.S_IFMT == syscall.S_IFDIR
	}
	return n.v.wait(ctx, n.v.waitOn("lookup", p), func(ctx context.Context) error {
		for {
			changed := n.v.sem.AnyChange()
			if exists() {
				return nil
			}
			pending := n.v.sem.PendingListing(p, step)
			if len(pending) == 0 {
				return fmt.Errorf("directory %s: %w", pathpattern.Printable(p), semantics.ErrNeverCreated)
			}
			select {
			case <-changed:
			case <-ctx.Done():
				return fmt.Errorf("directory %s, which steps %s may still make inputs of step %s in: %w",
					pathpattern.Printable(p), strings.Join(pending, ", "), step, ctx.Err())
			}
		}
	})
}

// placeholder returns a node for a name that is not visible yet, with nothing cached by
// the kernel, so the next lookup sees the real file once it exists.
func (n *node) placeholder(ctx context.Context, p string, mode uint32, out *fuse.EntryOut) *fs.Inode {
	placeholderAttr(mode, &out.Attr)
	out.SetEntryTimeout(0)
	out.SetAttrTimeout(0)
	ino := takeover.PlaceholderIno(p)
	n.v.placeholders.Record(ino, p, mode)
	return n.NewInode(ctx, &node{v: n.v}, fs.StableAttr{Mode: mode & syscall.S_IFMT, Ino: ino})
}

// placeholderAttr fills the attributes of a name not visible yet: mode (type and
// permission bits, owned by root), one link and size 0: nothing of it may be read yet. An
// open that waits for the file ends in ESTALE, so the kernel looks the name up again and
// reads with the real file's attributes (Open).
func placeholderAttr(mode uint32, out *fuse.Attr) {
	*out = fuse.Attr{Mode: mode, Nlink: 1}
}

// visible reports whether a consumer may see p now: a directory once it exists, a file
// once it may be opened (exists, and committed under Update) and, under NoUpdate, has a
// first byte or is committed (startedStream).
func (n *node) visible(p string, isDir bool) bool {
	if isDir {
		return n.v.sem.Status(p).Exists || n.v.sem.Status(p).Committed
	}
	return n.v.sem.CanOpen(p) && n.startedStream(p)
}

// startedStream reports whether a NoUpdate file that may be opened is not an empty file
// still being written: the kernel answers sendfile and splice of a file whose size it
// holds as 0 with EOF without asking the server (Linux filemap_splice_read), so a
// consumer's lookup waits for the first byte (or the commit) and the kernel learns a size
// above 0, whose page reads the view then refuses until the commit (pageReads), and
// programs fall back to read(2). Python's shutil.copy of a file created but not written
// yet copied nothing and exited 0.
func (n *node) startedStream(p string) bool {
	s := n.v.sem.Status(p)
	return s.Committed || s.Size > 0 || s.IsDir || s.Fire != v1alpha1.FireNoUpdate
}

// waitVisible blocks a consumer until p may be seen (see visible).
func (n *node) waitVisible(ctx context.Context, p string, what string) syscall.Errno {
	res, consumer := n.consumerOf(p)
	if !consumer {
		return 0
	}
	if res.Dir != "" {
		if st, err := n.v.store.Lstat(p); err == nil && st.Mode&syscall.S_IFMT == syscall.S_IFDIR {
			return 0 // a subdirectory inside a declared directory
		}
	}
	isDir := res.Dir == "" && res.Rule.Type == v1alpha1.FileTypeDirectory
	if n.visible(p, isDir) {
		return 0
	}
	return n.v.wait(ctx, n.v.waitOn(what, p), func(ctx context.Context) error {
		if isDir {
			_, err := n.v.sem.WaitExists(ctx, p)
			return err
		}
		st, err := n.v.sem.WaitOpen(ctx, p)
		if err != nil || n.startedStream(p) {
			return err
		}
		_, _, err = n.v.sem.WaitRead(ctx, p, st.Generation, 0) // the first byte, or the commit
		return err
	})
}

// Getattr is stat(). A consumer's stat of a governed file or directory it may not see yet
// waits as open() does (Lookup), then answers with the real attributes; a file that can
// never appear is ENOENT. Only a node revived by its ID after a restart of the server
// (LookupNode) or a governed directory can be a placeholder here. The size is what has
// been written so far, and the final size after commit.
func (n *node) Getattr(ctx context.Context, f fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if n.unnamed() {
		return n.tmpGetattr(out)
	}
	p := n.rel()
	if h, ok := f.(*handle); ok {
		st, err := n.v.store.Fstat(h.fd)
		if err != nil {
			return toErrno(err)
		}
		out.SetTimeout(n.fillAttr(p, &st, &out.Attr))
		return 0
	}
	if errno := n.waitVisible(ctx, p, "stat"); errno != 0 {
		return errno
	}
	st, err := n.v.store.Lstat(p)
	if err != nil {
		if toErrno(err) == syscall.ENOENT && n.v.rules.ImpliedDir(p, n.v.opts.Step) && !n.v.rules.Resolve(p).Managed() {
			out.Attr.Mode = syscall.S_IFDIR | 0o555
			out.Attr.Nlink = 2
			out.SetTimeout(0)
			return 0
		}
		return toErrno(err)
	}
	out.SetTimeout(n.fillAttr(p, &st, &out.Attr))
	return 0
}

// mayWrite checks that this view's step may change p (CAPIO-CL: only declared outputs
// are written; inputs are read-only) and that p is not committed (committed files are
// immutable).
func (n *node) mayWrite(p string) syscall.Errno {
	if !n.v.producer(p) {
		return syscall.EACCES
	}
	if s := n.v.sem.Status(p); s.Managed() && s.Committed && !s.IsDir {
		n.v.opts.Log.Error(nil, "change refused: the file is committed and never changes again",
			"path", pathpattern.Printable(p), "rule", s.Rule.String(), "step", n.v.opts.Step, "instance", n.v.opts.Instance,
			"hint", "an OnClose file commits at its count-th close, summed over writers: declare commit.count for several writers")
		return syscall.EPERM
	}
	return 0
}

// setMeta applies the owner (chown: -1 keeps a part), then the permission bits (chmod),
// then the access and modification times (utimes, UTIME_OMIT for one not set) that in
// sets, in that order: chown(2) clears set-user-ID and set-group-ID bits the same request
// may set again.
func setMeta(in *fuse.SetAttrIn, chown func(uid, gid int) error, chmod func(mode uint32) error, utimes func(ts []unix.Timespec) error) syscall.Errno {
	uid, uok := in.GetUID()
	gid, gok := in.GetGID()
	if uok || gok {
		u, g := -1, -1
		if uok {
			u = int(uid)
		}
		if gok {
			g = int(gid)
		}
		if err := chown(u, g); err != nil {
			return toErrno(err)
		}
	}
	if mode, ok := in.GetMode(); ok {
		if err := chmod(mode & 0o7777); err != nil {
			return toErrno(err)
		}
	}
	mtime, mok := in.GetMTime()
	atime, aok := in.GetATime()
	if mok || aok {
		ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, {Nsec: unix.UTIME_OMIT}}
		if aok {
			ts[0] = unix.NsecToTimespec(atime.UnixNano())
		}
		if mok {
			ts[1] = unix.NsecToTimespec(mtime.UnixNano())
		}
		if err := utimes(ts); err != nil {
			return toErrno(err)
		}
	}
	return 0
}

// Setattr handles truncate, chown, chmod and utimes; the kernel has checked the caller's
// permissions (default_permissions). A size change needs mayWrite. Mode, owner and times
// of a governed file are its producer's to change, also once committed (tar, cp -a and
// rsync set them after closing the file); its bytes stay immutable. A consumer gets EPERM.
// The owner is changed before the mode, since chown(2) clears set-user-ID and
// set-group-ID bits that the same request may set again.
func (n *node) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if n.unnamed() {
		return n.tmpSetattr(ctx, in, out)
	}
	p := n.rel()
	h, _ := f.(*handle)
	sz, sizing := in.GetSize()
	if sizing {
		if errno := n.mayWrite(p); errno != 0 {
			return errno
		}
		if n.v.rules.Resolve(p).Managed() && n.v.linkedName(p) {
			return syscall.EPERM // its bytes are fixed by a hard link (fixedByLink)
		}
	} else if !n.v.producer(p) {
		return syscall.EPERM
	}
	if sizing {
		// A truncation allocates nothing: growing leaves a hole (written later, its bytes
		// are reserved then), shrinking frees what lay past the new end (store.Resize).
		var err error
		if h != nil {
			err = syscall.Ftruncate(h.fd, int64(sz))
		} else {
			err = n.v.store.Truncate(p, int64(sz))
		}
		if err != nil {
			return toErrno(err)
		}
		n.v.store.Resize(p, int64(sz))
		_ = n.v.sem.Truncate(p, int64(sz))
	}
	if errno := setMeta(in, func(u, g int) error { return n.v.store.SetOwner(p, u, g) },
		func(mode uint32) error { return n.v.store.Chmod(p, mode) },
		func(ts []unix.Timespec) error { return n.v.store.UtimesNano(p, ts) }); errno != 0 {
		return errno
	}
	st, err := n.v.store.Lstat(p)
	if err != nil {
		return toErrno(err)
	}
	out.SetTimeout(n.fillAttr(p, &st, &out.Attr))
	return 0
}

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
	fd, err := n.v.store.Open(p, int(flags)&^(syscall.O_CREAT|syscall.O_EXCL|syscall.O_NONBLOCK), 0)
	if err != nil {
		return nil, 0, toErrno(err)
	}
	if waited && n.announceSize(ctx, p, fd) != 0 {
		syscall.Close(fd)
		return nil, 0, syscall.ESTALE
	}
	h := &handle{n: n, fd: fd, path: p, write: writing}
	if !n.v.rules.Resolve(p).Managed() {
		h.ungovernedPassthrough()
	}
	if writing {
		if flags&syscall.O_TRUNC != 0 {
			n.v.store.Resize(p, 0)
			_ = n.v.sem.Truncate(p, 0)
		}
		n.v.writers.Begin()
		return h, h.writeOpenFlags(flags), 0
	}
	// No handle needs its close(2) to reach the server: closes are counted at RELEASE, and
	// writes go through to the store as they come (no write-back cache, no locks), so a
	// FLUSH has nothing to do. FOPEN_NOFLUSH spares that round trip.
	st := n.v.sem.Status(p)
	if st.Managed() && st.Committed {
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
			return h, fuse.FOPEN_KEEP_CACHE | fuse.FOPEN_NOFLUSH, 0
		}
		// Not committed: the kernel must ask us for every read (its idea of the size is
		// stale) and must not cache pages that may not be written yet.
		h.kind, h.gen = kindGated, st.Generation
		return h, fuse.FOPEN_DIRECT_IO | fuse.FOPEN_NOFLUSH, 0
	}
	return h, fuse.FOPEN_NOFLUSH, 0
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
// exists already (made meanwhile through another view) is opened as it is, unless the
// caller asked for O_EXCL.
func (n *node) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	if errno := checkName(name); errno != 0 {
		return nil, nil, 0, errno
	}
	p := n.child(name)
	if errno := n.mayWrite(p); errno != 0 {
		return nil, nil, 0, errno
	}
	n.ensureParent(p)
	fd, err := n.v.store.Open(p, int(flags)|syscall.O_CREAT|syscall.O_EXCL, mode&0o7777)
	created := err == nil
	if errors.Is(err, syscall.EEXIST) && flags&syscall.O_EXCL == 0 {
		fd, err = n.v.store.Open(p, int(flags)&^syscall.O_CREAT, 0)
	}
	if err != nil {
		return nil, nil, 0, toErrno(err)
	}
	st, errno := n.ownedStat(ctx, p, fd, mode, created)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	_ = n.v.sem.Create(p, false)
	n.v.noteCreated(p)
	n.v.writers.Begin()
	ch := n.newChild(ctx, p, &st, out)
	h := &handle{n: n, fd: fd, path: p, write: true}
	if !n.v.rules.Resolve(p).Managed() {
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

// Mkdir creates a directory; only the step's outputs (or ungoverned paths).
func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if errno := checkName(name); errno != 0 {
		return nil, errno
	}
	p := n.child(name)
	if !n.v.producer(p) {
		return nil, syscall.EACCES
	}
	n.ensureParent(p)
	if err := n.v.store.Mkdir(p, mode&0o7777); err != nil {
		return nil, toErrno(err)
	}
	if errno := n.ownPath(ctx, p, syscall.S_IFDIR|mode); errno != 0 {
		_ = n.v.store.Rmdir(p)
		return nil, errno
	}
	_ = n.v.sem.Create(p, true)
	st, err := n.v.store.Lstat(p)
	if err != nil {
		return nil, toErrno(err)
	}
	return n.newChild(ctx, p, &st, out), 0
}

// Unlink removes a file: the step's own uncommitted outputs or ungoverned files.
func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	p := n.child(name)
	if errno := n.mayWrite(p); errno != 0 {
		return errno
	}
	if err := n.v.store.Unlink(p); err != nil {
		return toErrno(err)
	}
	n.v.store.Forget(p)
	_ = n.v.sem.Remove(p)
	n.v.forgetCreated(p)
	return 0
}

// Rmdir removes an empty directory the step may write.
func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	p := n.child(name)
	if errno := n.mayWrite(p); errno != 0 {
		return errno
	}
	return toErrno(n.v.store.Rmdir(p))
}

// Rename moves a file. Both names must be writable by the step. A rename onto a governed
// name counts as that file being created and closed once (write-to-temp-then-rename).
func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	if errno := checkName(newName); errno != 0 {
		return errno
	}
	oldP := n.child(name)
	np, ok := newParent.(*node)
	if !ok {
		return syscall.EXDEV
	}
	newP := np.child(newName)
	if flags&^(unix.RENAME_NOREPLACE|unix.RENAME_EXCHANGE) != 0 {
		return syscall.EINVAL // RENAME_WHITEOUT is for overlay file systems
	}
	if flags&unix.RENAME_EXCHANGE != 0 {
		// Both names change contents at once: the rules have no event for that, so it
		// is for ungoverned names only.
		if n.v.rules.Resolve(oldP).Managed() || n.v.rules.Resolve(newP).Managed() {
			return syscall.EINVAL
		}
		return toErrno(n.v.store.RenameAt(oldP, newP, unix.RENAME_EXCHANGE))
	}
	if !n.v.mayRenameAway(oldP) {
		if errno := n.mayWrite(oldP); errno != 0 {
			return errno
		}
	}
	if errno := n.mayWrite(newP); errno != 0 {
		return errno
	}
	if err := n.v.store.RenameAt(oldP, newP, uint(flags)); err != nil {
		return toErrno(err)
	}
	n.v.store.Rename(oldP, newP)
	size := int64(0)
	if st, err := n.v.store.Lstat(newP); err == nil {
		size = st.Size
	}
	if err := n.v.sem.Rename(oldP, newP, size); errors.Is(err, semantics.ErrNotGoverned) {
		_ = n.v.sem.Remove(oldP)
	}
	n.v.forgetCreated(oldP)
	n.v.noteCreated(newP)
	return 0
}

// Symlink creates a symbolic link where the step may write.
func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if errno := checkName(name); errno != 0 {
		return nil, errno
	}
	p := n.child(name)
	if errno := n.mayWrite(p); errno != 0 {
		return nil, errno
	}
	if err := n.v.store.Symlink(target, p); err != nil {
		return nil, toErrno(err)
	}
	if errno := n.ownPath(ctx, p, syscall.S_IFLNK|0o777); errno != 0 {
		_ = n.v.store.Unlink(p)
		return nil, errno
	}
	// In a declared output the link is an output like a file: it appears complete
	// (engine Symlink), consumers see it by the rules, other nodes get the same link.
	_ = n.v.sem.Symlink(p, target)
	n.v.noteCreated(p)
	st, err := n.v.store.Lstat(p)
	if err != nil {
		return nil, toErrno(err)
	}
	return n.newChild(ctx, p, &st, out), 0
}

// Readlink reads a symbolic link.
func (n *node) Readlink(ctx context.Context) ([]byte, syscall.Errno) {
	target, err := n.v.store.Readlink(n.rel())
	if err != nil {
		return nil, toErrno(err)
	}
	return []byte(target), 0
}

// Access answers access(2): consumers may not write governed paths.
func (n *node) Access(ctx context.Context, mask uint32) syscall.Errno {
	p := n.rel()
	if mask&unix.W_OK != 0 && !n.v.producer(p) {
		return syscall.EACCES
	}
	return 0
}

// Statfs reports the store's file system.
func (n *node) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	var s syscall.Statfs_t
	if err := syscall.Statfs(n.v.store.Dir(), &s); err != nil {
		return toErrno(err)
	}
	out.FromStatfsT(&s)
	if lim := n.v.store.Limit(); lim > 0 && s.Bsize > 0 {
		bs := uint64(s.Bsize)
		total := uint64(lim) / bs
		used := uint64(n.v.store.Used()) / bs
		out.Blocks = total
		if used > total {
			used = total
		}
		out.Bfree = total - used
		out.Bavail = out.Bfree
	}
	return 0
}

// OpendirHandle opens a directory listing; see dirHandle.
func (n *node) OpendirHandle(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	p := n.rel()
	if errno := n.waitVisible(ctx, p, "opendir"); errno != 0 {
		return nil, 0, errno
	}
	res, consumer := n.consumerOf(p)
	d := &dirHandle{n: n, path: p}
	// A consumer's listing of a governed directory ends only when it is committed.
	d.stream = consumer && res.Dir == "" && res.Rule.Type == v1alpha1.FileTypeDirectory
	// A plain directory that declared inputs may still appear in ends only when they can
	// no longer appear (a shell's glob of counts/* sees every part).
	d.settle = !d.stream && len(n.v.rules.ListingRules(p, n.v.opts.Step)) > 0
	return d, fuse.FOPEN_DIRECT_IO, 0
}

// Lookup answers the lookup that READDIRPLUS makes for each listed entry
// (fs.FileLookuper), and never waits: an entry this step may open now gets its node and
// attributes; one that a lookup would wait for (a file listed by its NoUpdate directory's
// rule before its own Update commit, or removed since the scan) gets none. go-fuse then
// gives the kernel no node for it (node ID 0, which the kernel skips), so a program that
// stat()s or opens the name looks it up on its own, and waits there (node.Lookup).
func (d *dirHandle) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	p := d.n.child(name)
	st, err := d.n.v.store.Lstat(p)
	if err != nil {
		return nil, toErrno(err)
	}
	if res, consumer := d.n.consumerOf(p); consumer && st.Mode&syscall.S_IFMT != syscall.S_IFDIR &&
		!(res.Dir == "" && res.Rule.Type == v1alpha1.FileTypeDirectory) && !d.n.v.sem.CanOpen(p) {
		return nil, syscall.EAGAIN
	}
	return d.n.Lookup(ctx, name, out)
}

// The file operations below are dispatched to the handle.

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
	return toErrno(n.v.store.Fallocate(ctx, h.path, h.fd, mode, int64(off), int64(size)))
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
	if (whence == unix.SEEK_DATA || whence == unix.SEEK_HOLE) && h.path != "" && n.v.fetch != nil {
		var st syscall.Stat_t
		if err := syscall.Fstat(h.fd, &st); err != nil {
			return 0, toErrno(err)
		}
		if n.v.fetch.Remote(h.path, 0, st.Size) {
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

// LookupNode revives, on the root, a placeholder node an earlier server of the mount gave
// the kernel (fs.NodeLookupNoder, reached through a LOOKUP of "." by node ID): the new
// node stands outside the tree for the recorded path, and waits for it as the original
// did. Any other ID is ESTALE.
func (n *node) LookupNode(ctx context.Context, id uint64, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	ph, ok := n.v.placeholders.Get(id)
	if !ok || n != n.v.root {
		return nil, syscall.ESTALE
	}
	placeholderAttr(ph.Mode, &out.Attr) // as placeholder does
	out.SetEntryTimeout(0)
	out.SetAttrTimeout(0)
	return n.NewInode(ctx, &node{v: n.v, fixed: ph.Path}, fs.StableAttr{Mode: ph.Mode & syscall.S_IFMT, Ino: id}), 0
}
