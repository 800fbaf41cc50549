package semantics

import (
	"context"
	"fmt"

	"github.com/sluice-io/sluice/api/v1alpha1"
)

// wait blocks until check reports done or an error, re-checking after every change of p.
func (e *Engine) wait(ctx context.Context, p, what string, check func(fs *fileState) (bool, error)) (FileStatus, error) {
	for {
		e.mu.Lock()
		fs := e.state(p)
		if fs == nil {
			st := FileStatus{Resolution: e.rules.Resolve(p)}
			e.mu.Unlock()
			return st, nil
		}
		done, err := check(fs)
		if ferr := fs.failure(); ferr != nil {
			done, err = false, ferr
		}
		if perr := fs.poisoned(); perr != nil {
			done, err = false, perr
		}
		st := e.snapshot(fs)
		var ch <-chan struct{}
		if !done && err == nil {
			ch = fs.waitCh()
		}
		waiting := e.waiting(what, fs)
		e.mu.Unlock()
		if err != nil {
			return st, &WaitError{Path: p, Rule: st.Resolution.Describe(), Waiting: waiting, Err: err}
		}
		if done {
			return st, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return st, &WaitError{Path: p, Rule: st.Resolution.Describe(), Waiting: waiting, Err: ctx.Err()}
		}
	}
}

// waiting renders what a wait is for, with the file's progress when it waits for a
// commit, for error messages. Called with e.mu held.
func (e *Engine) waiting(what string, fs *fileState) string {
	if what != "commit" {
		return what
	}
	switch fs.res.Commit {
	case v1alpha1.CommitOnClose:
		return fmt.Sprintf("commit (closes %d of %d)", fs.closes, fs.res.Count)
	case v1alpha1.CommitOnTermination:
		if f := e.failedCount(fs.res.Rule); f > 0 {
			return fmt.Sprintf("commit (producer instances exited %d of %d, %d failed)", e.exited(fs.res.Rule), fs.res.Count, f)
		}
		return fmt.Sprintf("commit (producer instances exited %d of %d)", e.exited(fs.res.Rule), fs.res.Count)
	case v1alpha1.CommitOnNFiles:
		_, committed := fs.entryCounts()
		return fmt.Sprintf("commit (committed files %d of %d)", committed, fs.res.Count)
	}
	return "commit"
}

// WaitExists blocks until p exists. For a path no rule governs it returns at once (the
// caller looks at the store). It returns a *WaitError wrapping ErrNeverCreated when every
// producer exited without creating p (through a *ProducerFailedError when one of them
// failed, or at once when failed producers leave its commit rule unable to hold: see
// TerminateFailed), or the context's error.
func (e *Engine) WaitExists(ctx context.Context, p string) (FileStatus, error) {
	return e.wait(ctx, p, "creation", func(fs *fileState) (bool, error) {
		if fs.exists || fs.committed && fs.isDir {
			return true, nil
		}
		return false, e.hopeless(fs, ErrNeverCreated)
	})
}

// CanOpen reports whether a reader may open p now: it exists and, under Update, is
// committed (CAPIO-CL: nothing is visible before commit). Paths no rule governs may always
// be opened (if they exist in the store).
func (e *Engine) CanOpen(p string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	fs, ok := e.files[p]
	if !ok {
		return e.rules.Resolve(p).Rule == nil
	}
	return openable(fs)
}

func openable(fs *fileState) bool {
	if fs.isDir {
		return fs.exists || fs.committed
	}
	return fs.exists && (fs.committed || fs.res.Fire == v1alpha1.FireNoUpdate)
}

// WaitOpen blocks until a reader may open p (see CanOpen). It fails with a *WaitError
// wrapping ErrNeverCreated, ErrNeverCommitted (an Update file whose producers all exited
// before commit), either through a *ProducerFailedError (TerminateFailed), or the
// context's error.
func (e *Engine) WaitOpen(ctx context.Context, p string) (FileStatus, error) {
	return e.wait(ctx, p, "commit", func(fs *fileState) (bool, error) {
		if openable(fs) {
			return true, nil
		}
		if !fs.exists {
			return false, e.hopeless(fs, ErrNeverCreated)
		}
		return false, e.hopeless(fs, ErrNeverCommitted)
	})
}

// readable returns what WaitRead answers for fs at off when it need not wait.
func readable(fs *fileState, off int64) (int64, bool) {
	if fs.committed {
		if off >= fs.size {
			return 0, true
		}
		return fs.size - off, false
	}
	if fs.res.Fire == v1alpha1.FireNoUpdate {
		return fs.written.ContiguousFrom(off), false
	}
	return 0, false
}

