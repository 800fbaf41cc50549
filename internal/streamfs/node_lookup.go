package streamfs

import (
	"context"
	"fmt"
	"strings"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/pathpattern"
	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/takeover"
)

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
	isDir := consumer && res.Dir == "" && res.Rule.Type == v1alpha1.FileTypeDirectory
	// Whether a consumer may see p is decided before its attributes are read: a file that
	// commits between the two is then answered with what it holds once committed (its
	// final size, cached for CommittedTimeout), never with the attributes it had before
	// (an Update input answered empty: read(2) got EOF at once where passthrough was off,
	// and stat said 0 bytes with it on).
	vis := consumer && n.visible(p, isDir)
	st, err := n.v.store.Lstat(p)
	if !consumer {
		if err == nil {
			return n.newChild(ctx, p, &st, out), 0
		}
		if errno := toErrno(err); errno != syscall.ENOENT || res.Governed() {
			return nil, errno
		}
		if len(n.v.rules.ListingRules(p, n.v.opts.Step)) == 0 {
			if !n.v.rules.ImpliedDir(p, n.v.opts.Step) {
				// A step that makes files there and reads none: it creates the directory.
				return nil, syscall.ENOENT
			}
			// A step that declares no input there sees the directory (empty) before the
			// producer creates it, so that its lookups of governed files in it can wait
			// and it may make plain files in it.
			return n.placeholder(ctx, p, syscall.S_IFDIR|0o555, out), 0
		}
		// A directory that governed files this step declares as inputs will live in: the
		// lookup waits until it exists (waitImpliedDir), so that the step sees the
		// directory's own inode and times, never a stand-in's. So does a step that also
		// writes outputs there (an index beside its data: tabix writes x.tbi next to x):
		// the directory comes with its inputs, whoever makes it first.
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
	if err == nil && (vis || res.Dir != "" && st.Mode&syscall.S_IFMT == syscall.S_IFDIR) {
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
