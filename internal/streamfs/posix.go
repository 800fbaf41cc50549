package streamfs

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/filestate"
	"github.com/sluice-io/sluice/internal/pathpattern"
	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/store"
)

// What a view does beyond the rules to behave as a local file system (POSIX, measured
// with pjdfstest by `make conformance`): owners and modes of new entries, hard links,
// special files and extended attributes. docs/semantics.md, "Owners and permissions".

// newOwner returns the owner and group of an entry the caller of ctx creates in the
// directory parent: the caller's uid and gid, or the parent's group when the parent is
// set-group-ID (which a new directory inherits: setgid is true). -1 keeps the server's
// when the request carries no caller.
func (n *node) newOwner(ctx context.Context, parent string) (uid, gid int, setgid bool) {
	uid, gid = -1, -1
	if c, ok := fuse.FromContext(ctx); ok {
		uid, gid = int(c.Uid), int(c.Gid)
	}
	if st, err := n.v.store.Lstat(parent); err == nil && st.Mode&syscall.S_ISGID != 0 {
		gid, setgid = int(st.Gid), true
	}
	return uid, gid, setgid
}

// own gives the file p just created with descriptor fd to its creator (newOwner) with
// exactly the permission bits of mode: the kernel applied the caller's umask already, the
// server's own umask must not cut them again. The owner is set first, since chown(2)
// clears set-user-ID and set-group-ID bits.
//
// It returns whether it changed the file (its attributes read before are stale then). A
// store that keeps owners as the files' own (OwnersReal) is changed only where the file
// does not have them already (a creator of the server's own user and umask, as under
// `sluice run`, costs no chown and no chmod); st is the file's attributes as created.
func (n *node) own(ctx context.Context, p string, fd int, mode uint32, st *syscall.Stat_t) (bool, syscall.Errno) {
	uid, gid, _ := n.newOwner(ctx, parentOf(p))
	perm := mode & 0o7777
	if n.v.store.Owners() == store.OwnersReal && (uid < 0 || st.Uid == uint32(uid)) && (gid < 0 || st.Gid == uint32(gid)) {
		if st.Mode&0o7777 == perm {
			return false, 0
		}
		return true, toErrno(syscall.Fchmod(fd, perm))
	}
	if err := n.v.store.SetOwnerFd(fd, uid, gid); err != nil {
		return true, toErrno(err)
	}
	return true, toErrno(syscall.Fchmod(fd, perm))
}

// ownedStat gives the file p just opened as fd to its creator when created (own), and
// returns its attributes; on failure it closes fd.
func (n *node) ownedStat(ctx context.Context, p string, fd int, mode uint32, created bool) (syscall.Stat_t, syscall.Errno) {
	st, err := n.v.store.Fstat(fd)
	if err != nil {
		syscall.Close(fd)
		return st, toErrno(err)
	}
	if !created {
		return st, 0
	}
	changed, errno := n.own(ctx, p, fd, mode, &st)
	if errno != 0 {
		syscall.Close(fd)
		return syscall.Stat_t{}, errno
	}
	if changed {
		if st, err = n.v.store.Fstat(fd); err != nil {
			syscall.Close(fd)
			return st, toErrno(err)
		}
	}
	return st, 0
}

// ownPath is own for a directory, symlink or special file p of type and mode mode, named
// by path (a symlink's mode is not changed: it has none).
func (n *node) ownPath(ctx context.Context, p string, mode uint32) syscall.Errno {
	uid, gid, setgid := n.newOwner(ctx, parentOf(p))
	if err := n.v.store.SetOwner(p, uid, gid); err != nil {
		return toErrno(err)
	}
	typ := mode & syscall.S_IFMT
	if typ == syscall.S_IFLNK {
		return 0
	}
	perm := mode & 0o7777
	if typ == syscall.S_IFDIR && setgid {
		perm |= syscall.S_ISGID
	}
	return toErrno(n.v.store.Chmod(p, perm))
}

// parentOf returns the cleaned volume path of p's directory ("." for the root).
func parentOf(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[:i]
	}
	return "."
}

// closeSettle bounds how long an operation that needs a file committed waits for the
// commit a close of this view may still be delivering (settledStatus).
const closeSettle = time.Second

// settledStatus returns p's status for a hard link under a rule: when p is an
// uncommitted governed file this view's step writes and a close can commit (OnClose), it
// first waits, at most closeSettle, for it to commit. A close(2) returns before the
// kernel's RELEASE reaches the view and counts the close, so a program that closes a
// file and at once links it (tar -x, cp -a) would otherwise find it not committed yet.
// A file still open for writing stays uncommitted and the wait runs out; a file whose
// commit no close of it brings (OnTermination, OnFile) is not waited for.
func (v *View) settledStatus(ctx context.Context, p string) semantics.FileStatus {
	st := v.sem.Status(p)
	if !st.Governed() || st.Committed || st.IsDir || !st.Exists || !v.producer(p) || st.Commit != v1alpha1.CommitOnClose {
		return st
	}
	v.wait(ctx, v.waitOn("link", p), func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, closeSettle)
		defer cancel()
		for {
			changed := v.sem.Changed(p)
			if st = v.sem.Status(p); st.Committed {
				return nil
			}
			select {
			case <-changed:
			case <-ctx.Done():
				return nil // the status says what the operation may do
			}
		}
	})
	return st
}

