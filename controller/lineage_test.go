package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

const lineageYAML = `
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: NAME}
spec:
  steps:
  - name: p
    placement: None
    backoffLimit: 1
    template: {spec: {containers: [{name: main, image: busybox}]}}
    outputs: [{path: "v/*", commit: {rule: OnClose}}]
  - name: c
    placement: None
    backoffLimit: 1
    template: {spec: {containers: [{name: main, image: busybox}]}}
    inputs: ["v/*"]
`

// Which pods read a file in a version withdrawn since, from the reads and withdrawals the
// sidecars recorded, by KV revision: table-driven, no API server.
func TestTaintedPods(t *testing.T) {
	wf := workflowFrom(t, "ns", strings.Replace(lineageYAML, "NAME", "w", 1))
	rules, errs, _ := semantics.Compile(context.Background(), &wf.Spec)
	if len(errs) > 0 {
		t.Fatal(errs.ToAggregate())
	}
	stepOf := map[string]string{"c0": "c", "p0": "p"}
	w := func(p string, rev uint64) wfmeta.Withdrawal {
		return wfmeta.Withdrawal{Path: p, Reason: "its attempt failed", Revision: rev}
	}
	for _, tc := range []struct {
		name string
		md   wfmeta.Meta
		want map[string]taint
	}{
		{name: "withdrawn after the pod read it and ended",
			md:   wfmeta.Meta{Reads: []wfmeta.Reads{{Pod: "c0", Inputs: []string{"v/a"}, Revision: 5}}, Withdrawals: []wfmeta.Withdrawal{w("v/a", 9)}},
			want: map[string]taint{"c0": {late: true, reason: `it read v/a, withdrawn after it ended (its attempt failed)`}}},
		{name: "withdrawn before the pod read the retry's version",
			md: wfmeta.Meta{Reads: []wfmeta.Reads{{Pod: "c0", Inputs: []string{"v/a"}, Revision: 9}}, Withdrawals: []wfmeta.Withdrawal{w("v/a", 5)}}},
		{name: "another file withdrawn",
			md: wfmeta.Meta{Reads: []wfmeta.Reads{{Pod: "c0", Inputs: []string{"v/a"}, Revision: 5}}, Withdrawals: []wfmeta.Withdrawal{w("v/b", 9)}}},
		{name: "too many reads recorded: any input of its step counts",
			md:   wfmeta.Meta{Reads: []wfmeta.Reads{{Pod: "c0", AllInputs: true, Revision: 5}}, Withdrawals: []wfmeta.Withdrawal{w("v/b", 9)}},
			want: map[string]taint{"c0": {late: true, reason: `it read v/b, withdrawn after it ended (its attempt failed)`}}},
		{name: "too many reads recorded, but not an input of its step",
			md: wfmeta.Meta{Reads: []wfmeta.Reads{{Pod: "p0", AllInputs: true, Revision: 5}}, Withdrawals: []wfmeta.Withdrawal{w("v/b", 9)}}},
		{name: "withdrawn while it ran",
			md:   wfmeta.Meta{Reads: []wfmeta.Reads{{Pod: "c0", Inputs: []string{"v/a"}, Withdrawn: []wfmeta.WithdrawnInput{{Path: "v/a", Reason: "gone"}}, Revision: 9}}, Withdrawals: []wfmeta.Withdrawal{w("v/a", 5)}},
			want: map[string]taint{"c0": {reason: `it read v/a, withdrawn while it ran (gone)`}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := taintedPods(context.Background(), rules, tc.md, stepOf)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("tainted %+v, want %+v", got, tc.want)
			}
			for pod, want := range tc.want {
				if got[pod] != want {
					t.Errorf("pod %s: %+v, want %+v", pod, got[pod], want)
				}
			}
		})
	}

	// A tainted pod of the controller's whose outputs its sidecar withdrew is a failed
	// attempt (retried); one tainted after it ended, or another tool's, fails the workflow.
	owned := func(name string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, OwnerReferences: []metav1.OwnerReference{
			{APIVersion: "sluice.io/v1alpha1", Kind: "Workflow", Name: wf.Name, UID: wf.UID, Controller: ptr.To(true)}}},
			Status: corev1.PodStatus{Phase: corev1.PodSucceeded}}
	}
	inst := map[instanceKey][]attempt{{"c", 0}: {{pod: owned("c0")}}}
	if why := applyTaints(wf, inst, map[string]taint{"c0": {reason: "it read v/a, withdrawn while it ran (gone)"}}); why != "" {
		t.Errorf("a retriable tainted attempt failed the workflow: %s", why)
	}
	if p := inst[instanceKey{"c", 0}][0].pod; p.Status.Phase != corev1.PodFailed || p.Status.Reason != ReasonInputWithdrawn {
		t.Errorf("tainted attempt's observed status %+v, want Failed (%s)", p.Status, ReasonInputWithdrawn)
	}
	inst = map[instanceKey][]attempt{{"c", 0}: {{pod: owned("c0")}}}
	why := applyTaints(wf, inst, map[string]taint{"c0": {late: true, reason: "it read v/a, withdrawn after it ended (gone)"}})
	if !strings.Contains(why, "step c instance 0 (pod c0) succeeded, but it read v/a, withdrawn after it ended (gone)") {
		t.Errorf("late taint: %q", why)
	}
	labelled := owned("c0")
	labelled.OwnerReferences = nil
	inst = map[instanceKey][]attempt{{"c", 0}: {{pod: labelled}}}
	if why := applyTaints(wf, inst, map[string]taint{"c0": {reason: "it read v/a, withdrawn while it ran (gone)"}}); why == "" {
		t.Error("a tainted pod the controller cannot retry did not fail the workflow")
	}
}

