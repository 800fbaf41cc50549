package streamfs

import (
	"context"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/sluice-io/sluice/api/v1alpha1"
)

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
		return nil, n.v.makeErrno("mkdir", p, err)
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
	if err := n.v.files.Remove(p); err != nil {
		return toErrno(err)
	}
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
		if n.v.rules.Resolve(oldP).Governed() || n.v.rules.Resolve(newP).Governed() {
			return syscall.EINVAL
		}
		return toErrno(n.v.rename(oldP, newP, unix.RENAME_EXCHANGE))
	}
	if !n.v.mayRenameAway(oldP) {
		if errno := n.mayWrite(oldP); errno != 0 {
			return errno
		}
	}
	if errno := n.mayWrite(newP); errno != 0 {
		return errno
	}
	// The name, its accounting and the rules together; a name no rule governs takes the
	// old one out of the rules (store.Files.Rename). The view's open handles of the file
	// (or beneath the directory) take the new name (View.rename).
	if err := n.v.rename(oldP, newP, uint(flags)); err != nil {
		return toErrno(err)
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
		return nil, n.v.makeErrno("symlink", p, err)
	}
	if errno := n.ownPath(ctx, p, syscall.S_IFLNK|0o777); errno != 0 {
		_, _ = n.v.store.Remove(p)
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
