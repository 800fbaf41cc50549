package streamfs

import (
	"container/list"
	"context"
	"sync"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// A consumer's open of a committed file gives the kernel the store file as the handle's
// backing file (FUSE passthrough): the kernel reads it itself. Registering a backing file
// (FUSE_DEV_IOC_BACKING_OPEN) and releasing it at the last close cost an ioctl each, more
// than the rest of the open; go-fuse does both for every first open and last close of an
// inode. A committed file never changes, so a view keeps the registration of the files it
// opened last (maxIdleBackings) after their last close, and the next open of one reuses it:
// the kernel takes its own reference to the backing file at each open, so one
// registration serves any number of opens. A registration is keyed by the store inode and
// the engine's Generation of the file: a file made anew under a reused inode number gets
// its own.

// maxIdleBackings bounds the registrations a view keeps with no open handle: each holds
// the store file open (its pages stay allocated while the kernel holds it, even once the
// file is removed from the store).
const maxIdleBackings = 64

// backingKey is a committed file: its store inode and Generation.
type backingKey struct{ ino, gen uint64 }

// backing is a registered backing file.
type backing struct {
	key  backingKey
	id   int32
	refs int           // open handles using it
	idle *list.Element // in backings.idle while refs is 0
	dead bool          // the file was withdrawn: unregister at the last close
}

// backings are a view's backing registrations.
type backings struct {
	mu    sync.Mutex
	byKey map[backingKey]*backing
	idle  *list.List // of *backing with refs 0, most recently used first
	// grants pass, from a consumer's Open to the reply (pageReads.Open), the backing its
	// handle uses, by the request's cancel channel.
	grants sync.Map
}

func newBackings() *backings {
	return &backings{byKey: map[backingKey]*backing{}, idle: list.New()}
}

// acquire returns the registration of the committed file key, registering the store file
// fd as its backing if there is none, for one more open handle; false when the kernel
// refuses (no CAP_SYS_ADMIN, no passthrough).
func (b *backings) acquire(srv *fuse.Server, key backingKey, fd int) (*backing, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if bk, ok := b.byKey[key]; ok && !bk.dead {
		if bk.idle != nil {
			b.idle.Remove(bk.idle)
			bk.idle = nil
		}
		bk.refs++
		return bk, true
	}
	id, errno := srv.RegisterBackingFd(&fuse.BackingMap{Fd: int32(fd)})
	if errno != 0 {
		return nil, false
	}
	bk := &backing{key: key, id: id, refs: 1}
	b.byKey[key] = bk
	return bk, true
}

// release ends one open handle's use of bk; the registration stays among the idle ones,
// the least recently used of which past maxIdleBackings are unregistered.
func (b *backings) release(srv *fuse.Server, bk *backing) {
	b.mu.Lock()
	defer b.mu.Unlock()
	bk.refs--
	if bk.refs > 0 {
		return
	}
	if bk.dead {
		b.drop(srv, bk)
		return
	}
	bk.idle = b.idle.PushFront(bk)
	for b.idle.Len() > maxIdleBackings {
		b.drop(srv, b.idle.Back().Value.(*backing))
	}
}

// forget unregisters the registrations of store inode ino (a withdrawn file), at once
// where no handle uses them, at their last close otherwise.
func (b *backings) forget(srv *fuse.Server, ino uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for k, bk := range b.byKey {
		if k.ino != ino {
			continue
		}
		if bk.refs == 0 {
			b.drop(srv, bk)
		} else {
			bk.dead = true
		}
	}
}

// drop unregisters bk. Called with b.mu held and bk unused.
func (b *backings) drop(srv *fuse.Server, bk *backing) {
	if bk.idle != nil {
		b.idle.Remove(bk.idle)
		bk.idle = nil
	}
	if b.byKey[bk.key] == bk {
		delete(b.byKey, bk.key)
	}
	_ = srv.UnregisterBackingFd(bk.id)
}

// grant records that the open request of ctx gives its handle bk's backing file.
func (b *backings) grant(ctx context.Context, bk *backing) bool {
	c, ok := ctx.(*fuse.Context)
	if !ok {
		return false
	}
	b.grants.Store(c.Cancel, bk)
	return true
}

// granted returns, and forgets, the backing the open request of cancel was given.
func (b *backings) granted(cancel <-chan struct{}) (*backing, bool) {
	v, ok := b.grants.LoadAndDelete(cancel)
	if !ok {
		return nil, false
	}
	return v.(*backing), true
}
