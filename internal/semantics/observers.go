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

// punch is a range [0, upto) of file p released (OnPunch).
type punch struct {
	p    string
	upto int64
}

// finish releases the lock and tells the observers about the batch: its creations first,
// then its commits, each in the order they happened. Every update goes through finish, so
// no observer ever runs with the lock held (an observer may call the engine).
func (e *Engine) finish(batch *commitBatch) {
	onCreate, onCommit, onPoison, onWithdraw, onRelease, onPunch := e.onCreate, e.onCommit, e.onPoison, e.onWithdraw, e.onRelease, e.onPunch
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
			for _, fn := range onPunch {
				fn(pu.p, pu.upto)
			}
		}
		for _, st := range batch.released {
			for _, fn := range onRelease {
				fn(st)
			}
		}
	}()
	for _, werr := range batch.withdrawn {
		for _, fn := range onWithdraw {
			fn(werr)
		}
	}
	for _, perr := range batch.poisoned {
		for _, fn := range onPoison {
			fn(perr)
		}
	}
	for _, st := range batch.created {
		for _, fn := range onCreate {
			fn(st)
		}
	}
	for _, st := range batch.committed {
		for _, fn := range onCommit {
			fn(st)
		}
	}
}

// Quiesce returns once the observers of every update made before the call have returned
// (OnCommit, OnRelease and the others run after the update's lock is released, so an
// update's caller, or another caller that saw its effect, may return before them), or
// with ctx's error. A caller that reports what the observers did (the files a run
// released) calls it first.
func (e *Engine) Quiesce(ctx context.Context) error { return e.observing.Wait(ctx) }

// OnCommit registers fn to be called, without the engine's lock held and in commit order,
// each time a path commits. Register observers before the first event.
func (e *Engine) OnCommit(fn func(FileStatus)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.onCommit = append(e.onCommit, fn)
}

// OnCreate registers fn to be called, without the engine's lock held, each time a
// governed path is created. Register observers before the first event.
func (e *Engine) OnCreate(fn func(FileStatus)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.onCreate = append(e.onCreate, fn)
}

// OnPoison registers fn to be called, without the engine's lock held, each time a file is
// poisoned (Poison). Register observers before the first event.
func (e *Engine) OnPoison(fn func(*PoisonError)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.onPoison = append(e.onPoison, fn)
}

// OnWithdraw registers fn to be called, without the engine's lock held, each time a file
// is withdrawn (Withdraw). Register observers before the first event.
func (e *Engine) OnWithdraw(fn func(*WithdrawnError)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.onWithdraw = append(e.onWithdraw, fn)
}

// OnRelease registers fn to be called, without the engine's lock held, each time a
// Consumed file is released: its consumers have all exited and its bytes may be deleted
// from the node store. Register observers before the first event.
func (e *Engine) OnRelease(fn func(FileStatus)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.onRelease = append(e.onRelease, fn)
}

// OnPunch registers fn to be called, without the engine's lock held, each time the first
// upto bytes of the Consumed NoUpdate file p are released (ReadProgress). Register
// observers before the first event.
func (e *Engine) OnPunch(fn func(p string, upto int64)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.onPunch = append(e.onPunch, fn)
}
