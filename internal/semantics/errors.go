package semantics

import (
	"errors"
	"fmt"
)

// Errors a wait or an event can end with. Waits wrap them in a *WaitError.
var (
	// ErrNeverCreated means every producer of a declared file has exited without creating
	// it, so waiting for it to appear would never end. A filesystem reports ENOENT.
	ErrNeverCreated = errors.New("every producer exited without creating it")
	// ErrNeverCommitted means every producer of a file has exited but its commit rule does
	// not hold (e.g. OnClose:3 after 2 closes), so EOF can never be given. A filesystem
	// reports EIO.
	ErrNeverCommitted = errors.New("every producer exited before its commit rule held")
	// ErrCommitted is returned for a write, truncate or create of a file that is already
	// committed: committed files are immutable.
	ErrCommitted = errors.New("file is committed and can no longer change")
	// ErrPoisoned is wrapped by the *PoisonError of a file that can never be complete
	// (Engine.Poison).
	ErrPoisoned = errors.New("file is incomplete")
	// ErrReleased is returned by a read of bytes of a Consumed NoUpdate file that were
	// released once every consumer had read past them (Engine.ReadProgress).
	ErrReleased = errors.New("bytes released after every consumer read past them")
	// ErrWithdrawn is wrapped by the *WithdrawnError a reader gets from a file whose
	// producing attempt failed (Engine.Withdraw).
	ErrWithdrawn = errors.New("file was withdrawn")
	// ErrNotGoverned is returned by events on paths no rule governs; callers treat such
	// paths as plain files and need not report them.
	ErrNotGoverned = errors.New("no rule governs this path")
	// ErrProducerFailed is wrapped by the *ProducerFailedError that ends a wait on a file
	// or directory one of whose producer instances failed with no retries left
	// (Engine.TerminateFailed).
	ErrProducerFailed = errors.New("a producer failed with no retries left")
)

// ProducerFailedError ends a wait whose condition can no longer hold because a producer
// instance of the path failed with no retries left (Engine.TerminateFailed): every
// producer has exited, or the commit rule needs the failed instance's success
// (OnTermination, a directory's OnClose). It names the failed instance and wraps both
// ErrProducerFailed and Err, which says what can never happen: ErrNeverCreated (a
// filesystem reports ENOENT) or ErrNeverCommitted (EIO).
type ProducerFailedError struct {
	// Step and Instance name the failed producer instance; Reason says how it failed,
	// e.g. "exit code 2".
	Step     string
	Instance int
	Reason   string
	// Err is ErrNeverCreated or ErrNeverCommitted.
	Err error
}

func (e *ProducerFailedError) Error() string {
	what := "it will never be created"
	if errors.Is(e.Err, ErrNeverCommitted) {
		what = "it will never commit"
	}
	return fmt.Sprintf("%s: its producer step %s instance %d failed with no retries left (%s)", what, e.Step, e.Instance, e.Reason)
}

// Unwrap returns Err and ErrProducerFailed.
func (e *ProducerFailedError) Unwrap() []error { return []error{e.Err, ErrProducerFailed} }

// WaitError is returned by a wait that ended before its condition held: the deadline ran
// out, the context was cancelled, or the condition can never hold. It names the file, its
// rule and what the reader was waiting for, so that a mis-declared rule fails loudly.
type WaitError struct {
	// Path and Rule describe the file (Resolution.Describe).
	Path, Rule string
	// Waiting says what the reader waited for, e.g. "commit (closes 2 of 3)".
	Waiting string
	// Err is context.DeadlineExceeded, context.Canceled, ErrNeverCreated,
	// ErrNeverCommitted or a *ProducerFailedError wrapping one of the last two.
	Err error
}

func (e *WaitError) Error() string {
	return fmt.Sprintf("waiting for %s of %s: %v", e.Waiting, e.Rule, e.Err)
}

func (e *WaitError) Unwrap() error { return e.Err }
