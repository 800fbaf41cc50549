package semantics

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/byterange"
	"github.com/sluice-io/sluice/internal/inflight"
	"github.com/sluice-io/sluice/internal/pathpattern"
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

// FileStatus is a snapshot of one path as the engine sees it.
type FileStatus struct {
	Resolution
	// Exists is true once the file or directory has been created.
	Exists bool
	// IsDir is true for directories.
	IsDir bool
	// Committed is true once the commit rule held; the file then never changes.
	Committed bool
	// Size is the size written so far in bytes (the end of the furthest write), or the
	// final size after commit.
	Size int64
	// Closes counts closes of descriptors opened for writing, summed over writers.
	Closes int
	// Entries counts a directory's entries; CommittedEntries those committed.
	Entries, CommittedEntries int
	// ProducersExited is true once every producer instance of the path has exited: a
	// path that does not exist by then never will.
	ProducersExited bool
	// Opened is true once a reader opened the file through a view of this node.
	Opened bool
	// Released is true once a committed Consumed file's consumers have all exited and
	// its bytes may be deleted from every node store (Engine.OnRelease).
	Released bool
	// Generation identifies this file among every file that had its name on this node:
	// it changes when the file is withdrawn (Engine.Withdraw) or renamed away and the name
	// made again. 0 for a path the engine has no record of.
	Generation uint64
}

// fileState is the engine's record of one governed path. Guarded by Engine.mu.
type fileState struct {
	res       Resolution
	exists    bool
	isDir     bool
	committed bool
	size      int64
	written   byterange.Set
	closes    int
	// directories: names of entries, and how many of them are committed
	entries          map[string]bool
	committedEntries int
	// changed is closed (and replaced) on every change, waking the waiters.
	changed chan struct{}
	// failed, once set, ends every wait on the path (see Fail).
	failed error
	// poison, once set, keeps the file from committing and ends every wait on it (see
	// Poison); a truncation to 0 bytes clears it.
	poison error
	// opened is set once a reader opened the file through a view of this node
	// (NoteOpened).
	opened bool
	// gen is the record's Generation.
	gen uint64
	// consumers are the steps that declare the file as an input, for a Consumed file;
	// released is set once they have all exited (maybeRelease).
	consumers []string
	released  bool
	// progress is how far each consumer instance ("step/instance") has read a Consumed
	// NoUpdate file contiguously from its start; punched is where the bytes before were
	// released (maybePunch).
	progress map[string]int64
	// finished are the consumer instances ("step/instance") that read the committed file
	// to its end and closed it (ReadToEnd).
	finished map[string]bool
	punched  int64
}

func (fs *fileState) notify() {
	close(fs.changed)
	fs.changed = make(chan struct{})
}

// Engine is the per-workflow state machine of the CAPIO-CL semantics. It is fed events
// (created, written, closed, renamed, instance terminated) and answers whether a reader may
// open a path, how many bytes it may read and whether a directory listing is complete. Its
// waits are woken by events, never by polling. All methods are safe for concurrent use.
//
// Paths given to the Engine are cleaned paths (pathpattern.Clean); events on paths no rule
// governs return ErrNotGoverned and change nothing.
type Engine struct {
	rules *RuleSet

	mu         sync.Mutex
	files      map[string]*fileState
	terminated map[string]map[int]bool
	// failures holds, for the terminated instances that failed with no retries left
	// (TerminateFailed), how each failed.
	failures map[string]map[int]string
	// pending holds uncommitted files whose commit depends on something other than their
	// own events: OnTermination (instances exiting) and OnFile (other files committing).
	pending   map[*fileState]struct{}
	committed int
	onCommit  []func(FileStatus)
	onCreate  []func(FileStatus)
	onPoison  []func(*PoisonError)
	// lastGen is the last Generation given; withdrawn holds why each withdrawn
	// generation was withdrawn (Withdraw), for the readers that still hold it.
	lastGen    uint64
	withdrawn  map[uint64]*WithdrawnError
	onWithdraw []func(*WithdrawnError)
	onRelease  []func(FileStatus)
	onPunch    []func(p string, upto int64)
	// consumed lists the records of Consumed files not released yet.
	consumed map[*fileState]struct{}
	// observing counts the batches whose observers are being called (finish), for
	// Quiesce.
	observing inflight.Count
	// changes is closed, and replaced, at every creation, commit, withdrawal, poisoning
	// and termination the engine records (AnyChange).
	changes chan struct{}
}

