package semantics

import (
	"github.com/sluice-io/sluice/internal/byterange"
	"github.com/sluice-io/sluice/internal/pathpattern"
)

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
		if x := fs.more(); x.entries == nil {
			x.entries = map[string]bool{}
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
	if _, ok := dir.x.entries[child]; ok {
		return
	}
	cfs := e.files[child]
	dir.x.entries[child] = cfs != nil && cfs.committed
	if dir.x.entries[child] {
		dir.x.committedEntries++
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
	if size == 0 && fs.poisoned() != nil {
		// Written again from the start (open with O_TRUNC after a failed write): what
		// was incomplete is gone.
		fs.x.poison = nil
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
	if perr := fs.poisoned(); perr != nil {
		return perr // a close of an incomplete file does not count (on_close)
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
	if old, ok := e.files[oldPath]; ok && old.poisoned() != nil {
		return old.poisoned()
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
		if was, in := dir.x.entries[p]; in {
			delete(dir.x.entries, p)
			if was {
				dir.x.committedEntries--
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
