package streamfs

import (
	"context"
	"fmt"
	"path"
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
	return res, res.Governed() && !n.v.producer(p)
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
			if s := n.v.sem.Status(p); s.Governed() && !s.Committed {
				// Its link count still grows with each subdirectory made in it: a consumer
				// asks again at each stat until the commit, so that what it sees once the
				// directory is committed (tar, after listing it) is the final count.
				return 0
			}
		}
		return dirAttrTimeout
	}
	s := n.v.sem.Status(p)
	if !s.Governed() {
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
	if st.Mode&(syscall.S_ISUID|syscall.S_ISGID) == 0 && n.v.writesAlone(p, s.Resolution) {
		// Only this view changes the file, and the kernel hears of every change it
		// makes (a write marks the size and times stale; a withdrawal invalidates):
		// the writer's own fstat after its open, and its path walks, need not ask. Not
		// so with set-ID bits: a write by another user clears them in the server
		// (FUSE_WRITE_KILL_SUIDGID), which the kernel does not mark stale.
		return ownAttrTimeout
	}
	return 0
}

// ownAttrTimeout is how long the kernel may cache the attributes and entry of a file
// being written that no view but the one writing it can change (View.writesAlone).
const ownAttrTimeout = time.Second

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
	if st.Mode&syscall.S_IFMT == syscall.S_IFREG {
		parent := n.StableAttr().Ino
		if n.IsRoot() {
			parent = fuse.FUSE_ROOT_ID
		}
		if batch := n.v.entries.handed(st.Ino, parent, path.Base(p)); batch != nil {
			n.v.prune(batch)
		}
	}
	return n.NewInode(ctx, &node{v: n.v}, fs.StableAttr{Mode: st.Mode & syscall.S_IFMT, Ino: st.Ino})
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
		if toErrno(err) == syscall.ENOENT && n.v.rules.ImpliedDir(p, n.v.opts.Step) && !n.v.rules.Resolve(p).Governed() {
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
		n.v.refuseUndeclared(p)
		return syscall.EACCES
	}
	if s := n.v.sem.Status(p); s.Governed() && s.Committed && !s.IsDir {
		hint := "a committed file never changes again"
		if s.Commit == v1alpha1.CommitOnClose {
			nth := "first close"
			if s.Count > 1 {
				nth = fmt.Sprintf("close number %d", s.Count)
			}
			hint = "an OnClose file commits at its " + nth + ", summed over writers and opens " +
				"(`echo a > f; echo b >> f` opens it twice): write it through one open (`{ echo a; echo b; } > f`) or declare commit.count"
		}
		n.v.opts.Log.Error(nil, "change refused: the file is committed and never changes again",
			"path", pathpattern.Printable(p), "rule", s.Rule.String(), "step", n.v.opts.Step, "instance", n.v.opts.Instance, "hint", hint)
		n.v.refuse("change of committed "+s.Describe(), hint)
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
	if h != nil && h.kind != kindTmpfile {
		// Through a handle: the name the file has now, kept until the change is told.
		h.moving.RLock()
		defer h.moving.RUnlock()
		p = h.path()
	}
	sz, sizing := in.GetSize()
	if sizing {
		if errno := n.mayWrite(p); errno != 0 {
			return errno
		}
		if n.v.rules.Resolve(p).Governed() && n.v.linkedName(p) {
			return syscall.EPERM // its bytes are fixed by a hard link (fixedByLink)
		}
	} else if !n.v.producer(p) {
		return syscall.EPERM
	}
	if sizing {
		// A truncation allocates nothing: growing leaves a hole (written later, its bytes
		// are reserved then), shrinking frees what lay past the new end
		// (store.Files.Truncate, which also tells the semantics).
		fd := -1
		if h != nil {
			fd = h.fd
		}
		if err := n.v.files.Truncate(p, fd, int64(sz)); err != nil {
			return toErrno(err)
		}
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
