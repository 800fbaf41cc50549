// Package inflight counts work in progress and lets a caller wait until none is left:
// the write handles a view has open, the engine's observers still running, the handles of
// a file a view serves itself.
package inflight

import (
	"context"
	"sync"
)

// Count is a number of things in progress. The zero value is ready to use, with none.
type Count struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n drops to 0; nil while n is 0
}

// Begin counts one more thing in progress.
func (c *Count) Begin() {
	c.mu.Lock()
	if c.n == 0 {
		c.idle = make(chan struct{})
	}
	c.n++
	c.mu.Unlock()
}

// End counts one thing done; each End matches an earlier Begin.
func (c *Count) End() {
	c.mu.Lock()
	if c.n--; c.n == 0 {
		close(c.idle)
		c.idle = nil
	}
	c.mu.Unlock()
}

// N returns how many things are in progress now.
func (c *Count) N() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// Idle returns a channel closed once nothing that is in progress now (or begins before
// it is done) is left; closed already when nothing is in progress.
func (c *Count) Idle() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.idle == nil {
		done := make(chan struct{})
		close(done)
		return done
	}
	return c.idle
}

// Wait returns once nothing is in progress, at once (whatever ctx) when nothing is now,
// or with ctx's error.
func (c *Count) Wait(ctx context.Context) error {
	idle := c.Idle()
	select {
	case <-idle:
		return nil
	default:
	}
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
