package streamfs

import (
	"context"
	"sync"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// pageReads tells the handles which READ requests fill the kernel's page cache rather
// than answer a read(2). The kernel sends a direct read(2) of a FOPEN_DIRECT_IO handle with
// FUSE_READ_LOCKOWNER set (the caller's lock owner); the reads it makes for itself to fill
// pages (splice and sendfile, copy_file_range within the mount, which fall back to splice,
// and mmap) carry no lock owner. Those copies stop at the size the kernel knows without
// asking the server, so on a file still being written they would end early and silently:
// a handle refuses them (handle.Read) and programs fall back to read(2), which waits.
//
// The request is recognised by its cancel channel, the one go-fuse puts in the
// *fuse.Context a handle's Read receives.
//
// It also tells a handle's Write when the kernel asks the server to clear the file's
// set-user-ID and set-group-ID bits (FUSE_WRITE_KILL_SUIDGID: a direct I/O write by a
// caller without CAP_FSETID), which the fs layer's Write does not pass on.
type pageReads struct {
	fuse.RawFileSystem
	marks sync.Map // cancel channel of a page-cache READ in progress -> struct{}
	kills sync.Map // cancel channel of a WRITE that must clear suid/sgid -> struct{}
	// backings give committed files' opens the view's kept backing registrations
	// (backing.go).
	backings *backings
}

// Open serves an OPEN and, when the view gave the handle a kept backing registration
// (backings.grant), hands it to the kernel: the handle's reads bypass the server.
func (p *pageReads) Open(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	st := p.RawFileSystem.Open(cancel, in, out)
	if bk, ok := p.backings.granted(cancel); ok && st.Ok() {
		out.BackingID = bk.id
		out.OpenFlags |= fuse.FOPEN_PASSTHROUGH
		out.OpenFlags &^= fuse.FOPEN_KEEP_CACHE
	}
	return st
}

// Writev marks a WRITE that must clear the set-user-ID and set-group-ID bits for the
// handle's Write, then serves it (go-fuse serves every WRITE through Writev, and falls
// back to Write).
func (p *pageReads) Writev(cancel <-chan struct{}, in *fuse.WriteIn, data [][]byte) (uint32, fuse.Status) {
	if in.WriteFlags&fuse.WRITE_KILL_SUIDGID != 0 {
		p.kills.Store(cancel, struct{}{})
		defer p.kills.Delete(cancel)
	}
	return p.RawFileSystem.Writev(cancel, in, data)
}

// killPrivs reports whether ctx, the context of a handle's Write, is a WRITE whose
// caller's file must lose its set-user-ID and set-group-ID bits.
func (p *pageReads) killPrivs(ctx context.Context) bool {
	if p == nil {
		return false
	}
	return p.marked(ctx, &p.kills)
}

// Read marks a page-cache READ for the handle's Read, then serves it.
func (p *pageReads) Read(cancel <-chan struct{}, in *fuse.ReadIn, buf []byte) (fuse.ReadResult, fuse.Status) {
	if in.ReadFlags&fuse.READ_LOCKOWNER == 0 {
		p.marks.Store(cancel, struct{}{})
		defer p.marks.Delete(cancel)
	}
	return p.RawFileSystem.Read(cancel, in, buf)
}

// pageRead reports whether ctx, the context of a handle's Read, is a page-cache READ.
func (p *pageReads) pageRead(ctx context.Context) bool {
	if p == nil {
		return false
	}
	return p.marked(ctx, &p.marks)
}

// marked reports whether the request of ctx, a handle's *fuse.Context, is in m.
func (p *pageReads) marked(ctx context.Context, m *sync.Map) bool {
	c, ok := ctx.(*fuse.Context)
	if !ok {
		return false
	}
	_, marked := m.Load(c.Cancel)
	return marked
}