// NewEngine returns an engine for the workflow whose rules are rs.
func NewEngine(rs *RuleSet) *Engine {
	return &Engine{
		rules:      rs,
		files:      map[string]*fileState{},
		terminated: map[string]map[int]bool{},
		failures:   map[string]map[int]string{},
		pending:    map[*fileState]struct{}{},
		withdrawn:  map[uint64]*WithdrawnError{},
		consumed:   map[*fileState]struct{}{},
		changes:    make(chan struct{}),
	}
}

// AnyChange returns a channel that is closed at the next creation, commit, withdrawal,
// poisoning or step instance termination the engine records, on any path, and at the
// creation of a plain directory that governed files will live in (RuleSet.ImpliedDir):
// what a listing of a plain directory, and a lookup of one not made yet, wait for
// (PendingListing).
func (e *Engine) AnyChange() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.changes
}

// broadcast wakes AnyChange's waiters. Called with e.mu held.
func (e *Engine) broadcast() {
	close(e.changes)
	e.changes = make(chan struct{})
}

// PendingListing returns the producer steps, in declaration order, that may still make an
// entry of directory dir that step declares as an input, and have instances that have not
// exited: the rules whose pattern can match a path under dir (not dir itself), that step
// consumes and does not produce (RuleSet.ListingRules). A consumer's listing of dir is
// complete once none is left (docs/semantics.md, "Listings"). Empty when dir is not such
// a directory.
func (e *Engine) PendingListing(dir, step string) []string {
	rules := e.rules.ListingRules(dir, step)
	if len(rules) == 0 {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	seen := map[string]bool{}
	var out []string
	for _, name := range e.rules.stepOrder {
		for _, r := range rules {
			if seen[name] || !r.producedBy(name) {
				continue
			}
			seen[name] = true
			if len(e.terminated[name]) < e.rules.steps[name].Replicas {
				out = append(out, name)
			}
		}
	}
	return out
}

// Rules returns the engine's rule set.
func (e *Engine) Rules() *RuleSet { return e.rules }

// OnCommit registers fn to be called, without the engine's lock held and in commit order,
// each time a path commits. Register observers before the first event.
func (e *Engine) OnCommit(fn func(FileStatus)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.onCommit = append(e.onCommit, fn)
}

// state returns the record of p, creating it when a rule governs p; nil otherwise.
// Called with e.mu held.
func (e *Engine) state(p string) *fileState {
	if fs, ok := e.files[p]; ok {
		return fs
	}
	res := e.rules.Resolve(p)
	if res.Rule == nil {
		return nil
	}
	e.lastGen++
	fs := &fileState{res: res, changed: make(chan struct{}), gen: e.lastGen}
	if res.Dir == "" && res.Rule.Type == v1alpha1.FileTypeDirectory {
		fs.isDir = true
		fs.entries = map[string]bool{}
	}
	e.files[p] = fs
	if res.Dir == "" && res.Rule.Lifetime == v1alpha1.LifetimeConsumed {
		fs.consumers = e.rules.Consumers(p)
		e.consumed[fs] = struct{}{}
	}
	if fs.res.Commit == v1alpha1.CommitOnTermination || fs.res.Commit == v1alpha1.CommitOnFile ||
		fs.isDir && fs.res.Commit == v1alpha1.CommitOnClose {
		e.pending[fs] = struct{}{}
	}
	return fs
}

func (e *Engine) snapshot(fs *fileState) FileStatus {
	st := FileStatus{
		Resolution: fs.res, Exists: fs.exists, IsDir: fs.isDir, Committed: fs.committed,
		Size: fs.size, Closes: fs.closes, Entries: len(fs.entries), CommittedEntries: fs.committedEntries,
		ProducersExited: e.producersGone(fs),
		Opened:          fs.opened,
		Generation:      fs.gen,
		Released:        fs.released,
	}
	return st
}

// OnCreate registers fn to be called, without the engine's lock held, each time a
// governed path is created. Register observers before the first event.
func (e *Engine) OnCreate(fn func(FileStatus)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.onCreate = append(e.onCreate, fn)
}

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

// Quiesce returns once the observers of every update made before the call have returned
// (OnCommit, OnRelease and the others run after the update's lock is released, so an
// update's caller, or another caller that saw its effect, may return before them), or
// with ctx's error. A caller that reports what the observers did (the files a run
// released) calls it first.
func (e *Engine) Quiesce(ctx context.Context) error { return e.observing.Wait(ctx) }

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

// Create records that p was created, as a directory when dir is true. Creating a file in a
// governed directory adds it to the directory's entries. Creating a committed file returns
// ErrCommitted; creating an existing one is a no-op.
func (e *Engine) Create(p string, dir bool) error {
	e.mu.Lock()
	var batch commitBatch
	defer e.finish(&batch)
	fs := e.state(p)
	if fs == nil {
		e.addEntry(pathpattern.Parent(p), p, &batch)
		if dir && e.rules.ImpliedDir(p, "") {
			// a plain directory governed files will live in: a consumer's lookup of it
			// waits for it (AnyChange)
			e.broadcast()
		}
		return ErrNotGoverned
	}
	if fs.exists {
		if fs.committed && !fs.isDir {
			return ErrCommitted
		}
		return nil
	}
	fs.exists = true
	if dir {
		fs.isDir = true
		if fs.entries == nil {
			fs.entries = map[string]bool{}
		}
	}
	e.addEntry(pathpattern.Parent(p), p, &batch)
	batch.created = append(batch.created, e.snapshot(fs))
	e.evaluate(fs, &batch)
	fs.notify()
	return nil
}

// addEntry records child in its governed parent directory, if any.
func (e *Engine) addEntry(parent, child string, batch *commitBatch) {
	if parent == "." {
		return
	}
	dir := e.state(parent)
	if dir == nil || !dir.isDir {
		return
	}
	if _, ok := dir.entries[child]; ok {
		return
	}
	cfs := e.files[child]
	dir.entries[child] = cfs != nil && cfs.committed
	if dir.entries[child] {
		dir.committedEntries++
	}
	dir.exists = true
	e.evaluate(dir, batch)
	dir.notify()
}

// Write records that n bytes were written at byte offset off of p. Under NoUpdate they are
// readable at once. It returns ErrCommitted for a committed file.
func (e *Engine) Write(p string, off, n int64) error {
	if n <= 0 {
		return nil
	}
	e.mu.Lock()
	var batch commitBatch
	defer e.finish(&batch)
	fs := e.state(p)
	if fs == nil {
		return ErrNotGoverned
	}
	if fs.committed {
		return ErrCommitted
	}
	fs.exists = true
	fs.written.Add(off, off+n)
	if off+n > fs.size {
		fs.size = off + n
	}
	fs.notify()
	return nil
}

// Truncate records that p was truncated to size bytes. It returns ErrCommitted for a
// committed file.
func (e *Engine) Truncate(p string, size int64) error {
	e.mu.Lock()
	var batch commitBatch
	defer e.finish(&batch)
	fs := e.state(p)
	if fs == nil {
		return ErrNotGoverned
	}
	if fs.committed {
		return ErrCommitted
	}
	fs.exists = true
	if size < fs.size {
		fs.written.Truncate(size)
	}
	fs.size = size
	if size == 0 && fs.poison != nil {
		// Written again from the start (open with O_TRUNC after a failed write): what
		// was incomplete is gone.
		fs.poison = nil
		e.evaluate(fs, &batch)
	}
	fs.notify()
	return nil
}

// Close records one close of a descriptor of p that was opened for writing. Closes are
// summed over all writers (CAPIO-CL on_close:N).
func (e *Engine) Close(p string) error {
	e.mu.Lock()
	var batch commitBatch
	defer e.finish(&batch)
	fs := e.state(p)
	if fs == nil {
		return ErrNotGoverned
	}
	if fs.poison != nil {
		return fs.poison // a close of an incomplete file does not count (on_close)
	}
	fs.closes++
	e.evaluate(fs, &batch)
	fs.notify()
	return nil
}

// Rename records that a file of size bytes was renamed from oldPath onto newPath. The new
// name counts as created, fully written and closed once, so that the write-to-temp-then-
// rename idiom commits an OnClose file. The old name, if governed, is forgotten, even when
// it had committed: a view renames a committed file only when its own step created it as
// a temporary and no reader opened it (the temp-then-rename rule, docs/semantics.md), and
// every peer applies the rename as the writer's view decided it.
func (e *Engine) Rename(oldPath, newPath string, size int64) error {
	e.mu.Lock()
	var batch commitBatch
	defer e.finish(&batch)
	if old, ok := e.files[oldPath]; ok {
		e.forget(oldPath, old)
	}
	return e.appear(newPath, size, &batch)
}

// Link records that newPath was made a new name (a hard link) for the file oldPath of
// size bytes, committed or not: the new name appears complete, as a renamed file does
// (created, fully written, closed once), so that a link in an OnClose output commits at
// once, and commits by its own rule. The old name is unchanged; the view that made the
// link keeps both names' bytes as they are at the link (docs/semantics.md, "Hard links
// and special files"). It returns ErrNotGoverned when no rule governs newPath,
// ErrCommitted when newPath is committed already, and the *PoisonError of oldPath when
// oldPath can never be complete (its bytes are not whole).
func (e *Engine) Link(oldPath, newPath string, size int64) error {
	e.mu.Lock()
	var batch commitBatch
	defer e.finish(&batch)
	if old, ok := e.files[oldPath]; ok && old.poison != nil {
		return old.poison
	}
	return e.appear(newPath, size, &batch)
}

// Symlink records that p was created as a symbolic link (to target, which the engine does
// not need): it appears complete, as a renamed file does (created, closed once), so that
// a symlink in an OnClose output commits at once; readers see it under the firing rule.
func (e *Engine) Symlink(p, target string) error {
	e.mu.Lock()
	var batch commitBatch
	defer e.finish(&batch)
	return e.appear(p, 0, &batch)
}

// appear records that p appeared complete with size bytes (a rename onto it, a symlink):
// created, fully written, closed once. Called with e.mu held.
func (e *Engine) appear(p string, size int64, batch *commitBatch) error {
	fs := e.state(p)
	if fs == nil {
		return ErrNotGoverned
	}
	if fs.committed {
		return ErrCommitted
	}
	created := !fs.exists
	fs.exists = true
	fs.written = byterange.Set{}
	fs.written.Add(0, size)
	fs.size = size
	fs.closes++
	e.addEntry(pathpattern.Parent(p), p, batch)
	if created {
		batch.created = append(batch.created, e.snapshot(fs))
	}
	e.evaluate(fs, batch)
	fs.notify()
	return nil
}

// forget drops the record of p (renamed away): it leaves its directory's entries, and the
// committed counters if it had committed. Called with e.mu held.
func (e *Engine) forget(p string, fs *fileState) {
	delete(e.files, p)
	delete(e.pending, fs)
	delete(e.consumed, fs)
	if fs.committed {
		e.committed--
	}
	if dir, ok := e.files[pathpattern.Parent(p)]; ok && dir.isDir {
		if was, in := dir.entries[p]; in {
			delete(dir.entries, p)
			if was {
				dir.committedEntries--
			}
			dir.notify()
		}
	}
	fs.notify()
}

// NoteOpened records that a reader opened p through a view of this node: from then on
// its creator may no longer rename it away once committed (the temp-then-rename rule).
func (e *Engine) NoteOpened(p string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if fs, ok := e.files[p]; ok && !fs.opened {
		fs.opened = true
	}
}

// Remove records that p was unlinked before it committed; waiters see it as not existing.
// Removing a committed file changes nothing for readers (their view is immutable).
func (e *Engine) Remove(p string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	fs, ok := e.files[p]
	if !ok {
		return ErrNotGoverned
	}
	if fs.committed {
		return nil
	}
	fs.exists = false
	fs.size = 0
	fs.written = nil
	fs.closes = 0
	fs.notify()
	return nil
}

// Terminate records that instance (0-based) of step exited for good after an attempt
// that succeeded. It is idempotent. It commits OnTermination files once enough producer
// instances have exited, and lets waits on files whose producers have all exited end with
// ErrNeverCreated or ErrNeverCommitted.
func (e *Engine) Terminate(step string, instance int) { e.terminate(step, instance, "") }

// TerminateFailed records that instance (0-based) of step exited for good after an
// attempt that failed, with no retries left; reason says how, e.g. "exit code 2". It is
// idempotent, and the first termination recorded for an instance stands. The instance
// counts as exited (its consumers need nothing more of it) but not towards the commit
// rules that wait for producers to succeed: OnTermination (files, directories, and the
// files in an OnNFiles directory) and a directory's OnClose. Every wait on a path of its
// rules that has not ended ends at once, with a *WaitError wrapping a
// *ProducerFailedError that names the instance, when the commit rule can no longer hold
// or every producer instance has exited (docs/semantics.md, "When waiting cannot end").
func (e *Engine) TerminateFailed(step string, instance int, reason string) {
	if reason == "" {
		reason = "failed"
	}
	e.terminate(step, instance, reason)
}

// terminate records the termination of step[instance], failed when failure is not "".
func (e *Engine) terminate(step string, instance int, failure string) {
	e.mu.Lock()
	var batch commitBatch
	defer e.finish(&batch)
	inst := e.terminated[step]
	if inst == nil {
		inst = map[int]bool{}
		e.terminated[step] = inst
	}
	if inst[instance] {
		return
	}
	inst[instance] = true
	e.broadcast()
	if failure != "" {
		if e.failures[step] == nil {
			e.failures[step] = map[int]string{}
		}
		e.failures[step][instance] = failure
	}
	e.settle(&batch)
	for fs := range e.consumed {
		e.maybeRelease(fs, &batch)
		e.maybePunch(fs, &batch)
	}
	for _, fs := range e.files {
		if fs.res.Rule.producedBy(step) {
			fs.notify()
		}
	}
}

// Terminated returns how many instances of step have exited.
func (e *Engine) Terminated(step string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.terminated[step])
}

