package controller

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/pathpattern"
	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

// ReasonTaintedResult is the reason of a Workflow failed by a tainted result: a step
// instance succeeded on an input withdrawn after it read it (the input's producer
// attempt failed), and it cannot be run again: it ended before the withdrawal (its
// outputs stand), or its pod is not the controller's to retry. The message names the
// instance, the input and why it was withdrawn.
const ReasonTaintedResult = "TaintedResult"

// ReasonInputWithdrawn is the reason a Succeeded pod counts as a failed attempt: an input
// it had opened was withdrawn while it ran, and its sidecar withdrew its outputs.
const ReasonInputWithdrawn = "InputWithdrawn"

// taint is why a pod's result rests on withdrawn bytes.
type taint struct {
	// reason names the input and why it was withdrawn.
	reason string
	// late: the withdrawal came after the pod ended, so its outputs were not withdrawn.
	late bool
}

// taintCheckBudget bounds the pattern matches one reconcile spends on the withdrawals a
// workflow recorded (taintedPods): the KV records are written by its sidecars, so their
// number is the tenant's to choose (up to its bucket's MaxBytes), and a step may declare
// a thousand inputs. Failed attempts are rare, so a workflow that needs more recorded
// thousands of withdrawals of inputs of thousands of patterns.
const taintCheckBudget = 1 << 22

// ReasonTaintCheckTooCostly is the reason of a Workflow failed because the withdrawals
// its sidecars recorded are too many to check against its steps' inputs within
// taintCheckBudget: the controller cannot tell whether a result rests on withdrawn bytes,
// so it does not report success.
const ReasonTaintCheckTooCostly = "TaintCheckTooCostly"

// errTaintCheckTooCostly is what taintedPods returns beyond taintCheckBudget.
var errTaintCheckTooCostly = errors.New("the withdrawals recorded are too many to check against the steps' inputs")

// taintedPods finds, from the reads the pods' sidecars recorded and the withdrawals
// recorded by whoever withdrew a file, the pods whose app read a file in a version that
// was withdrawn: while the pod ran (its sidecar saw it and withdrew the pod's outputs),
// or after it ended (a withdrawal of an input it read recorded after its reads, by KV
// revision). A pod that read more inputs than were recorded (AllInputs) is tainted by a
// later withdrawal of any input of its step. Keyed by pod name.
//
// Its cost is linear in the records, plus, once per step whose pods read AllInputs, the
// withdrawals since the step's earliest such read times the step's input patterns, at
// most taintCheckBudget matches
// (errTaintCheckTooCostly beyond); it returns ctx's error once ctx is done.
func taintedPods(ctx context.Context, rules *semantics.RuleSet, md wfmeta.Meta, stepOf map[string]string) (map[string]taint, error) {
	out := map[string]taint{}
	// Metadata gives one withdrawal per path (its last): index them, so that a pod's reads
	// cost one lookup per recorded input, not one per withdrawal.
	byPath := make(map[string]int, len(md.Withdrawals))
	for i, w := range md.Withdrawals {
		byPath[w.Path] = i
	}
	// The withdrawals that may taint an AllInputs read of each step: those after the
	// step's earliest such read (by KV revision). A withdrawal before every read of the
	// step (a failed attempt retried before the step ran) costs nothing.
	since := map[string]uint64{}
	for _, r := range md.Reads {
		if step, ok := stepOf[r.Pod]; ok && r.AllInputs {
			if rev, seen := since[step]; !seen || r.Revision < rev {
				since[step] = r.Revision
			}
		}
	}
	// The withdrawals of each step's inputs, in md.Withdrawals order, found once per step.
	ofStep := map[string][]int{}
	budget := taintCheckBudget
	withdrawalsOf := func(step string) ([]int, error) {
		if ws, ok := ofStep[step]; ok {
			return ws, nil
		}
		si, ok := rules.Step(step)
		if !ok {
			return nil, nil
		}
		pats := rules.Patterns(si.Inputs)
		var later []int
		for i, w := range md.Withdrawals {
			if w.Revision > since[step] {
				later = append(later, i)
			}
		}
		if budget -= len(pats) * len(later); budget < 0 {
			return nil, fmt.Errorf("step %s: %d withdrawals since its reads, of %d input patterns: %w", step, len(later), len(pats), errTaintCheckTooCostly)
		}
		ws := []int{}
		for n, i := range later {
			if n%1024 == 0 && ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if semantics.MatchPrefixAny(pats, md.Withdrawals[i].Path) {
				ws = append(ws, i)
			}
		}
		ofStep[step] = ws
		return ws, nil
	}
	for n, r := range md.Reads {
		if n%1024 == 0 && ctx.Err() != nil {
			return nil, ctx.Err()
		}
		first := -1 // the first withdrawal, in md.Withdrawals order, after the pod's reads
		if r.AllInputs {
			var ws []int
			if step, ok := stepOf[r.Pod]; ok { // else not a pod of the workflow's
				var err error
				if ws, err = withdrawalsOf(step); err != nil {
					return nil, err
				}
			}
			for _, i := range ws {
				if md.Withdrawals[i].Revision > r.Revision {
					first = i
					break
				}
			}
		} else {
			for _, in := range r.Inputs {
				if i, ok := byPath[in]; ok && md.Withdrawals[i].Revision > r.Revision && (first < 0 || i < first) {
					first = i
				}
			}
		}
		if first >= 0 {
			w := md.Withdrawals[first]
			out[r.Pod] = taint{late: true, reason: fmt.Sprintf("it read %s, withdrawn after it ended (%s)", pathpattern.Printable(w.Path), w.Reason)}
		} else if len(r.Withdrawn) > 0 {
			w := r.Withdrawn[0]
			out[r.Pod] = taint{reason: fmt.Sprintf("it read %s, withdrawn while it ran (%s)", pathpattern.Printable(w.Path), w.Reason)}
		}
	}
	return out, nil
}

// applyTaints makes the Succeeded attempts in inst that taints names count for what they
// are: a pod of the controller's whose sidecar withdrew its outputs (taint not late)
// becomes a failed attempt in the observed copy, retried within the step's backoffLimit;
// any other — it ended before the withdrawal, or another tool made it — fails the
// workflow, and applyTaints returns why ("" if none does).
func applyTaints(wf *v1alpha1.Workflow, inst map[instanceKey][]attempt, taints map[string]taint) string {
	if len(taints) == 0 {
		return ""
	}
	failure := ""
	for _, s := range wf.Spec.Steps {
		for i := 0; i < int(ptr.Deref(s.Replicas, 1)); i++ {
			k := instanceKey{s.Name, i}
			for _, a := range inst[k] {
				t, ok := taints[a.pod.Name]
				if !ok || a.pod.Status.Phase != corev1.PodSucceeded {
					continue
				}
				if !t.late && metav1.IsControlledBy(a.pod, wf) {
					a.pod.Status.Phase, a.pod.Status.Reason, a.pod.Status.Message = corev1.PodFailed, ReasonInputWithdrawn, t.reason
					continue
				}
				if failure == "" {
					failure = fmt.Sprintf("step %s instance %d (pod %s) succeeded, but %s: its result may rest on bytes that no longer exist", k.step, k.instance, a.pod.Name, t.reason)
				}
			}
		}
	}
	return failure
}
