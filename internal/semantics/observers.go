package semantics

import "context"

// commitBatch collects the creations and commits of one update, made under the lock, for
// the observers called after it is released.
type commitBatch struct {
	created, committed []FileStatus
	poisoned           []*PoisonError
	withdrawn          []*WithdrawnError
	released           []FileStatus
	punched            []punch
}

// empty reports whether the batch has nothing to tell the observers.
func (b *commitBatch) empty() bool {
	return len(b.created)+len(b.committed)+len(b.poisoned)+len(b.withdrawn)+len(b.released)+len(b.punched) == 0
}

// punch is a range [0, upto) of file p released (Observer.Punch).
type punch struct {
	p    string
	upto int64
}

// Observer is told what the engine records, as controller-runtime's handler.Funcs is:
// each field is a function called, without the engine's lock held, after an update that
// made such a change; nil fields are ignored. An observer may call the engine. Register
// observers with Engine.Observe before the first event.
//
// The changes of one update are told in this order: withdrawals, poisonings, creations,
// commits, then released ranges and released files; each kind in the order the changes
// happened, and within a kind to every observer in registration order.
type Observer struct {
	// Create is called each time a governed path is created.
	Create func(FileStatus)
	// Commit is called, in commit order, each time a path commits.
	Commit func(FileStatus)
	// Poison is called each time a file is poisoned (Engine.Poison).
	Poison func(*PoisonError)
	// Withdraw is called each time a file is withdrawn (Engine.Withdraw).
	Withdraw func(*WithdrawnError)
	// Release is called each time a Consumed file is released: its consumers have all
	// exited (or read it to its end) and its bytes may be deleted from the node store.
	Release func(FileStatus)
	// Punch is called each time the first upto bytes of the Consumed NoUpdate file p are
	// released (Engine.ReadProgress): they may be freed in the node store.
	Punch func(p string, upto int64)
}

// Observe registers o; its nil fields are ignored. Register observers before the first
// event.
func (e *Engine) Observe(o Observer) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.observers = append(e.observers, o)
}

// finish releases the lock and tells the observers about the batch, in the order
// Observer documents. Every update goes through finish, so no observer ever runs with
// the lock held (an observer may call the engine).
func (e *Engine) finish(batch *commitBatch) {
	observers := e.observers
	if batch.empty() {
		e.mu.Unlock()
		return
	}
	e.broadcast()
	e.observing.Begin() // before the lock goes: whoever sees this update's effect waits for it
	e.mu.Unlock()
	defer e.observing.End()
	defer func() {
		for _, pu := range batch.punched {
			for _, o := range observers {
				if o.Punch != nil {
					o.Punch(pu.p, pu.upto)
				}
			}
		}
		for _, st := range batch.released {
			for _, o := range observers {
				if o.Release != nil {
					o.Release(st)
				}
			}
		}
	}()
	for _, werr := range batch.withdrawn {
		for _, o := range observers {
			if o.Withdraw != nil {
				o.Withdraw(werr)
			}
		}
	}
	for _, perr := range batch.poisoned {
		for _, o := range observers {
			if o.Poison != nil {
				o.Poison(perr)
			}
		}
	}
	for _, st := range batch.created {
		for _, o := range observers {
			if o.Create != nil {
				o.Create(st)
			}
		}
	}
	for _, st := range batch.committed {
		for _, o := range observers {
			if o.Commit != nil {
				o.Commit(st)
			}
		}
	}
}

// Quiesce returns once the observers of every update made before the call have returned
// (they run after the update's lock is released, so an update's caller, or another
// caller that saw its effect, may return before them), or with ctx's error. A caller
// that reports what the observers did (the files a run released) calls it first.
func (e *Engine) Quiesce(ctx context.Context) error { return e.observing.Wait(ctx) }