// exited counts the exited producer instances of rule r, failed ones included. Called
// with e.mu held.
func (e *Engine) exited(r *Rule) int {
	n := 0
	for _, s := range r.Producers {
		n += len(e.terminated[s])
	}
	return n
}

// succeeded counts the producer instances of rule r that exited after an attempt that
// succeeded. Called with e.mu held.
func (e *Engine) succeeded(r *Rule) int {
	n := 0
	for _, s := range r.Producers {
		n += len(e.terminated[s]) - len(e.failures[s])
	}
	return n
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

// settle re-evaluates pending files until nothing more commits (OnFile chains).
func (e *Engine) settle(batch *commitBatch) {
	for changed := true; changed; {
		changed = false
		for fs := range e.pending {
			if e.evaluate(fs, batch) {
				changed = true
			}
		}
	}
}

// evaluate commits fs if its commit rule holds; it reports whether it committed.
// Called with e.mu held.
func (e *Engine) evaluate(fs *fileState, batch *commitBatch) bool {
	if fs.committed || fs.poison != nil || !(fs.exists || fs.isDir) || !e.ruleHolds(fs) {
		return false
	}
	fs.committed = true
	delete(e.pending, fs)
	e.committed++
	batch.committed = append(batch.committed, e.snapshot(fs))
	fs.notify()
	// The parent directory counts committed entries (OnNFiles).
	if parent := pathpattern.Parent(fs.res.Path); parent != "." {
		if dir, ok := e.files[parent]; ok && dir.isDir {
			if was, in := dir.entries[fs.res.Path]; in && !was {
				dir.entries[fs.res.Path] = true
				dir.committedEntries++
				e.evaluate(dir, batch)
				dir.notify()
			}
		}
	}
	e.maybeRelease(fs, batch)
	// Files waiting on this one (OnFile) may commit now.
	if len(e.pending) > 0 {
		e.settle(batch)
	}
	return true
}

// maybeRelease releases the committed Consumed file fs once every instance of every step
// that declares it as an input has exited (docs/semantics.md, "Consumed files"). Called
// with e.mu held.
func (e *Engine) maybeRelease(fs *fileState, batch *commitBatch) {
	if fs.released || !fs.committed || len(fs.consumers) == 0 {
		return
	}
	for _, s := range fs.consumers {
		info, _ := e.rules.Step(s)
		for i := range info.Replicas {
			if !e.terminated[s][i] && !fs.finished[s+"/"+strconv.Itoa(i)] {
				return
			}
		}
	}
	fs.released = true
	delete(e.consumed, fs)
	batch.released = append(batch.released, e.snapshot(fs))
}

// ReadToEnd records that instance (0-based) of step read the committed file p to its end
// and closed it. A Consumed file is released once every instance of every step that
// declares it as an input has exited or done so (docs/semantics.md, "Consumed files");
// an instance must not open it again. Calls for files that are not committed, or for
// steps that do not declare them, are ignored.
func (e *Engine) ReadToEnd(p, step string, instance int) {
	e.mu.Lock()
	var batch commitBatch
	defer e.finish(&batch)
	fs, ok := e.files[p]
	if !ok || !fs.committed || fs.released || !slices.Contains(fs.consumers, step) {
		return
	}
	if fs.finished == nil {
		fs.finished = map[string]bool{}
	}
	fs.finished[step+"/"+strconv.Itoa(instance)] = true
	e.maybeRelease(fs, &batch)
}

// PunchStep is how much further than the last released range every consumer of a
// Consumed NoUpdate file must have read before the next range is released: 1 MiB.
const PunchStep = 1 << 20

// ReadProgress records that instance (0-based) of step has read the governed file p
// contiguously from its start to byte offset off. For a Consumed NoUpdate file, once
// every instance of every step that declares it as an input has read (or exited) past
// PunchStep more bytes than were released, the bytes before the slowest one's offset are
// released: the OnPunch observers free them in the node store, and a later read of them
// fails with ErrReleased (docs/semantics.md, "Consumed files"). Instances whose progress
// this engine does not hear of (other nodes, other pods) hold the release back.
func (e *Engine) ReadProgress(p, step string, instance int, off int64) {
	e.mu.Lock()
	var batch commitBatch
	defer e.finish(&batch)
	fs, ok := e.files[p]
	if !ok || len(fs.consumers) == 0 || fs.res.Fire != v1alpha1.FireNoUpdate || fs.released {
		return
	}
	key := step + "/" + strconv.Itoa(instance)
	if !slices.Contains(fs.consumers, step) || off <= fs.progress[key] {
		return
	}
	if fs.progress == nil {
		fs.progress = map[string]int64{}
	}
	fs.progress[key] = off
	e.maybePunch(fs, &batch)
}

// maybePunch releases the start of the Consumed NoUpdate file fs up to where its slowest
// declared consumer instance has read, once that is PunchStep past the last release.
// Called with e.mu held.
func (e *Engine) maybePunch(fs *fileState, batch *commitBatch) {
	if fs.released || fs.res.Fire != v1alpha1.FireNoUpdate || len(fs.consumers) == 0 {
		return
	}
	slowest := int64(-1)
	for _, s := range fs.consumers {
		info, _ := e.rules.Step(s)
		for i := range info.Replicas {
			if e.terminated[s][i] {
				continue // it needs nothing more
			}
			if at := fs.progress[s+"/"+strconv.Itoa(i)]; slowest < 0 || at < slowest {
				slowest = at
			}
		}
	}
	if slowest < 0 || slowest > fs.size {
		slowest = fs.size // every consumer exited
	}
	upto := slowest &^ 4095
	if upto-fs.punched < PunchStep {
		return
	}
	fs.punched = upto
	batch.punched = append(batch.punched, punch{p: fs.res.Path, upto: upto})
	fs.notify()
}

// OnPunch registers fn to be called, without the engine's lock held, each time the first
// upto bytes of the Consumed NoUpdate file p are released (ReadProgress). Register
// observers before the first event.
func (e *Engine) OnPunch(fn func(p string, upto int64)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.onPunch = append(e.onPunch, fn)
}

// OnRelease registers fn to be called, without the engine's lock held, each time a
// Consumed file is released: its consumers have all exited and its bytes may be deleted
// from the node store. Register observers before the first event.
func (e *Engine) OnRelease(fn func(FileStatus)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.onRelease = append(e.onRelease, fn)
}

// ruleHolds says whether the commit rule of fs holds now. Called with e.mu held.
func (e *Engine) ruleHolds(fs *fileState) bool {
	res := fs.res
	switch res.Commit {
	case v1alpha1.CommitOnClose:
		if fs.isDir {
			return e.succeeded(res.Rule) >= res.Rule.Instances
		}
		return fs.closes >= res.Count
	case v1alpha1.CommitOnTermination:
		return e.succeeded(res.Rule) >= res.Count
	case v1alpha1.CommitOnNFiles:
		return fs.committedEntries >= res.Count
	case v1alpha1.CommitOnFile:
		for _, d := range res.Deps {
			dfs, ok := e.files[d]
			if !ok || !dfs.committed {
				return false
			}
		}
		return true
	}
	return false
}

// producersGone reports whether every producer instance of fs has exited. Called with e.mu
// held.
func (e *Engine) producersGone(fs *fileState) bool {
	return e.exited(fs.res.Rule) >= fs.res.Rule.Instances
}

// Status returns a snapshot of p. A path no rule governs has Managed() false.
func (e *Engine) Status(p string) FileStatus {
	e.mu.Lock()
	defer e.mu.Unlock()
	if fs, ok := e.files[p]; ok {
		return e.snapshot(fs)
	}
	st := FileStatus{Resolution: e.rules.Resolve(p)}
	if st.Rule != nil {
		st.ProducersExited = e.exited(st.Rule) >= st.Rule.Instances
	}
	return st
}

// Visible reports whether the entry child of a governed directory is listed to readers now:
// under NoUpdate as soon as it exists, under Update once it is committed. Paths no rule
// governs are always visible.
func (e *Engine) Visible(child string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	fs, ok := e.files[child]
	if !ok {
		return e.rules.Resolve(child).Rule == nil
	}
	if !fs.exists {
		return false
	}
	fire := fs.res.Fire
	if parent, ok := e.files[pathpattern.Parent(child)]; ok && parent.isDir {
		fire = parent.res.Fire
	}
	return fire == v1alpha1.FireNoUpdate || fs.committed
}

// Counters returns the number of committed paths.
func (e *Engine) Counters() (committed int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.committed
}

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
		if fs.failed != nil {
			done, err = false, fs.failed
		}
		if fs.poison != nil {
			done, err = false, fs.poison
		}
		st := e.snapshot(fs)
		ch := fs.changed
		waiting := what
		if fn, ok := waitingDetail[what]; ok {
			waiting = fn(e, fs)
		}
		e.mu.Unlock()
		if err != nil {
			return st, &WaitError{Path: p, Rule: fs.res.Describe(), Waiting: waiting, Err: err}
		}
		if done {
			return st, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return st, &WaitError{Path: p, Rule: fs.res.Describe(), Waiting: waiting, Err: ctx.Err()}
		}
	}
}