// On a cluster, as with sluice run, no result built from withdrawn bytes is a success: a
// consumer pod whose sidecar saw its input withdrawn while it ran is retried; one that had
// ended before the withdrawal fails the Workflow naming the pod and the input.
func TestWithdrawnInputsTaintResults(t *testing.T) {
	e := startEnv(t)
	ctx := context.Background()
	ns := e.namespace(t, "lineage")
	for _, name := range []string{"live", "late"} {
		if err := e.k8s.Create(ctx, workflowFrom(t, ns, strings.Replace(lineageYAML, "NAME", name, 1))); err != nil {
			t.Fatal(err)
		}
	}
	put := func(wf, key string, v any) uint64 {
		t.Helper()
		got, err := e.workflow(ns, wf)
		if err != nil {
			t.Fatal(err)
		}
		kv, err := e.js.KeyValue(ctx, wfmeta.NamesForWorkflow(ns, wf, string(got.UID)).Bucket)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(v)
		rev, err := kv.Put(ctx, key, b)
		if err != nil {
			t.Fatal(err)
		}
		return rev
	}
	for _, name := range []string{"live", "late"} {
		e.recordCommit(t, ns, name, "v/a", "") // provisioned
	}

	// live: the consumer's sidecar saw v/a withdrawn while its app ran.
	c := e.waitPod(t, ns, "live-c-0")
	put("live", wfmeta.ReadsKey(string(c.UID)), wfmeta.Reads{Pod: c.Name, Inputs: []string{"v/a"},
		Withdrawn: []wfmeta.WithdrawnInput{{Path: "v/a", Reason: "the attempt of step p instance 0 failed"}}})
	e.finish(t, c, corev1.PodSucceeded, 0)
	retry := e.waitPod(t, ns, "live-c-0-r1")
	if retry.Labels[v1alpha1.LabelStep] != "c" {
		t.Errorf("retry pod labels %v", retry.Labels)
	}

	// late: the consumer read v/a and ended; then the producer's attempt failed.
	c = e.waitPod(t, ns, "late-c-0")
	put("late", wfmeta.ReadsKey(string(c.UID)), wfmeta.Reads{Pod: c.Name, Inputs: []string{"v/a"}})
	e.finish(t, c, corev1.PodSucceeded, 0)
	// (the failed producer's sidecar records the withdrawal as it drains, before its pod
	// shows Failed: the record alone decides)
	put("late", wfmeta.WithdrawalKey("v/a"), wfmeta.Withdrawal{Path: "v/a", Reason: "the attempt of step p instance 0 failed", At: time.Now()})
	eventually(t, 20*time.Second, "late Failed as TaintedResult", func() error {
		wf, err := e.workflow(ns, "late")
		if err != nil {
			return err
		}
		cond := meta.FindStatusCondition(wf.Status.Conditions, v1alpha1.ConditionFailed)
		if wf.Status.Phase != v1alpha1.WorkflowFailed || cond == nil || cond.Reason != ReasonTaintedResult ||
			!strings.Contains(cond.Message, "pod late-c-0") || !strings.Contains(cond.Message, "it read v/a, withdrawn after it ended") {
			return fmt.Errorf("phase %s, Failed condition %+v", wf.Status.Phase, cond)
		}
		return nil
	})
	if ev := e.events(ns, ReasonTaintedResult); len(ev) != 1 {
		t.Errorf("TaintedResult events %q", ev)
	}
}

