package semantics

import "fmt"

// Fail marks p as unavailable on this node (its bytes could not be stored here): every
// wait on it, current and future, ends with a *WaitError wrapping err. It reports whether
// p is governed.
func (e *Engine) Fail(p string, err error) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	fs := e.state(p)
	if fs == nil {
		return false
	}
	if fs.failure() == nil {
		fs.more().failed = err
		fs.notify()
	}
	return true
}

// Failed returns the error p was marked with by Fail, or nil.
func (e *Engine) Failed(p string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if fs, ok := e.files[p]; ok {
		return fs.failure()
	}
	return nil
}

// PoisonError says why a file will never be complete. It wraps ErrPoisoned.
type PoisonError struct {
	// Path is the file; Reason what failed, e.g. "write at offset 4096 of 65536 bytes:
	// no space left on device" or "its writer, step a instance 0, failed".
	Path, Reason string
}

func (e *PoisonError) Error() string {
	return fmt.Sprintf("%s is incomplete and will never commit: %s", e.Path, e.Reason)
}

// Unwrap returns ErrPoisoned.
func (e *PoisonError) Unwrap() error { return ErrPoisoned }

// Poison records that p can never be complete: a write to it failed (ENOSPC after the
// space wait, EIO) or its writer failed while it was open. A poisoned file never commits
// (so it is never read as complete, nor stored as a permanent output), its closes no
// longer count towards OnClose, and every wait on it, current and future, ends with a
// *WaitError wrapping a *PoisonError (errors.Is ErrPoisoned). Truncating it to 0 bytes
// starts it over. It returns ErrCommitted for a committed file (its bytes were complete
// when it committed) and ErrNotGoverned for a path no rule governs. The Poison
// observers are called after the lock is released.
func (e *Engine) Poison(p, reason string) error {
	e.mu.Lock()
	var batch commitBatch
	defer e.finish(&batch)
	fs := e.state(p)
	switch {
	case fs == nil:
		return ErrNotGoverned
	case fs.committed:
		return ErrCommitted
	case fs.poisoned() != nil:
		return nil
	}
	perr := &PoisonError{Path: p, Reason: reason}
	fs.more().poison = perr
	fs.notify()
	batch.poisoned = append(batch.poisoned, perr)
	return nil
}

// Poisoned returns the *PoisonError of p, or nil if p is not poisoned.
func (e *Engine) Poisoned(p string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if fs, ok := e.files[p]; ok && fs.poisoned() != nil {
		return fs.poisoned()
	}
	return nil
}

// WithdrawnError says why a file was withdrawn (Engine.Withdraw). It wraps ErrWithdrawn.
type WithdrawnError struct {
	// Path is the file; Reason why it was withdrawn, e.g. "the attempt of step a
	// instance 0 that wrote it failed (exit code 3)".
	Path, Reason string
	// Generation is the withdrawn file's FileStatus.Generation on this engine (0 when
	// the error describes a name that changed files otherwise).
	Generation uint64
}

func (e *WithdrawnError) Error() string {
	return fmt.Sprintf("%s was withdrawn: %s", e.Path, e.Reason)
}

// Unwrap returns ErrWithdrawn.
func (e *WithdrawnError) Unwrap() error { return ErrWithdrawn }

// Withdraw takes back the governed file p, committed or not, because the attempt that
// produced it failed (docs/semantics.md, "A failed attempt withdraws its outputs"): the
// engine forgets it as if it had never been created (it leaves its directory's entries
// and the committed counters), so that a retry of the instance may create it again and
// readers that had not opened it wait for that retry (or, once every producer instance
// has exited, get ErrNeverCreated). A reader still reading it through the semantics
// (WaitRead with its Generation) gets a *WithdrawnError. reason says why, for readers and
// logs. It returns ErrNotGoverned for a path no rule governs and does nothing for a path
// that was never created or is a directory (directories are not withdrawn: other
// instances may have entries in them). The Withdraw observers are
// called after the lock is released.
func (e *Engine) Withdraw(p, reason string) error {
	e.mu.Lock()
	var batch commitBatch
	defer e.finish(&batch)
	fs, ok := e.files[p]
	if !ok {
		if e.rules.Resolve(p).Rule == nil {
			return ErrNotGoverned
		}
		return nil
	}
	if fs.isDir || !fs.exists && !fs.committed {
		return nil
	}
	werr := &WithdrawnError{Path: p, Reason: reason, Generation: fs.gen}
	e.withdrawn[fs.gen] = werr
	e.forget(p, fs)
	batch.withdrawn = append(batch.withdrawn, werr)
	return nil
}