// waitingDetail renders what a wait is for with the file's progress, for error messages.
var waitingDetail = map[string]func(e *Engine, fs *fileState) string{
	"commit": func(e *Engine, fs *fileState) string {
		switch fs.res.Commit {
		case v1alpha1.CommitOnClose:
			return fmt.Sprintf("commit (closes %d of %d)", fs.closes, fs.res.Count)
		case v1alpha1.CommitOnTermination:
			if f := e.failedCount(fs.res.Rule); f > 0 {
				return fmt.Sprintf("commit (producer instances exited %d of %d, %d failed)", e.exited(fs.res.Rule), fs.res.Count, f)
			}
			return fmt.Sprintf("commit (producer instances exited %d of %d)", e.exited(fs.res.Rule), fs.res.Count)
		case v1alpha1.CommitOnNFiles:
			return fmt.Sprintf("commit (committed files %d of %d)", fs.committedEntries, fs.res.Count)
		}
		return "commit"
	},
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

// Readable returns how many bytes a reader may read from byte offset off of p now, and
// whether off is at or past the end of a committed file (EOF). Before commit, under
// NoUpdate, that is the written bytes contiguous from off (a hole stops it); under Update,
// nothing. After commit, everything up to the final size (holes read as zeros).
func (e *Engine) Readable(p string, off int64) (n int64, eof bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	fs, ok := e.files[p]
	if !ok {
		return 0, false
	}
	return readable(fs, off)
}

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
// at EOF of the committed file, and returns Readable's answer. EOF never comes before
// commit. gen, when not 0, is the Generation of the file the reader opened: if p no longer
// names that file (it was withdrawn, or renamed away and made again) the wait fails with a
// *WaitError wrapping a *WithdrawnError (errors.Is ErrWithdrawn) instead of reading
// another file's progress. It fails with a *WaitError wrapping ErrNeverCommitted (through
// a *ProducerFailedError when a producer failed, TerminateFailed) or the context's error.
func (e *Engine) WaitRead(ctx context.Context, p string, gen uint64, off int64) (n int64, eof bool, err error) {
	_, err = e.wait(ctx, p, "commit", func(fs *fileState) (bool, error) {
		if gen != 0 && fs.gen != gen {
			if werr, ok := e.withdrawn[gen]; ok {
				return false, werr
			}
			return false, &WithdrawnError{Path: p, Reason: "the file it names is no longer the one opened"}
		}
		if off < fs.punched {
			return false, fmt.Errorf("%w: a read at offset %d, released up to %d", ErrReleased, off, fs.punched)
		}
		n, eof = readable(fs, off)
		if n > 0 || eof {
			return true, nil
		}
		return false, e.hopeless(fs, ErrNeverCommitted)
	})
	return n, eof, err
}

// DirComplete reports whether the governed directory p is committed, i.e. a listing of it
// may end. Paths no rule governs are always complete.
func (e *Engine) DirComplete(p string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	fs, ok := e.files[p]
	if !ok {
		return e.rules.Resolve(p).Rule == nil
	}
	return fs.committed
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
	if fs.failed == nil {
		fs.failed = err
		fs.notify()
	}
	return true
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
// when it committed) and ErrNotGoverned for a path no rule governs. The observers
// registered with OnPoison are called after the lock is released.
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
	case fs.poison != nil:
		return nil
	}
	perr := &PoisonError{Path: p, Reason: reason}
	fs.poison = perr
	fs.notify()
	batch.poisoned = append(batch.poisoned, perr)
	return nil
}

// Poisoned returns the *PoisonError of p, or nil if p is not poisoned.
func (e *Engine) Poisoned(p string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if fs, ok := e.files[p]; ok && fs.poison != nil {
		return fs.poison
	}
	return nil
}

// OnPoison registers fn to be called, without the engine's lock held, each time a file is
// poisoned (Poison). Register observers before the first event.
func (e *Engine) OnPoison(fn func(*PoisonError)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.onPoison = append(e.onPoison, fn)
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
// instances may have entries in them). The observers registered with OnWithdraw are
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

// OnWithdraw registers fn to be called, without the engine's lock held, each time a file
// is withdrawn (Withdraw). Register observers before the first event.
func (e *Engine) OnWithdraw(fn func(*WithdrawnError)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.onWithdraw = append(e.onWithdraw, fn)
}

// Failed returns the error p was marked with by Fail, or nil.
func (e *Engine) Failed(p string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if fs, ok := e.files[p]; ok {
		return fs.failed
	}
	return nil
}

// Changed returns a channel closed at the next change of p (nil for a path no rule
// governs), for callers that multiplex a wait with other events.
func (e *Engine) Changed(p string) <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	if fs := e.state(p); fs != nil {
		return fs.changed
	}
	return nil
}
