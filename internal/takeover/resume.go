package takeover

import (
	"math/rand/v2"
	"strings"
	"sync"
	"syscall"

	"github.com/go-logr/logr"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// resumer sits between the kernel and go-fuse's node bridge so that a server taking over
// a mount from an earlier one (a restarted sidecar, Options.Init set) serves the
// node IDs and file handles the kernel got from that earlier server, instead of failing
// them with EIO: the app sees a stall while no server runs, then its open files keep
// working.
//
// Node IDs are the store's inode numbers (fs.Options.ExternalNodeID), the same in every
// server; a node the bridge does not know is revived by looking its store path up from
// the root, one component at a time, as the kernel would. File handles are tagged with the
// server's generation in their high 32 bits; a handle of another generation is reopened
// (read or write, file or directory, as the request needs) and released when the kernel
// releases it. The resumer counts the lookups the bridge has given the kernel per node, so
// that a FORGET counting an earlier server's lookups too forgets only what the bridge
// holds.
//
// The kernel must not be offered READDIRPLUS (fuse.MountOptions.DisableReadDirPlus): its
// entries carry node IDs the resumer would not see.
type resumer struct {
	fuse.RawFileSystem
	gen   uint64                          // this server's handle generation, in the high 32 bits
	paths func(ino uint64) (string, bool) // the store path (cleaned, relative) of an inode
	log   logr.Logger

	mu       sync.Mutex
	lookups  map[uint64]uint64 // node ID -> lookups the bridge counts for it
	reopened map[reopenKey]reopenedHandle

	reviveMu sync.Mutex // one revival at a time
}

// reopenKey names a handle of an earlier server reopened for one kind of access.
type reopenKey struct {
	fh         uint64
	write, dir bool
}

// reopenedHandle is the bridge's handle for a reopened one, and its node.
type reopenedHandle struct {
	fh, node uint64
}

const handleMask = 1<<32 - 1

func newResumer(inner fuse.RawFileSystem, paths func(uint64) (string, bool), log logr.Logger) *resumer {
	return &resumer{
		RawFileSystem: inner, gen: uint64(rand.Uint32()|1) << 32, paths: paths, log: log,
		lookups: map[uint64]uint64{}, reopened: map[reopenKey]reopenedHandle{},
	}
}

// entered records a reply carrying a node entry: the bridge counts one more lookup.
func (r *resumer) entered(st fuse.Status, out *fuse.EntryOut) {
	if !st.Ok() || out.NodeId == 0 || out.NodeId == fuse.FUSE_ROOT_ID {
		return
	}
	r.mu.Lock()
	r.lookups[out.NodeId]++
	r.mu.Unlock()
}

// known makes sure the bridge knows node id, reviving it if it was an earlier server's.
func (r *resumer) known(id uint64) bool {
	if id == fuse.FUSE_ROOT_ID || id == 0 {
		return true
	}
	r.mu.Lock()
	ok := r.lookups[id] > 0
	r.mu.Unlock()
	if ok {
		return true
	}
	r.reviveMu.Lock()
	defer r.reviveMu.Unlock()
	r.mu.Lock()
	ok = r.lookups[id] > 0
	r.mu.Unlock()
	if ok {
		return true
	}
	if IsPlaceholder(id) {
		// Not in the store: the view recreates it by ID (fs.NodeLookupNoder on its root)
		// from what the earlier server recorded (NodeLog).
		var out fuse.EntryOut
		st := r.RawFileSystem.Lookup(nil, &fuse.InHeader{NodeId: id}, ".", &out)
		r.entered(st, &out)
		if !st.Ok() || out.NodeId != id {
			r.log.Info("could not revive a placeholder node of an earlier server", "node", id, "status", st.String())
			return false
		}
		r.log.V(1).Info("revived a placeholder node of an earlier server", "node", id)
		return true
	}
	p, found := r.paths(id)
	if !found {
		r.log.Info("the kernel names a node of an earlier server that is not in the store", "node", id)
		return false
	}
	parent := uint64(fuse.FUSE_ROOT_ID)
	for _, name := range strings.Split(p, "/") {
		var out fuse.EntryOut
		st := r.RawFileSystem.Lookup(nil, &fuse.InHeader{NodeId: parent}, name, &out)
		r.entered(st, &out)
		if !st.Ok() || out.NodeId == 0 {
			r.log.Info("could not revive a node of an earlier server", "node", id, "path", p, "component", name, "status", st.String())
			return false
		}
		parent = out.NodeId
	}
	if parent != id {
		r.log.Info("a node of an earlier server resolved to another node", "node", id, "path", p, "got", parent)
		return false
	}
	r.log.V(1).Info("revived a node of an earlier server", "node", id, "path", p)
	return true
}

// handle returns the bridge's handle for kernel handle fh of node: this server's, or an
// earlier server's reopened for write or read (dir: a directory handle).
func (r *resumer) handle(fh, node uint64, write, dir bool) (uint64, bool) {
	if fh == 0 {
		return 0, true
	}
	if fh&^handleMask == r.gen {
		return fh & handleMask, true
	}
	key := reopenKey{fh, write, dir}
	r.mu.Lock()
	h, ok := r.reopened[key]
	r.mu.Unlock()
	if ok {
		return h.fh, true
	}
	if !r.known(node) {
		return 0, false
	}
	flags := uint32(syscall.O_RDONLY)
	if write {
		flags = syscall.O_WRONLY
	}
	in := &fuse.OpenIn{InHeader: fuse.InHeader{NodeId: node}, Flags: flags}
	var out fuse.OpenOut
	var st fuse.Status
	if dir {
		st = r.RawFileSystem.OpenDir(nil, in, &out)
	} else {
		st = r.RawFileSystem.Open(nil, in, &out)
	}
	if !st.Ok() {
		r.log.Info("could not reopen a file handle of an earlier server", "node", node, "write", write, "status", st.String())
		return 0, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if h, ok := r.reopened[key]; ok { // reopened concurrently: keep one
		go r.release(reopenedHandle{out.Fh, node}, flags, dir)
		return h.fh, true
	}
	r.reopened[key] = reopenedHandle{out.Fh, node}
	r.log.V(1).Info("reopened a file handle of an earlier server", "node", node, "write", write, "dir", dir)
	return out.Fh, true
}

// retag replaces the kernel's handle *fh with the bridge's (see handle); false: it cannot
// be served.
func (r *resumer) retag(fh *uint64, node uint64, write, dir bool) bool {
	h, ok := r.handle(*fh, node, write, dir)
	*fh = h
	return ok
}

func (r *resumer) release(h reopenedHandle, flags uint32, dir bool) {
	in := &fuse.ReleaseIn{InHeader: fuse.InHeader{NodeId: h.node}, Fh: h.fh, Flags: flags}
	if dir {
		r.RawFileSystem.ReleaseDir(in)
	} else {
		r.RawFileSystem.Release(nil, in)
	}
}

// opened tags the handle of a successful open with the generation.
func (r *resumer) opened(st fuse.Status, out *fuse.OpenOut) {
	if st.Ok() && out.Fh != 0 {
		out.Fh |= r.gen
	}
}

var errStale = fuse.Status(syscall.EIO)

func (r *resumer) Lookup(cancel <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	if !r.known(h.NodeId) {
		return errStale
	}
	st := r.RawFileSystem.Lookup(cancel, h, name, out)
	r.entered(st, out)
	return st
}

// Forget forgets at most the lookups the bridge holds: the kernel's count also holds
// those of earlier servers.
func (r *resumer) Forget(id, nlookup uint64) {
	if id == fuse.FUSE_ROOT_ID {
		r.RawFileSystem.Forget(id, nlookup)
		return
	}
	r.mu.Lock()
	n := min(nlookup, r.lookups[id])
	if n == r.lookups[id] {
		delete(r.lookups, id)
	} else {
		r.lookups[id] -= n
	}
	r.mu.Unlock()
	if n > 0 {
		r.RawFileSystem.Forget(id, n)
	}
}

func (r *resumer) GetAttr(cancel <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	if !r.known(in.NodeId) {
		return errStale
	}
	if in.Flags_&fuse.FUSE_GETATTR_FH != 0 {
		if in.Fh_&^handleMask == r.gen {
			in.Fh_ &= handleMask
		} else { // an earlier server's handle: the attributes are the node's
			in.Flags_ &^= fuse.FUSE_GETATTR_FH
			in.Fh_ = 0
		}
	}
	return r.RawFileSystem.GetAttr(cancel, in, out)
}

func (r *resumer) SetAttr(cancel <-chan struct{}, in *fuse.SetAttrIn, out *fuse.AttrOut) fuse.Status {
	if !r.known(in.NodeId) {
		return errStale
	}
	if in.Valid&fuse.FATTR_FH != 0 {
		if in.Fh&^handleMask == r.gen {
			in.Fh &= handleMask
		} else {
			in.Valid &^= fuse.FATTR_FH
			in.Fh = 0
		}
	}
	return r.RawFileSystem.SetAttr(cancel, in, out)
}

func (r *resumer) Mknod(cancel <-chan struct{}, in *fuse.MknodIn, name string, out *fuse.EntryOut) fuse.Status {
	if !r.known(in.NodeId) {
		return errStale
	}
	st := r.RawFileSystem.Mknod(cancel, in, name, out)
	r.entered(st, out)
	return st
}

func (r *resumer) Mkdir(cancel <-chan struct{}, in *fuse.MkdirIn, name string, out *fuse.EntryOut) fuse.Status {
	if !r.known(in.NodeId) {
		return errStale
	}
	st := r.RawFileSystem.Mkdir(cancel, in, name, out)
	r.entered(st, out)
	return st
}

func (r *resumer) Unlink(cancel <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	if !r.known(h.NodeId) {
		return errStale
	}
	return r.RawFileSystem.Unlink(cancel, h, name)
}

func (r *resumer) Rmdir(cancel <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	if !r.known(h.NodeId) {
		return errStale
	}
	return r.RawFileSystem.Rmdir(cancel, h, name)
}

func (r *resumer) Rename(cancel <-chan struct{}, in *fuse.RenameIn, oldName, newName string) fuse.Status {
	if !r.known(in.NodeId) || !r.known(in.Newdir) {
		return errStale
	}
	return r.RawFileSystem.Rename(cancel, in, oldName, newName)
}

func (r *resumer) Link(cancel <-chan struct{}, in *fuse.LinkIn, name string, out *fuse.EntryOut) fuse.Status {
	if !r.known(in.NodeId) || !r.known(in.Oldnodeid) {
		return errStale
	}
	st := r.RawFileSystem.Link(cancel, in, name, out)
	r.entered(st, out)
	return st
}

func (r *resumer) Symlink(cancel <-chan struct{}, h *fuse.InHeader, target, name string, out *fuse.EntryOut) fuse.Status {
	if !r.known(h.NodeId) {
		return errStale
	}
	st := r.RawFileSystem.Symlink(cancel, h, target, name, out)
	r.entered(st, out)
	return st
}

func (r *resumer) Readlink(cancel <-chan struct{}, h *fuse.InHeader) ([]byte, fuse.Status) {
	if !r.known(h.NodeId) {
		return nil, errStale
	}
	return r.RawFileSystem.Readlink(cancel, h)
}

// The extended-attribute requests name a node like the others: the kernel asks
// security.capability of a file an app held open across the restart before its next
// cached write, and go-fuse's bridge panics on a node it does not know.

func (r *resumer) GetXAttr(cancel <-chan struct{}, h *fuse.InHeader, attr string, dest []byte) (uint32, fuse.Status) {
	if !r.known(h.NodeId) {
		return 0, errStale
	}
	return r.RawFileSystem.GetXAttr(cancel, h, attr, dest)
}

func (r *resumer) ListXAttr(cancel <-chan struct{}, h *fuse.InHeader, dest []byte) (uint32, fuse.Status) {
	if !r.known(h.NodeId) {
		return 0, errStale
	}
	return r.RawFileSystem.ListXAttr(cancel, h, dest)
}

func (r *resumer) SetXAttr(cancel <-chan struct{}, in *fuse.SetXAttrIn, attr string, data []byte) fuse.Status {
	if !r.known(in.NodeId) {
		return errStale
	}
	return r.RawFileSystem.SetXAttr(cancel, in, attr, data)
}

func (r *resumer) RemoveXAttr(cancel <-chan struct{}, h *fuse.InHeader, attr string) fuse.Status {
	if !r.known(h.NodeId) {
		return errStale
	}
	return r.RawFileSystem.RemoveXAttr(cancel, h, attr)
}

func (r *resumer) Access(cancel <-chan struct{}, in *fuse.AccessIn) fuse.Status {
	if !r.known(in.NodeId) {
		return errStale
	}
	return r.RawFileSystem.Access(cancel, in)
}

func (r *resumer) Create(cancel <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	if !r.known(in.NodeId) {
		return errStale
	}
	st := r.RawFileSystem.Create(cancel, in, name, out)
	r.entered(st, &out.EntryOut)
	r.opened(st, &out.OpenOut)
	return st
}

func (r *resumer) Tmpfile(cancel <-chan struct{}, in *fuse.CreateIn, out *fuse.CreateOut) fuse.Status {
	if !r.known(in.NodeId) {
		return errStale
	}
	st := r.RawFileSystem.Tmpfile(cancel, in, out)
	r.entered(st, &out.EntryOut)
	r.opened(st, &out.OpenOut)
	return st
}

func (r *resumer) Open(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	if !r.known(in.NodeId) {
		return errStale
	}
	st := r.RawFileSystem.Open(cancel, in, out)
	r.opened(st, out)
	return st
}

func (r *resumer) OpenDir(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	if !r.known(in.NodeId) {
		return errStale
	}
	st := r.RawFileSystem.OpenDir(cancel, in, out)
	r.opened(st, out)
	return st
}

func (r *resumer) Read(cancel <-chan struct{}, in *fuse.ReadIn, buf []byte) (fuse.ReadResult, fuse.Status) {
	if !r.retag(&in.Fh, in.NodeId, false, false) {
		return nil, errStale
	}
	return r.RawFileSystem.Read(cancel, in, buf)
}

func (r *resumer) Lseek(cancel <-chan struct{}, in *fuse.LseekIn, out *fuse.LseekOut) fuse.Status {
	if !r.retag(&in.Fh, in.NodeId, false, false) {
		return errStale
	}
	return r.RawFileSystem.Lseek(cancel, in, out)
}

func (r *resumer) GetLk(cancel <-chan struct{}, in *fuse.LkIn, out *fuse.LkOut) fuse.Status {
	if !r.retag(&in.Fh, in.NodeId, false, false) {
		return errStale
	}
	return r.RawFileSystem.GetLk(cancel, in, out)
}

func (r *resumer) SetLk(cancel <-chan struct{}, in *fuse.LkIn) fuse.Status {
	if !r.retag(&in.Fh, in.NodeId, false, false) {
		return errStale
	}
	return r.RawFileSystem.SetLk(cancel, in)
}

func (r *resumer) SetLkw(cancel <-chan struct{}, in *fuse.LkIn) fuse.Status {
	if !r.retag(&in.Fh, in.NodeId, false, false) {
		return errStale
	}
	return r.RawFileSystem.SetLkw(cancel, in)
}

// Release releases a handle; for an earlier server's handle, the reopened ones, and, if
// it was open for writing, counts its close (CAPIO-CL on_close) through a write handle.
func (r *resumer) Release(cancel <-chan struct{}, in *fuse.ReleaseIn) {
	if in.Fh == 0 || in.Fh&^handleMask == r.gen {
		in.Fh &= handleMask
		r.RawFileSystem.Release(cancel, in)
		return
	}
	if in.Flags&syscall.O_ACCMODE != syscall.O_RDONLY {
		r.handle(in.Fh, in.NodeId, true, false) // the close of a writer counts
	}
	r.releaseReopened(in.Fh, false)
}

func (r *resumer) ReleaseDir(in *fuse.ReleaseIn) {
	if in.Fh == 0 || in.Fh&^handleMask == r.gen {
		in.Fh &= handleMask
		r.RawFileSystem.ReleaseDir(in)
		return
	}
	r.releaseReopened(in.Fh, true)
}

func (r *resumer) releaseReopened(fh uint64, dir bool) {
	for _, write := range []bool{false, true} {
		key := reopenKey{fh, write, dir}
		r.mu.Lock()
		h, ok := r.reopened[key]
		delete(r.reopened, key)
		r.mu.Unlock()
		if ok {
			flags := uint32(syscall.O_RDONLY)
			if write {
				flags = syscall.O_WRONLY
			}
			r.release(h, flags, dir)
		}
	}
}

func (r *resumer) Write(cancel <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	if !r.retag(&in.Fh, in.NodeId, true, false) {
		return 0, errStale
	}
	return r.RawFileSystem.Write(cancel, in, data)
}

func (r *resumer) Writev(cancel <-chan struct{}, in *fuse.WriteIn, data [][]byte) (uint32, fuse.Status) {
	if !r.retag(&in.Fh, in.NodeId, true, false) {
		return 0, errStale
	}
	return r.RawFileSystem.Writev(cancel, in, data)
}

func (r *resumer) CopyFileRange(cancel <-chan struct{}, in *fuse.CopyFileRangeIn) (uint32, fuse.Status) {
	fin, ok := r.handle(in.FhIn, in.NodeId, false, false)
	if !ok {
		return 0, errStale
	}
	fout, ok := r.handle(in.FhOut, in.NodeIdOut, true, false)
	if !ok {
		return 0, errStale
	}
	in.FhIn, in.FhOut = fin, fout
	return r.RawFileSystem.CopyFileRange(cancel, in)
}

func (r *resumer) Ioctl(cancel <-chan struct{}, in *fuse.IoctlIn, inbuf []byte, out *fuse.IoctlOut, outbuf []byte) fuse.Status {
	if !r.retag(&in.Fh, in.NodeId, false, false) {
		return errStale
	}
	return r.RawFileSystem.Ioctl(cancel, in, inbuf, out, outbuf)
}

// Flush: Sluice buffers nothing per handle, so an earlier server's handle has nothing to
// flush.
func (r *resumer) Flush(cancel <-chan struct{}, in *fuse.FlushIn) fuse.Status {
	if in.Fh != 0 && in.Fh&^handleMask != r.gen {
		return fuse.OK
	}
	in.Fh &= handleMask
	return r.RawFileSystem.Flush(cancel, in)
}

func (r *resumer) Fsync(cancel <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	if !r.retag(&in.Fh, in.NodeId, false, false) {
		return errStale
	}
	return r.RawFileSystem.Fsync(cancel, in)
}

func (r *resumer) Fallocate(cancel <-chan struct{}, in *fuse.FallocateIn) fuse.Status {
	if !r.retag(&in.Fh, in.NodeId, true, false) {
		return errStale
	}
	return r.RawFileSystem.Fallocate(cancel, in)
}

func (r *resumer) ReadDir(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	if !r.retag(&in.Fh, in.NodeId, false, true) {
		return errStale
	}
	return r.RawFileSystem.ReadDir(cancel, in, out)
}

func (r *resumer) ReadDirPlus(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	if !r.retag(&in.Fh, in.NodeId, false, true) {
		return errStale
	}
	return r.RawFileSystem.ReadDirPlus(cancel, in, out)
}

func (r *resumer) FsyncDir(cancel <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	if !r.retag(&in.Fh, in.NodeId, false, true) {
		return errStale
	}
	return r.RawFileSystem.FsyncDir(cancel, in)
}

func (r *resumer) StatFs(cancel <-chan struct{}, h *fuse.InHeader, out *fuse.StatfsOut) fuse.Status {
	if !r.known(h.NodeId) {
		return errStale
	}
	return r.RawFileSystem.StatFs(cancel, h, out)
}

func (r *resumer) Statx(cancel <-chan struct{}, in *fuse.StatxIn, out *fuse.StatxOut) fuse.Status {
	if !r.known(in.NodeId) {
		return errStale
	}
	if in.GetattrFlags&fuse.FUSE_GETATTR_FH != 0 {
		if in.Fh&^handleMask == r.gen {
			in.Fh &= handleMask
		} else {
			in.GetattrFlags &^= fuse.FUSE_GETATTR_FH
			in.Fh = 0
		}
	}
	return r.RawFileSystem.Statx(cancel, in, out)
}