// WaitRead blocks until at least one byte at offset off of p is readable or the reader is
// at EOF of the committed file, and returns how many bytes a reader may read from off
// now and whether off is at or past the end of the committed file (EOF). Before commit,
// under NoUpdate, that is the written bytes contiguous from off (a hole stops it); under
// Update, nothing. After commit, everything up to the final size (holes read as zeros).
// EOF never comes before commit. gen, when not 0, is the Generation of the file the
// reader opened: if p no longer names that file (it was withdrawn, or renamed away and
// made again) the wait fails with a *WaitError wrapping a *WithdrawnError (errors.Is
// ErrWithdrawn) instead of reading another file's progress. It fails with a *WaitError
// wrapping ErrNeverCommitted (through a *ProducerFailedError when a producer failed,
// TerminateFailed) or the context's error.
func (e *Engine) WaitRead(ctx context.Context, p string, gen uint64, off int64) (n int64, eof bool, err error) {
	_, err = e.wait(ctx, p, "commit", func(fs *fileState) (bool, error) {
		if gen != 0 && fs.gen != gen {
			if werr, ok := e.withdrawn[gen]; ok {
				return false, werr
			}
			return false, &WithdrawnError{Path: p, Reason: "the file it names is no longer the one opened"}
		}
		if punched := fs.punchedTo(); off < punched {
			return false, fmt.Errorf("%w: a read at offset %d, released up to %d", ErrReleased, off, punched)
		}
		n, eof = readable(fs, off)
		if n > 0 || eof {
			return true, nil
		}
		return false, e.hopeless(fs, ErrNeverCommitted)
	})
	return n, eof, err
}

// WaitDir blocks until the governed directory p is committed (OnNFiles count reached, or
// its commit rule holds), so that a listing of it is complete. It fails with a *WaitError
// wrapping ErrNeverCommitted (through a *ProducerFailedError when a producer failed, at
// once when that leaves its commit rule unable to hold: TerminateFailed) or the context's
// error. A listing that also waits for new entries calls it with a context it cancels at
// the directory's next change (Changed).
func (e *Engine) WaitDir(ctx context.Context, p string) (FileStatus, error) {
	return e.wait(ctx, p, "commit", func(fs *fileState) (bool, error) {
		if fs.committed {
			return true, nil
		}
		return false, e.hopeless(fs, ErrNeverCommitted)
	})
}

// hopeless returns why a wait on fs not satisfied yet can never be: cause (ErrNeverCreated
// or ErrNeverCommitted) once every producer instance has exited, wrapped in a
// *ProducerFailedError when one of them failed; or, while some still run, that
// *ProducerFailedError at once when the failed instances leave too few to satisfy the
// commit rule (OnTermination needs Count successes, a directory's OnClose every
// instance's). It returns nil while the wait may still end well. Called with e.mu held.
func (e *Engine) hopeless(fs *fileState, cause error) error {
	r := fs.res.Rule
	failed := e.firstFailure(r)
	if failed != nil {
		failed.Err = cause
	}
	if e.producersGone(fs) {
		if failed != nil {
			return failed
		}
		return cause
	}
	if failed == nil {
		return nil
	}
	switch {
	case fs.res.Commit == v1alpha1.CommitOnTermination && r.Instances-e.failedCount(r) < fs.res.Count,
		fs.isDir && fs.res.Commit == v1alpha1.CommitOnClose:
		return failed
	}
	return nil
}

// firstFailure returns the producer instance of rule r that failed with no retries left
// (TerminateFailed), the first in the order of r's producers and of their instances, or
// nil when none did. Err is left for the caller. Called with e.mu held.
func (e *Engine) firstFailure(r *Rule) *ProducerFailedError {
	for _, s := range r.Producers {
		f := e.failures[s]
		if len(f) == 0 {
			continue
		}
		first := -1
		for i := range f {
			if first < 0 || i < first {
				first = i
			}
		}
		return &ProducerFailedError{Step: s, Instance: first, Reason: f[first]}
	}
	return nil
}

// failedCount counts the producer instances of rule r that failed with no retries left.
// Called with e.mu held.
func (e *Engine) failedCount(r *Rule) int {
	n := 0
	for _, s := range r.Producers {
		n += len(e.failures[s])
	}
	return n
}