// mayLinkTo reports whether a governed name may be made a new hard link to the file p of
// status st: a committed governed file (its bytes are final), or an uncommitted governed
// file this view's step instance made itself (created, renamed or linked into place), as
// tar -x and cp -a link a file they extracted into an output that commits later
// (OnTermination). The link fixes such a file's bytes: while it has more than one name,
// neither may be written or truncated (fixedByLink), so that every name, on every node,
// keeps the bytes the rules saw at the link.
func (v *View) mayLinkTo(p string, st semantics.FileStatus) bool {
	if !st.Governed() || st.IsDir || !st.Exists {
		return false
	}
	if st.Committed {
		return true
	}
	v.bmu.Lock()
	defer v.bmu.Unlock()
	return v.created[p]
}

// fixedByLink reports whether the uncommitted governed file open as fd has more than one
// name in the store (a hard link under a rule, Link): its bytes are those the rules saw
// at the link, under every name, and a write or truncation would change them behind the
// rules' back for the other names (on other nodes, each name's copy). Such a write is
// EPERM, as a committed file's; removing names until one is left makes it writable again.
func fixedByLink(fd int) bool {
	var st syscall.Stat_t
	return syscall.Fstat(fd, &st) == nil && st.Nlink > 1
}

// linkedName is fixedByLink for the store file named p (a truncate(2) by name).
func (v *View) linkedName(p string) bool {
	st, err := v.store.Lstat(p)
	return err == nil && st.Mode&syscall.S_IFMT == syscall.S_IFREG && st.Nlink > 1
}

// Link makes name a new hard link to target. Where no rule governs either name it is a
// plain link. A governed name may only be a new name for the bytes of a governed file
// that is committed or that this step instance made (mayLinkTo): the rules see it appear
// complete with the bytes the file has now (Semantics.Link), it commits by its own rule,
// and other nodes make the same link to their copy. An unnamed file (O_TMPFILE) is linked
// by linkTmpfile. Anything else is EPERM: an ungoverned name for a governed file would
// let its bytes change outside the rules, and a governed name for bytes the rules never
// saw written could not commit by them. A link to a file that can never be complete
// (poisoned by a failed write) is EIO.
func (n *node) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if errno := checkName(name); errno != 0 {
		return nil, errno
	}
	src, ok := target.(*node)
	if !ok {
		return nil, syscall.EXDEV
	}
	if src.unnamed() {
		return n.linkTmpfile(ctx, src, name, out)
	}
	oldP, newP := src.rel(), n.child(name)
	if errno := n.mayWrite(newP); errno != 0 {
		return nil, errno
	}
	governed := n.v.rules.Resolve(newP).Governed()
	var srcStatus semantics.FileStatus
	if governed {
		srcStatus = n.v.settledStatus(ctx, oldP)
	} else {
		srcStatus = n.v.sem.Status(oldP)
	}
	switch {
	case !governed && !srcStatus.Governed():
	case governed && n.v.mayLinkTo(oldP, srcStatus):
	default:
		return nil, syscall.EPERM
	}
	if err := n.v.store.Link(oldP, newP); err != nil {
		return nil, toErrno(err)
	}
	if governed {
		// A new name for bytes final from now on: the rules see it appear complete, and
		// other nodes make the same link to their copy (semantics.Engine.Link).
		if err := n.v.sem.Link(oldP, newP, srcStatus.Size); err != nil {
			n.v.opts.Log.Error(err, "hard link under a rule", "path", pathpattern.Printable(newP), "target", pathpattern.Printable(oldP))
			_, _ = n.v.store.Remove(newP)
			return nil, syscall.EIO
		}
		n.v.noteCreated(newP)
	}
	return n.linked(ctx, newP, false, out)
}

// linked finishes a link just made under newP in the store and returns its node. With
// governed, newP appears complete to the rules with the bytes it names (appearComplete:
// they travel as a file's) and is the step's own (noteCreated); if the rules refuse it,
// the name is removed again and the link fails with EIO.
func (n *node) linked(ctx context.Context, newP string, governed bool, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if governed {
		if err := n.v.appearComplete(newP); err != nil {
			n.v.opts.Log.Error(err, "hard link under a rule", "path", pathpattern.Printable(newP))
			_, _ = n.v.store.Remove(newP)
			return nil, syscall.EIO
		}
		n.v.noteCreated(newP)
	}
	st, err := n.v.store.Lstat(newP)
	if err != nil {
		return nil, toErrno(err)
	}
	return n.newChild(ctx, newP, &st, out), 0
}

