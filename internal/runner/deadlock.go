package runner

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sluice-io/sluice/internal/streamfs"
)

// defaultDeadlockGrace is Options.DeadlockGrace's default.
const defaultDeadlockGrace = 3 * time.Second

// DeadlockError is returned when a run can no longer make progress: every instance
// still running waits on a governed file (an open, read, listing or stat parked by the
// rules), and nothing changed in any view or engine for Options.DeadlockGrace. Only a
// running instance could write what they wait for, and each of them waits too: the
// waits would end only at the wait timeout.
type DeadlockError struct {
	// Workflow is the workflow's name.
	Workflow string
	// Grace is how long nothing changed.
	Grace time.Duration
	// Waiting are the waiting instances and what each waits for.
	Waiting []InstanceWaits
}

// InstanceWaits is what one instance waits for.
type InstanceWaits struct {
	// Instance is step[i].
	Instance string
	// Waits describe each wait with its file and rule, e.g. `open of "b.txt"
	// (OnTermination:1, Update)`, followed by the steps that produce the file.
	Waits []string
}

func (e *DeadlockError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "workflow %s deadlocked: every running instance waits on a file that only a waiting instance can make (nothing changed for %s)", e.Workflow, e.Grace)
	b.WriteString(describeWaits(e.Waiting))
	return b.String()
}

// waitWatch watches a run for deadlocks (watchDeadlock) and keeps the last view of what
// each instance waited for, which a timed-out run reports.
type waitWatch struct {
	mu   sync.Mutex
	last []InstanceWaits
}

func (w *waitWatch) snapshot() []InstanceWaits {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last
}

// watchDeadlock checks the run every quarter of a second until done is closed, and
// cancels it with a *DeadlockError (cancel's cause) once every instance that has not
// ended is running and waiting on the rules, and the run's progress figures (bytes
// written and read, commits, attempts, waits) have not changed for grace. A stage-in
// in progress counts as progress. It returns when done is closed or it cancelled.
func (r *run) watchDeadlock(ww *waitWatch, grace time.Duration, stageIn func() bool, done <-chan struct{}, cancel context.CancelCauseFunc) {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	var (
		stuckSince time.Time
		lastMark   string
	)
	for {
		select {
		case <-done:
			return
		case <-tick.C:
		}
		waiting, allWait, mark := r.waitState()
		ww.mu.Lock()
		ww.last = waiting
		ww.mu.Unlock()
		if !allWait || stageIn() {
			stuckSince = time.Time{}
			continue
		}
		if mark != lastMark || stuckSince.IsZero() {
			stuckSince, lastMark = time.Now(), mark
			continue
		}
		if time.Since(stuckSince) >= grace {
			err := &DeadlockError{Workflow: r.wf.Name, Grace: grace, Waiting: waiting}
			// The run's error gives the waits; the log says only when the run was stopped.
			r.log.Info("deadlock: every running instance waits on the rules and nothing changes; stopping the run", "grace", grace.String())
			cancel(err)
			return
		}
	}
}

// waitState returns what each instance waits for now, whether every instance that has
// not ended waits on the rules (and at least one does), and a mark of the run's progress
// that changes whenever anything is written, read, committed, retried or waited for.
func (r *run) waitState() (waiting []InstanceWaits, allWait bool, mark string) {
	allWait = true
	var m strings.Builder
	for _, in := range r.instances {
		st, _ := in.state()
		in.mu.Lock()
		attempts := in.attempts
		in.mu.Unlock()
		fmt.Fprintf(&m, "%d/%d;", st, attempts)
		if in.view == nil {
			continue
		}
		s := in.view.Stats()
		fmt.Fprintf(&m, "%d/%d/%d;", s.BytesWritten, s.BytesRead, len(s.Waits))
		if st != stateRunning {
			if st == statePending {
				allWait = false
			}
			continue
		}
		if len(s.Waits) == 0 || slices.ContainsFunc(s.Waits, func(w streamfs.Wait) bool { return strings.HasPrefix(w.What, "fetch of ") }) {
			// computing, or sleeping, or fetching bytes from another node: it may go on
			allWait = false
			continue
		}
		iw := InstanceWaits{Instance: fmt.Sprintf("%s[%d]", in.step, in.index)}
		for _, w := range s.Waits {
			desc := w.What
			if res := r.rules.Resolve(w.Path); res.Rule != nil && len(res.Rule.Producers) > 0 {
				desc += ", made by step " + strings.Join(res.Rule.Producers, ", ")
			}
			iw.Waits = append(iw.Waits, desc)
		}
		waiting = append(waiting, iw)
	}
	for _, n := range r.nodes {
		fmt.Fprintf(&m, "c%d;", n.Engine.Counters())
	}
	sort.Slice(waiting, func(i, j int) bool { return waiting[i].Instance < waiting[j].Instance })
	return waiting, allWait && len(waiting) > 0, m.String()
}

// describeWaits formats what each instance waited for, one line each, for an error.
func describeWaits(ws []InstanceWaits) string {
	var b strings.Builder
	for _, w := range ws {
		fmt.Fprintf(&b, "\n  %s waits for %s", w.Instance, strings.Join(w.Waits, "; "))
	}
	return b.String()
}
