package controller

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

// DefaultDeadlockGrace is WorkflowReconciler.DeadlockGrace's default: how long a
// workflow whose every unfinished instance waits on the rules must show no progress
// before it fails as deadlocked. The sidecars record their waits every 5 s; a
// `sluice run` waits 3 s, with every wait seen at once.
const DefaultDeadlockGrace = time.Minute

// ReasonDeadlocked is the reason of a Workflow that failed as deadlocked: every instance
// still running waited on a file that only another waiting instance could make, and
// nothing changed for the deadlock grace; the message names each instance's waits.
const ReasonDeadlocked = "Deadlocked"

// stallWatch remembers, per workflow, the progress mark last seen while every
// unfinished instance waited, and since when it has not changed.
type stallWatch struct {
	mu    sync.Mutex
	seen  map[types.UID]stall
	grace time.Duration
}

type stall struct {
	mark  string
	since time.Time
}

// allWaiting reports whether wf can make no progress on its own: every instance of every
// step has a pod (a step whose pods someone else creates may still get one), every
// instance that has not succeeded runs its latest attempt, and that attempt's sidecar
// recorded at least one wait on the rules. It returns those instances' waits,
// `step[i]: open of "x" (OnClose:1, Update)`, in spec order.
func allWaiting(wf *v1alpha1.Workflow, obs observed) ([]string, bool) {
	waits := map[string][]wfmeta.WaitStat{}
	for _, ps := range obs.stats {
		waits[ps.Pod] = ps.Waits
	}
	var out []string
	for _, s := range wf.Spec.Steps {
		for i := 0; i < int(ptr.Deref(s.Replicas, 1)); i++ {
			at := obs.instances[instanceKey{s.Name, i}]
			if len(at) == 0 {
				return nil, false
			}
			if slices.ContainsFunc(at, func(a attempt) bool { return a.pod.Status.Phase == corev1.PodSucceeded }) {
				continue
			}
			last := at[len(at)-1].pod
			ws := waits[last.Name]
			if last.Status.Phase != corev1.PodRunning || !last.DeletionTimestamp.IsZero() || len(ws) == 0 {
				return nil, false
			}
			for _, w := range ws {
				out = append(out, fmt.Sprintf("%s[%d]: %s", s.Name, i, w.What))
			}
		}
	}
	return out, len(out) > 0
}

// progressMark digests what shows a workflow's progress: the files committed and their
// sizes, each pod's phase, and what each sidecar recorded (bytes held, received,
// released, its waits and since when). Equal marks mean nothing moved.
func progressMark(obs observed, files []wfmeta.FileMeta) string {
	h := sha256.New()
	for _, f := range files {
		fmt.Fprintf(h, "f %q %d\n", f.Path, f.Size)
	}
	var pods []string
	for _, at := range obs.instances {
		for _, a := range at {
			pods = append(pods, a.pod.Name+" "+string(a.pod.Status.Phase))
		}
	}
	slices.Sort(pods)
	fmt.Fprintln(h, strings.Join(pods, ","))
	stats := slices.Clone(obs.stats)
	slices.SortFunc(stats, func(a, b wfmeta.PodStats) int { return strings.Compare(a.Pod, b.Pod) })
	for _, ps := range stats {
		ps.Problems = nil // a failed wait is news, not progress
		b, _ := json.Marshal(ps)
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// check returns the waits of wf once it has been deadlocked for the grace: every
// unfinished instance waits (allWaiting) and the progress mark has not changed since.
// Until then it returns how long to wait before looking again (0: not stalled).
func (w *stallWatch) check(uid types.UID, waiting []string, stalled bool, mark string, now time.Time) ([]string, time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !stalled {
		delete(w.seen, uid)
		return nil, 0
	}
	if w.seen == nil {
		w.seen = map[types.UID]stall{}
	}
	st, ok := w.seen[uid]
	if !ok || st.mark != mark {
		st = stall{mark: mark, since: now}
		w.seen[uid] = st
	}
	if left := st.since.Add(w.grace).Sub(now); left > 0 {
		return nil, left
	}
	return waiting, 0
}

// forget drops what the watch remembers of a workflow (finished or deleted).
func (w *stallWatch) forget(uid types.UID) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.seen, uid)
}

// deadlockMessage is the Failed condition's message of a deadlocked workflow.
func deadlockMessage(grace time.Duration, waits []string) string {
	const most = 10
	shown := waits
	if len(shown) > most {
		shown = shown[:most]
	}
	msg := fmt.Sprintf("deadlocked: every running instance waits on a file that only a waiting instance can make (nothing changed for %s): %s",
		grace, strings.Join(shown, "; "))
	if len(waits) > most {
		msg += fmt.Sprintf("; and %d more", len(waits)-most)
	}
	return msg
}