// appearComplete tells the rules that the governed file p, already in the store with its
// final bytes, was created, written whole and closed once, as a producer writing it would
// have; a DataSink receives its bytes.
func (v *View) appearComplete(p string) error {
	if err := v.sem.Create(p, false); err != nil {
		return err
	}
	f, err := v.store.OpenFile(p, unix.O_RDONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	ds, _ := v.sem.(filestate.DataSink)
	buf := make([]byte, 1<<20)
	var off int64
	for {
		k, err := f.ReadAt(buf, off)
		if k > 0 {
			if werr := v.sem.Write(p, off, int64(k)); werr != nil {
				return werr
			}
			if ds != nil {
				ds.Wrote(p, off, buf[:k])
			}
			off += int64(k)
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
	}
	return v.sem.Close(p)
}

// Mknod makes a FIFO, socket, device or empty regular file where no rule governs the
// name (EPERM under a rule: the rules know regular files, directories and symlinks
// only), owned by the caller with exactly mode's permission bits.
func (n *node) Mknod(ctx context.Context, name string, mode uint32, dev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	if errno := checkName(name); errno != 0 {
		return nil, errno
	}
	p := n.child(name)
	if n.v.rules.Resolve(p).Governed() {
		return nil, syscall.EPERM
	}
	if errno := n.mayWrite(p); errno != 0 {
		return nil, errno
	}
	if err := n.v.store.Mknod(p, mode, int(dev)); err != nil {
		return nil, n.v.makeErrno("mknod", p, err)
	}
	if errno := n.ownPath(ctx, p, mode); errno != 0 {
		_, _ = n.v.store.Remove(p)
		return nil, errno
	}
	st, err := n.v.store.Lstat(p)
	if err != nil {
		return nil, toErrno(err)
	}
	return n.newChild(ctx, p, &st, out), 0
}

// Extended attributes: a view has the user.* namespace only (xattr(7)). Other namespaces
// are absent (ENODATA) and cannot be set (EOPNOTSUPP): the server is privileged, and
// trusted.* or security.* set through it would be set with its privileges. The store's
// own user.sluice.* attributes (store.OwnerXattr) are hidden: never listed, ENODATA to
// read, EPERM to set or remove.

const userXattrs = "user."

func hiddenXattr(name string) bool { return strings.HasPrefix(name, "user.sluice.") }

// Getxattr reads the attribute attr into dest (empty dest: its size), in bytes.
func (n *node) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	if !strings.HasPrefix(attr, userXattrs) || hiddenXattr(attr) {
		return 0, syscall.ENODATA
	}
	k, err := n.v.store.Getxattr(n.rel(), attr, dest)
	return uint32(max(k, 0)), toErrno(err)
}

// mayChangeXattrs checks that this view's step may change p's attributes: anyone the
// kernel let through where no rule governs p, only its producer where one does.
func (n *node) mayChangeXattrs(attr, p string) syscall.Errno {
	switch {
	case !strings.HasPrefix(attr, userXattrs):
		return syscall.EOPNOTSUPP
	case hiddenXattr(attr), !n.v.producer(p):
		return syscall.EPERM
	}
	return 0
}

// Setxattr sets attr to data (flags: XATTR_CREATE, XATTR_REPLACE).
func (n *node) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	p := n.rel()
	if errno := n.mayChangeXattrs(attr, p); errno != 0 {
		return errno
	}
	return toErrno(n.v.store.Setxattr(p, attr, data, int(flags)))
}

// Removexattr removes attr.
func (n *node) Removexattr(ctx context.Context, attr string) syscall.Errno {
	p := n.rel()
	if errno := n.mayChangeXattrs(attr, p); errno != 0 {
		return errno
	}
	return toErrno(n.v.store.Removexattr(p, attr))
}

// Listxattr lists the visible attribute names, each NUL-terminated, into dest (empty
// dest: the list's size in bytes; too small: ERANGE).
func (n *node) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	p := n.rel()
	size, err := n.v.store.Listxattr(p, nil)
	if err != nil {
		return 0, toErrno(err)
	}
	all := make([]byte, size)
	if size, err = n.v.store.Listxattr(p, all); err != nil {
		return 0, toErrno(err)
	}
	var list []byte
	for _, name := range bytes.Split(all[:size], []byte{0}) {
		if s := string(name); strings.HasPrefix(s, userXattrs) && !hiddenXattr(s) {
			list = append(append(list, name...), 0)
		}
	}
	if len(dest) == 0 {
		return uint32(len(list)), 0
	}
	if len(dest) < len(list) {
		return 0, syscall.ERANGE
	}
	return uint32(copy(dest, list)), 0
}
