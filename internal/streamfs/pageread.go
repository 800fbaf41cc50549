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
type pageReads struct {
	fuse.RawFileSystem
	marks sync.Map // cancel channel of a page-cache READ in progress -> struct{}
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
	c, ok := ctx.(*fuse.Context)
	if !ok {
		return false
	}
	_, marked := p.marks.Load(c.Cancel)
	return marked
}