// The reads and withdrawals are the tenant's to write (its sidecars' KV credentials): a
// step of a thousand inputs and thousands of recorded withdrawals must not hold one of
// the controller's workers. The step's inputs are matched once per step, not once per
// read; beyond taintCheckBudget matches the check refuses (the workflow fails rather
// than report a result it could not check), and it ends when its reconcile's context
// does.
func TestTaintCheckIsBoundedWhateverTheSidecarsRecord(t *testing.T) {
	const inputs = 1024
	var in strings.Builder
	for i := 0; i < inputs; i++ {
		fmt.Fprintf(&in, "\"v/in%d\", ", i)
	}
	wf := workflowFrom(t, "ns", strings.Replace(strings.Replace(lineageYAML, "NAME", "w", 1), `inputs: ["v/*"]`, "inputs: ["+in.String()+"]", 1))
	rules, errs, _ := semantics.Compile(context.Background(), &wf.Spec)
	if len(errs) > 0 {
		t.Fatal(errs.ToAggregate())
	}
	meta := func(withdrawals int) wfmeta.Meta {
		var md wfmeta.Meta
		for i := 0; i < 1000; i++ {
			md.Reads = append(md.Reads, wfmeta.Reads{Pod: "c0", AllInputs: true, Revision: 5})
		}
		for i := 0; i < withdrawals-1; i++ {
			md.Withdrawals = append(md.Withdrawals, wfmeta.Withdrawal{Path: fmt.Sprintf("v/other%d", i), Reason: "planted", Revision: 9})
		}
		md.Withdrawals = append(md.Withdrawals, wfmeta.Withdrawal{Path: fmt.Sprintf("v/in%d", inputs-1), Reason: "its attempt failed", Revision: 9})
		return md
	}
	stepOf := map[string]string{"c0": "c"}

	// Within the budget: a thousand reads of all inputs, checked against each withdrawal
	// once; the one withdrawal of an input taints the pod.
	within := taintCheckBudget / inputs
	got, err := taintedPods(context.Background(), rules, meta(within), stepOf)
	if err != nil {
		t.Fatalf("%d withdrawals of %d inputs: %v", within, inputs, err)
	}
	if want := fmt.Sprintf("it read v/in%d, withdrawn after it ended (its attempt failed)", inputs-1); got["c0"].reason != want {
		t.Errorf("c0: %+v, want %q", got["c0"], want)
	}

	// Beyond it: refused, naming the step and the counts.
	if _, err := taintedPods(context.Background(), rules, meta(within+1), stepOf); !errors.Is(err, errTaintCheckTooCostly) ||
		!strings.Contains(err.Error(), fmt.Sprintf("step c: %d withdrawals since its reads, of %d input patterns", within+1, inputs)) {
		t.Errorf("%d withdrawals of %d inputs: %v, want %v naming them", within+1, inputs, err, errTaintCheckTooCostly)
	}

	// Withdrawals recorded before the step's reads (a producer's failed attempt of many
	// files, retried before the step ran) cannot taint it and cost nothing: a healthy
	// workflow is not failed for them.
	before := meta(within)
	for i := range before.Withdrawals {
		before.Withdrawals[i].Revision = 4
	}
	for i := 0; i < 100*within; i++ {
		before.Withdrawals = append(before.Withdrawals, wfmeta.Withdrawal{Path: fmt.Sprintf("v/early%d", i), Reason: "retried", Revision: 3})
	}
	if got, err := taintedPods(context.Background(), rules, before, stepOf); err != nil || len(got) != 0 {
		t.Errorf("%d withdrawals before the reads: %v, %v; want no taint and no refusal", len(before.Withdrawals), got, err)
	}

	// A reconcile whose time is up stops checking.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := taintedPods(ctx, rules, meta(within), stepOf); !errors.Is(err, context.Canceled) {
		t.Errorf("with its context done: %v, want %v", err, context.Canceled)
	}
}
