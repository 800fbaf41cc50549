package semantics

import (
	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/pathpattern"
)

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
	if fs.committed || fs.poisoned() != nil || !(fs.exists || fs.isDir) || !e.ruleHolds(fs) {
		return false
	}
	fs.committed = true
	delete(e.pending, fs)
	e.committed++
	batch.committed = append(batch.committed, e.snapshot(fs))
	fs.notify()
	// The parent directory counts committed entries (OnNFiles).
	if parent := pathpattern.Parent(fs.path); parent != "." {
		if dir, ok := e.files[parent]; ok && dir.isDir {
			if was, in := dir.x.entries[fs.path]; in && !was {
				dir.x.entries[fs.path] = true
				dir.x.committedEntries++
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
		_, committed := fs.entryCounts()
		return committed >= res.Count
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

// producersGone reports whether every producer instance of fs has exited. Called with e.mu
// held.
func (e *Engine) producersGone(fs *fileState) bool {
	return e.exited(fs.res.Rule) >= fs.res.Rule.Instances
}
