package semantics

import (
	"slices"
	"strconv"

	"github.com/sluice-io/sluice/api/v1alpha1"
)

// maybeRelease releases the committed Consumed file fs once every instance of every step
// that declares it as an input has exited (docs/semantics.md, "Consumed files"). Called
// with e.mu held.
func (e *Engine) maybeRelease(fs *fileState, batch *commitBatch) {
	if fs.isReleased() || !fs.committed || len(fs.consumerSteps()) == 0 {
		return
	}
	for _, s := range fs.x.consumers {
		info, _ := e.rules.Step(s)
		for i := range info.Replicas {
			if !e.terminated[s][i] && !fs.x.finished[s+"/"+strconv.Itoa(i)] {
				return
			}
		}
	}
	fs.x.released = true
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
	if !ok || !fs.committed || fs.isReleased() || !slices.Contains(fs.consumerSteps(), step) {
		return
	}
	if fs.x.finished == nil {
		fs.x.finished = map[string]bool{}
	}
	fs.x.finished[step+"/"+strconv.Itoa(instance)] = true
	e.maybeRelease(fs, &batch)
}

// PunchStep is how much further than the last released range every consumer of a
// Consumed NoUpdate file must have read before the next range is released: 1 MiB.
const PunchStep = 1 << 20

// ReadProgress records that instance (0-based) of step has read the governed file p
// contiguously from its start to byte offset off. For a Consumed NoUpdate file, once
// every instance of every step that declares it as an input has read (or exited) past
// PunchStep more bytes than were released, the bytes before the slowest one's offset are
// released: the Punch observers free them in the node store, and a later read of them
// fails with ErrReleased (docs/semantics.md, "Consumed files"). Instances whose progress
// this engine does not hear of (other nodes, other pods) hold the release back.
func (e *Engine) ReadProgress(p, step string, instance int, off int64) {
	e.mu.Lock()
	var batch commitBatch
	defer e.finish(&batch)
	fs, ok := e.files[p]
	if !ok || len(fs.consumerSteps()) == 0 || fs.res.Fire != v1alpha1.FireNoUpdate || fs.isReleased() {
		return
	}
	key := step + "/" + strconv.Itoa(instance)
	if !slices.Contains(fs.x.consumers, step) || off <= fs.x.progress[key] {
		return
	}
	if fs.x.progress == nil {
		fs.x.progress = map[string]int64{}
	}
	fs.x.progress[key] = off
	e.maybePunch(fs, &batch)
}

// maybePunch releases the start of the Consumed NoUpdate file fs up to where its slowest
// declared consumer instance has read, once that is PunchStep past the last release.
// Called with e.mu held.
func (e *Engine) maybePunch(fs *fileState, batch *commitBatch) {
	if fs.isReleased() || fs.res.Fire != v1alpha1.FireNoUpdate || len(fs.consumerSteps()) == 0 {
		return
	}
	slowest := int64(-1)
	for _, s := range fs.x.consumers {
		info, _ := e.rules.Step(s)
		for i := range info.Replicas {
			if e.terminated[s][i] {
				continue // it needs nothing more
			}
			if at := fs.x.progress[s+"/"+strconv.Itoa(i)]; slowest < 0 || at < slowest {
				slowest = at
			}
		}
	}
	if slowest < 0 || slowest > fs.size {
		slowest = fs.size // every consumer exited
	}
	upto := slowest &^ 4095
	if upto-fs.x.punched < PunchStep {
		return
	}
	fs.x.punched = upto
	batch.punched = append(batch.punched, punch{p: fs.path, upto: upto})
	fs.notify()
}
