package streamfs

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// tmpfile is what a node made by open(2) with O_TMPFILE keeps: a store file with no name,
// reached through the node's own descriptor until the kernel forgets the node. Until it is
// linked into place no rule governs it (it is nobody's output and nobody's input); linked
// under a name, it is that name's file.
type tmpfile struct {
	fd  int    // the node's descriptor of the file, closed at OnForget
	key string // the node store's accounting key while it has no name

	mu   sync.Mutex
	name string // the volume path it was linked to; "" while unnamed
}

// named returns the volume path the file was linked to, if it was.
func (t *tmpfile) named() (string, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.name, t.name != ""
}

// unnamed reports whether n is an O_TMPFILE file that has no name yet: its requests are
// served through its descriptor, since it has no path in the store.
func (n *node) unnamed() bool {
	if n.tmp == nil {
		return false
	}
	_, linked := n.tmp.named()
	return !linked
}

var (
	_ fs.NodeTmpfiler    = (*node)(nil)
	_ fs.NodeOnForgetter = (*node)(nil)
)

// tmpfileProbe is the name whose rule decides whether a step may make unnamed files in a
// directory: where it could create a file no rule governs, or one of its outputs.
const tmpfileProbe = ".sluice-tmpfile"

// Tmpfile makes an unnamed file in this directory (open(2) with O_TMPFILE), where the step
// could create a file (else EACCES, as for a consumer's inputs). It is a plain file of the
// node store, owned by its creator, counted in the store's size; the rules see it only if
// it is linked into place under a governed name (linkTmpfile), where it appears complete,
// like a temporary renamed into place.
func (n *node) Tmpfile(ctx context.Context, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	probe := n.child(tmpfileProbe)
	if !n.v.producer(probe) {
		return nil, nil, 0, syscall.EACCES
	}
	open := int(flags) & (syscall.O_ACCMODE | syscall.O_EXCL)
	fd, err := n.v.store.OpenTmpfile(n.rel(), open, mode&0o7777)
	if err != nil {
		return nil, nil, 0, n.v.makeErrno("O_TMPFILE", n.rel(), err)
	}
	st, errno := n.ownedStat(ctx, probe, fd, mode, true)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	keep, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		syscall.Close(fd)
		return nil, nil, 0, toErrno(err)
	}
	child := &node{v: n.v, tmp: &tmpfile{fd: keep, key: fmt.Sprintf("\x00tmpfile/%d", st.Ino)}}
	out.Attr.FromStat(&st)
	out.SetEntryTimeout(0)
	out.SetAttrTimeout(0)
	ch := n.NewInode(ctx, child, fs.StableAttr{Mode: syscall.S_IFREG, Ino: st.Ino})
	write := open&syscall.O_ACCMODE != syscall.O_RDONLY
	return ch, &handle{n: child, fd: fd, write: write, kind: kindTmpfile}, fuse.FOPEN_NOFLUSH, 0
}

// OnForget closes the descriptor of an O_TMPFILE file when the kernel forgets it; one
// never linked then leaves the store's accounting (its bytes are freed with its last
// descriptor).
func (n *node) OnForget() {
	if n.tmp == nil {
		return
	}
	syscall.Close(n.tmp.fd)
	if _, linked := n.tmp.named(); !linked {
		n.v.anon.Drop(n.tmp.key)
	}
}

// tmpGetattr answers stat(2) of an unnamed file from its descriptor.
func (n *node) tmpGetattr(out *fuse.AttrOut) syscall.Errno {
	st, err := n.v.store.Fstat(n.tmp.fd)
	if err != nil {
		return toErrno(err)
	}
	out.Attr.FromStat(&st)
	out.SetTimeout(0)
	return 0
}

// tmpSetattr changes an unnamed file through its descriptor: size (counted in the store),
// owner, then mode, then times. The kernel has checked the caller's rights.
func (n *node) tmpSetattr(ctx context.Context, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	fd := n.tmp.fd
	if sz, ok := in.GetSize(); ok {
		if err := n.v.anon.Truncate(n.tmp.key, fd, int64(sz)); err != nil {
			return toErrno(err)
		}
	}
	proc := "/proc/self/fd/" + strconv.Itoa(fd)
	if errno := setMeta(in, func(u, g int) error { return n.v.store.SetOwnerFd(fd, u, g) },
		func(mode uint32) error { return syscall.Fchmod(fd, mode) },
		func(ts []unix.Timespec) error { return unix.UtimesNanoAt(unix.AT_FDCWD, proc, ts, 0) }); errno != 0 {
		return errno
	}
	return n.tmpGetattr(out)
}

// tmpOpen opens an unnamed file again (open(2) of /proc/PID/fd/N of it).
func (n *node) tmpOpen(flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	fd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(n.tmp.fd), int(flags)&^(syscall.O_CREAT|syscall.O_EXCL|syscall.O_NONBLOCK)|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, 0, toErrno(err)
	}
	write := flags&syscall.O_ACCMODE != syscall.O_RDONLY
	return &handle{n: n, fd: fd, write: write, kind: kindTmpfile}, fuse.FOPEN_NOFLUSH, 0
}

// linkTmpfile gives the unnamed file src the name name in this directory (linkat(2) of
// /proc/self/fd/N). Under a governed name, which must be one of the step's outputs, the
// file appears complete, as a temporary renamed into place does (appearComplete): its
// bytes are final from then on, and writes through its descriptors get EPERM.
func (n *node) linkTmpfile(ctx context.Context, src *node, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	newP := n.child(name)
	if errno := n.mayWrite(newP); errno != 0 {
		return nil, errno
	}
	if err := n.v.anon.LinkFd(src.tmp.fd, src.tmp.key, newP); err != nil {
		return nil, toErrno(err)
	}
	src.tmp.mu.Lock()
	src.tmp.name = newP
	src.tmp.mu.Unlock()
	return n.linked(ctx, newP, n.v.rules.Resolve(newP).Governed(), out)
}

// anonWrite writes to an O_TMPFILE file: no rule sees its bytes while it has no name,
// and once linked under a governed name it is complete (EPERM).
func (h *handle) anonWrite(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	v, t := h.n.v, h.n.tmp
	key := t.key
	if name, linked := t.named(); linked {
		if v.rules.Resolve(name).Governed() {
			return 0, syscall.EPERM
		}
		key = name
	}
	k, err := v.anon.WriteAt(ctx, key, h.fd, data, off)
	if err != nil && k == 0 {
		return 0, toErrno(err)
	}
	v.bytesWritten.Add(int64(k))
	return uint32(k), 0
}
