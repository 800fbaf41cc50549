package streamfs

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"syscall"
	"time"

	"github.com/sluice-io/sluice/internal/pathpattern"
	"github.com/sluice-io/sluice/internal/semantics"
)

// waitCtx bounds a wait by the view's WaitTimeout, the request (a FUSE interrupt cancels
// it) and the view's lifetime.
func (v *View) waitCtx(req context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(req, v.opts.WaitTimeout)
	stop := context.AfterFunc(v.ctx, cancel)
	return ctx, func() { stop(); cancel() }
}

// wait runs one semantic wait with accounting and maps its failure to an errno, logging
// the file, its rule and what was awaited.
func (v *View) wait(req context.Context, on waitFor, fn func(ctx context.Context) error) syscall.Errno {
	ctx, cancel := v.waitCtx(req)
	defer cancel()
	start := time.Now()
	what := on.what
	w := &Wait{What: what, Path: on.path, Since: start}
	v.bmu.Lock()
	v.waits[w] = w
	v.bmu.Unlock()
	v.setBlocked(1)
	err := fn(ctx)
	took := time.Since(start)
	v.blockedNanos.Add(int64(took))
	v.bmu.Lock()
	delete(v.waits, w)
	v.waitHist.observe(took.Seconds())
	v.bmu.Unlock()
	v.setBlocked(-1)
	if err == nil {
		return 0
	}
	var we *semantics.WaitError
	errno := syscall.EIO
	switch {
	case errors.Is(err, semantics.ErrNeverCreated):
		errno = syscall.ENOENT
	case errors.Is(err, context.Canceled) && v.ctx.Err() == nil:
		errno = syscall.EINTR // the reader was interrupted by a signal
	}
	if errno != syscall.EINTR {
		v.bmu.Lock()
		v.failedWaits = append(v.failedWaits, FailedWait{What: what, Err: err.Error(), At: time.Now()})
		if len(v.failedWaits) > maxFailedWaits {
			v.failedWaits = slices.Delete(v.failedWaits, 0, len(v.failedWaits)-maxFailedWaits)
		}
		v.bmu.Unlock()
	}
	if errors.As(err, &we) && errno != syscall.EINTR {
		v.opts.Log.Error(we.Err, "wait failed", "op", what, "path", we.Path, "rule", we.Rule, "waitingFor", we.Waiting,
			"step", v.opts.Step, "instance", v.opts.Instance, "errno", errno.Error(), "reason", we.Err.Error())
	}
	return errno
}

// fetched returns once bytes [off, end) of p are in the store, fetching them when they
// were written on another node (Fetcher); the fetch is accounted and bounded as a wait,
// and its failure (the holding node lost, this node's store full) is EIO, logged with
// the path and the reason.
func (v *View) fetched(ctx context.Context, p string, off, end int64) syscall.Errno {
	if v.fetch == nil || !v.fetch.Remote(p, off, end) {
		return 0
	}
	return v.wait(ctx, v.waitOn("fetch", p), func(ctx context.Context) error {
		err := v.fetch.Fetch(ctx, p, off, end)
		if err != nil && ctx.Err() == nil {
			v.opts.Log.Error(nil, "read failed: bytes written on another node could not be fetched", "path", pathpattern.Printable(p),
				"step", v.opts.Step, "instance", v.opts.Instance, "offset", off, "end", end, "reason", err.Error())
		}
		return err
	})
}

// waitFor is what a wait waits for: its description and the file's volume path.
type waitFor struct{ what, path string }

// waitOn names a wait of request op on file p with its rule, e.g.
// `open of "late.txt" (OnClose:1, Update)` (semantics.Resolution.Describe).
func (v *View) waitOn(op, p string) waitFor {
	return waitFor{what: op + " of " + v.rules.Resolve(p).Describe(), path: p}
}

func (v *View) setBlocked(delta int64) {
	v.bmu.Lock()
	v.blocked.Add(delta)
	if v.blockedCh != nil {
		close(v.blockedCh)
		v.blockedCh = nil
	}
	v.bmu.Unlock()
}

// WaitBlocked blocks until at least n requests of the view are waiting on the rules (a
// reader parked in open, read, readdir or stat), or ctx is done. Tests use it to know a
// reader is waiting before they make the event it waits for.
func (v *View) WaitBlocked(ctx context.Context, n int64) error {
	for {
		v.bmu.Lock()
		if v.blocked.Load() >= n {
			v.bmu.Unlock()
			return nil
		}
		if v.blockedCh == nil {
			v.blockedCh = make(chan struct{})
		}
		ch := v.blockedCh
		v.bmu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("waiting for %d blocked readers in view %s[%d] (have %d): %w", n, v.opts.Step, v.opts.Instance, v.blocked.Load(), ctx.Err())
		}
	}
}

// probe is a cancelled context: a wait given it answers at once whether its condition
// holds, without blocking.
var probe = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()
