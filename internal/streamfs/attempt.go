package streamfs

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/pathpattern"
	"github.com/sluice-io/sluice/internal/semantics"
)

// noteInputOpened records that a consumer in this view opened the governed file p whose
// FileStatus.Generation is gen.
func (v *View) noteInputOpened(gen uint64, p string) {
	if gen == 0 {
		return
	}
	v.bmu.Lock()
	v.inputs[gen] = p
	v.bmu.Unlock()
}

// OpenedInput reports whether a process of this view opened, as a consumer, the file of
// Generation gen (semantics.FileStatus.Generation of the view's semantics): a step instance
// that opened a file later withdrawn may have used what its failed producer wrote.
func (v *View) OpenedInput(gen uint64) bool {
	v.bmu.Lock()
	defer v.bmu.Unlock()
	_, ok := v.inputs[gen]
	return ok
}

// OpenedInputs returns the volume paths of the governed files processes of this view
// opened as consumers, sorted, each once: what a finished step instance may have built
// its outputs from (its sidecar records them, so that a withdrawal after it ended still
// finds it, docs/kubernetes.md).
func (v *View) OpenedInputs() []string {
	v.bmu.Lock()
	defer v.bmu.Unlock()
	out := make([]string, 0, len(v.inputs))
	for _, p := range v.inputs {
		out = append(out, p)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// noteCreated records that this view created file p.
func (v *View) noteCreated(p string) {
	v.bmu.Lock()
	v.created[p] = true
	v.bmu.Unlock()
}

// Withdraw takes back every governed file this view's step instance brought into being
// (created, renamed onto, linked or symlinked) and still names, because the attempt
// failed (docs/semantics.md, "A failed attempt withdraws its outputs"): each is withdrawn
// from the semantics on every node (semantics.Engine.Withdraw, with reason) and removed
// from the node store, so that a retry writes it again from nothing and no reader opens
// what the failed attempt left. Call it after the attempt's processes have exited and
// before a retry runs in this view. It returns the withdrawn paths, sorted; the view
// then starts over with no files of its own. Errors are returned joined, one per file,
// after every file was tried.
func (v *View) Withdraw(reason string) ([]string, error) {
	v.bmu.Lock()
	paths := make([]string, 0, len(v.created))
	for p := range v.created {
		paths = append(paths, p)
	}
	v.created = map[string]bool{}
	v.bmu.Unlock()
	sort.Strings(paths)
	var done []string
	var errs []error
	for _, p := range paths {
		res := v.rules.Resolve(p)
		if !res.Governed() {
			continue // a scratch file no rule governs is the step's own business
		}
		if sharedByWriters(res) {
			// Other instances write it too: withdrawing it would take their bytes and
			// closes with it. It stays; the retry writes its part again.
			v.opts.Log.Info("not withdrawn: other step instances write this file too", "path", pathpattern.Printable(p),
				"rule", res.Describe(), "producerInstances", res.Rule.Instances, "step", v.opts.Step, "instance", v.opts.Instance)
			continue
		}
		if err := v.sem.Withdraw(p, reason); err != nil {
			errs = append(errs, fmt.Errorf("withdrawing %s: %w", pathpattern.Printable(p), err))
			continue
		}
		if _, err := v.store.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("removing withdrawn %s from the node store: %w", pathpattern.Printable(p), err))
		}
		done = append(done, p)
	}
	// The kernel may hold this view's entries of the withdrawn files (a writer's own files
	// are cached, fillAttr): drop them before a retry in this view opens the names again,
	// or its open would reach the withdrawn file's node instead of creating a new one.
	// Withdraw runs outside any request of this view, so waiting for the kernel's
	// directory locks here cannot deadlock.
	for _, p := range done {
		v.invalidate(p)
	}
	if len(done) > 0 {
		v.opts.Log.Info("withdrew the failed attempt's outputs", "step", v.opts.Step, "instance", v.opts.Instance,
			"files", len(done), "reason", reason)
	}
	return done, errors.Join(errs...)
}

// sharedByWriters reports whether a file of resolution res is meant to be written by
// several step instances: the rule has more than one producer instance, and the file's
// closes are summed over writers (OnClose with a count above 1) or it commits when
// several producer instances have exited (OnTermination). A file of a single producer
// instance is that instance's alone, whatever its count.
func sharedByWriters(res semantics.Resolution) bool {
	if res.Rule.Instances <= 1 {
		return false
	}
	switch res.Commit {
	case v1alpha1.CommitOnClose:
		return res.Count > 1
	case v1alpha1.CommitOnTermination:
		return true
	}
	return false
}

// writesAlone reports whether this view is the only one that changes the uncommitted
// governed file p of resolution res: it created p, and p is not meant to be written by
// several step instances (sharedByWriters).
func (v *View) writesAlone(p string, res semantics.Resolution) bool {
	if sharedByWriters(res) {
		return false
	}
	v.bmu.Lock()
	defer v.bmu.Unlock()
	return v.created[p]
}

// forgetCreated records that file p left its name (renamed or removed).
func (v *View) forgetCreated(p string) {
	v.bmu.Lock()
	delete(v.created, p)
	v.bmu.Unlock()
}

// mayRenameAway reports whether the committed file p may still be renamed: the
// write-to-temp-then-rename rule (docs/semantics.md) lets the step instance that created
// it rename it as long as no reader on this node opened it, because then it was a
// temporary that happened to match an output pattern, never an output anyone used.
func (v *View) mayRenameAway(p string) bool {
	v.bmu.Lock()
	created := v.created[p]
	v.bmu.Unlock()
	st := v.sem.Status(p)
	return created && st.Governed() && st.Committed && !st.IsDir && !st.Opened
}
