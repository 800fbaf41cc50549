package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

// Which declared outputs a Workflow whose steps all exited 0 did not deliver, from the
// commits its sidecars recorded: table-driven, no API server.
func TestUnmetOutputs(t *testing.T) {
	wf := workflowFrom(t, "ns", `
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: w}
spec:
  permanent: [result.txt, plots]
  steps:
  - name: p
    outputs:
    - {path: data.bin, commit: {rule: OnClose}}
    - {path: "parts/*", commit: {rule: OnClose}}
    - {path: plots, type: Directory, commit: {rule: OnTermination}}
  - name: c
    inputs: [data.bin]
    outputs: [{path: result.txt, commit: {rule: OnTermination}}]
`)
	rules, errs, _ := semantics.Compile(context.Background(), &wf.Spec)
	if len(errs) > 0 {
		t.Fatal(errs.ToAggregate())
	}
	all := []wfmeta.FileMeta{
		{Path: "data.bin", Size: 10},
		{Path: "result.txt", Size: 3, URI: "s3://b/result.txt"},
		{Path: "plots/a.png", Size: 5, URI: "s3://b/plots/a.png"},
	}
	without := func(p string) []wfmeta.FileMeta {
		return slices.DeleteFunc(slices.Clone(all), func(f wfmeta.FileMeta) bool { return f.Path == p })
	}
	notStored := slices.Clone(all)
	notStored[1].URI = ""
	for _, tc := range []struct {
		name  string
		files []wfmeta.FileMeta
		want  []string // "path: reason fragment"
	}{
		{name: "everything delivered (a glob matching nothing is fine)", files: all},
		{name: "a literal output never committed", files: without("data.bin"),
			want: []string{`data.bin: never committed by its rule "data.bin" (OnClose:1, Update)`}},
		{name: "a permanent output committed but not stored", files: notStored,
			want: []string{"result.txt: declared permanent, but nothing was stored"}},
		{name: "a permanent output never committed names it once", files: without("result.txt"),
			want: []string{"result.txt: never committed"}},
		{name: "a permanent directory with nothing stored under it", files: without("plots/a.png"),
			want: []string{"plots: declared permanent, but nothing was stored"}},
		{name: "nothing recorded at all", files: nil,
			want: []string{"data.bin: never committed", "plots: declared permanent", "result.txt: never committed"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := unmetOutputs(rules, tc.files)
			if len(got) != len(tc.want) {
				t.Fatalf("unmet %v, want %d: %q", got, len(tc.want), tc.want)
			}
			for i, u := range got {
				if s := u.Path + ": " + u.Reason; !strings.HasPrefix(s, tc.want[i]) {
					t.Errorf("unmet[%d] %q, want it to start with %q", i, s, tc.want[i])
				}
			}
		})
	}
}

// A Workflow is deadlocked when every unfinished instance runs and waits on the rules,
// and nothing moves for the grace: each part of that, table-driven.
func TestDeadlockWatch(t *testing.T) {
	wf := workflowFrom(t, "ns", `
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: w}
spec:
  steps:
  - name: a
    inputs: [y]
    outputs: [{path: x, commit: {rule: OnClose}}]
  - name: b
    inputs: [x]
    outputs: [{path: y, commit: {rule: OnClose}}]
`)
	pod := func(name, step string, ph corev1.PodPhase) attempt {
		return attempt{pod: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name,
			Labels: map[string]string{v1alpha1.LabelStep: step, v1alpha1.LabelInstance: "0"}}, Status: corev1.PodStatus{Phase: ph}}}
	}
	waiting := func(pod, what string) wfmeta.PodStats {
		return wfmeta.PodStats{Pod: pod, Waits: []wfmeta.WaitStat{{What: what}}}
	}
	both := map[instanceKey][]attempt{{"a", 0}: {pod("a", "a", corev1.PodRunning)}, {"b", 0}: {pod("b", "b", corev1.PodRunning)}}
	stats := []wfmeta.PodStats{waiting("a", `open of "y"`), waiting("b", `open of "x"`)}
	for _, tc := range []struct {
		name  string
		inst  map[instanceKey][]attempt
		stats []wfmeta.PodStats
		want  []string
	}{
		{name: "both wait on each other", inst: both, stats: stats, want: []string{`a[0]: open of "y"`, `b[0]: open of "x"`}},
		{name: "one is not waiting", inst: both, stats: stats[:1]},
		{name: "one has no pod yet", inst: map[instanceKey][]attempt{{"a", 0}: both[instanceKey{"a", 0}]}, stats: stats},
		{name: "one is still pending", inst: map[instanceKey][]attempt{{"a", 0}: both[instanceKey{"a", 0}], {"b", 0}: {pod("b", "b", corev1.PodPending)}}, stats: stats},
		{name: "a finished instance does not count", inst: map[instanceKey][]attempt{{"a", 0}: both[instanceKey{"a", 0}], {"b", 0}: {pod("b", "b", corev1.PodSucceeded)}},
			stats: stats, want: []string{`a[0]: open of "y"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := allWaiting(wf, observed{instances: tc.inst, stats: tc.stats})
			if ok != (tc.want != nil) || !slices.Equal(got, tc.want) {
				t.Errorf("allWaiting = %q, %v; want %q", got, ok, tc.want)
			}
		})
	}

	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	w := stallWatch{grace: time.Minute}
	uid := types.UID("wf")
	obs := observed{instances: both, stats: stats}
	mark := progressMark(obs, nil)
	if got, after := w.check(uid, []string{"w"}, true, mark, t0); got != nil || after != time.Minute {
		t.Fatalf("first stalled look: %q, again after %v; want nothing yet, after 1m", got, after)
	}
	if got, after := w.check(uid, []string{"w"}, true, mark, t0.Add(59*time.Second)); got != nil || after != time.Second {
		t.Fatalf("59 s later: %q, again after %v", got, after)
	}
	// Progress (a sidecar's counters moved) starts the grace again.
	moved := slices.Clone(stats)
	moved[0].MemoryBytes = 4096
	if progressMark(observed{instances: both, stats: moved}, nil) == mark || progressMark(obs, []wfmeta.FileMeta{{Path: "x", Size: 1}}) == mark {
		t.Fatal("the progress mark ignores a sidecar's counters or a commit")
	}
	if got, _ := w.check(uid, []string{"w"}, true, "moved", t0.Add(61*time.Second)); got != nil {
		t.Fatalf("deadlock reported right after progress: %q", got)
	}
	if got, _ := w.check(uid, []string{"w"}, true, "moved", t0.Add(122*time.Second)); !slices.Equal(got, []string{"w"}) {
		t.Fatalf("no deadlock after a minute without progress: %q", got)
	}
	// Not stalled any more: forgotten.
	if got, after := w.check(uid, nil, false, "moved", t0.Add(200*time.Second)); got != nil || after != 0 {
		t.Fatalf("not stalled: %q, %v", got, after)
	}
}

// recordCommit writes what a sidecar records when path commits (and, with uri, is
// stored) into workflow name's KV bucket.
func (e *env) recordCommit(t *testing.T, ns, name, path, uri string) {
	t.Helper()
	ctx := context.Background()
	var uid string
	eventually(t, 20*time.Second, "workflow "+name+" provisioned", func() error {
		wf, err := e.workflow(ns, name)
		if err != nil || !meta.IsStatusConditionTrue(wf.Status.Conditions, v1alpha1.ConditionReady) {
			return fmt.Errorf("not Ready (%w)", err)
		}
		uid = string(wf.UID)
		return nil
	})
	kv, err := e.js.KeyValue(ctx, wfmeta.NamesForWorkflow(ns, name, uid).Bucket)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(wfmeta.FileMeta{Path: path, Size: 1, Home: "p", URI: uri})
	if _, err := kv.Put(ctx, wfmeta.FileKey(path), b); err != nil {
		t.Fatal(err)
	}
}

// labelledPod creates a pod of step (instance 0) of workflow wf, as a user or another
// tool would, and sets its phase.
func (e *env) labelledPod(t *testing.T, ns, wf, step string, phase corev1.PodPhase) *corev1.Pod {
	t.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: wf + "-" + step, Namespace: ns,
		Labels: map[string]string{v1alpha1.LabelWorkflow: wf, v1alpha1.LabelStep: step, v1alpha1.LabelInstance: "0"}},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "main", Image: "busybox"}}}}
	if err := e.k8s.Create(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	e.finish(t, p, phase, 0)
	return p
}

// A Workflow whose every pod exited 0 but whose declared output was never committed, or
// whose permanent output was never stored, fails naming the path (condition Failed with
// reason OutputsUnmet, and a Warning Event); with both recorded it succeeds.
func TestUndeliveredOutputFailsWorkflow(t *testing.T) {
	e := startEnv(t)
	ctx := context.Background()
	ns := e.namespace(t, "unmet")
	const doc = `
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: NAME}
spec:
  permanent: [r.txt]
  storage: {bucket: results, endpoint: "http://minio.example:9000", secretRef: {name: s3}}
  steps:
  - name: a
    outputs: [{path: x, commit: {rule: OnClose}}, {path: r.txt, commit: {rule: OnTermination}}]
`
	if err := e.k8s.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s3", Namespace: ns},
		Data: map[string][]byte{"accessKey": []byte("AK"), "secretKey": []byte("SK")}}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"missing", "unstored", "whole"} {
		if err := e.k8s.Create(ctx, workflowFrom(t, ns, strings.Replace(doc, "NAME", name, 1))); err != nil {
			t.Fatal(err)
		}
	}
	e.recordCommit(t, ns, "unstored", "x", "")
	e.recordCommit(t, ns, "unstored", "r.txt", "")
	e.recordCommit(t, ns, "whole", "x", "")
	e.recordCommit(t, ns, "whole", "r.txt", "s3://results/r.txt")
	e.recordCommit(t, ns, "missing", "r.txt", "s3://results/r.txt")
	for _, name := range []string{"missing", "unstored", "whole"} {
		e.labelledPod(t, ns, name, "a", corev1.PodSucceeded)
	}
	for name, want := range map[string]string{
		"missing":  `x (output of a): never committed by its rule "x" (OnClose:1, Update)`,
		"unstored": "r.txt (output of a): declared permanent, but nothing was stored",
	} {
		eventually(t, 20*time.Second, name+" Failed naming its output", func() error {
			wf, err := e.workflow(ns, name)
			if err != nil {
				return err
			}
			c := meta.FindStatusCondition(wf.Status.Conditions, v1alpha1.ConditionFailed)
			if wf.Status.Phase != v1alpha1.WorkflowFailed || c == nil || c.Reason != ReasonOutputsUnmet || !strings.Contains(c.Message, want) {
				return fmt.Errorf("phase %s, Failed condition %+v", wf.Status.Phase, c)
			}
			if wf.Status.Progress != "1/1" || meta.IsStatusConditionTrue(wf.Status.Conditions, v1alpha1.ConditionSucceeded) {
				return fmt.Errorf("progress %s, conditions %+v: the step itself succeeded, the workflow did not", wf.Status.Progress, wf.Status.Conditions)
			}
			return nil
		})
	}
	eventually(t, 20*time.Second, "whole Succeeded", func() error {
		wf, err := e.workflow(ns, "whole")
		if err != nil {
			return err
		}
		if wf.Status.Phase != v1alpha1.WorkflowSucceeded {
			return fmt.Errorf("phase %s, conditions %+v", wf.Status.Phase, wf.Status.Conditions)
		}
		return nil
	})
	eventually(t, 20*time.Second, "a Warning Event per unmet output", func() error {
		ev := e.events(ns, ReasonOutputsUnmet)
		if len(ev) != 2 {
			return fmt.Errorf("OutputsUnmet events %q", ev)
		}
		return nil
	})
}

// Two running pods that each wait on the file only the other makes, with nothing moving
// for the deadlock grace, fail their Workflow as Deadlocked, naming both waits — instead
// of waiting until their wait timeout.
func TestDeadlockedWorkflowFails(t *testing.T) {
	e := startEnv(t, func(r *WorkflowReconciler) { r.DeadlockGrace = 2 * time.Second })
	ctx := context.Background()
	ns := e.namespace(t, "deadlock")
	wf := workflowFrom(t, ns, `
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: dl}
spec:
  steps:
  - name: a
    inputs: [y]
    outputs: [{path: x, commit: {rule: OnClose}}]
  - name: b
    inputs: [x]
    outputs: [{path: y, commit: {rule: OnClose}}]
`)
	if err := e.k8s.Create(ctx, wf); err != nil {
		t.Fatal(err)
	}
	a := e.labelledPod(t, ns, "dl", "a", corev1.PodRunning)
	b := e.labelledPod(t, ns, "dl", "b", corev1.PodRunning)
	e.recordCommit(t, ns, "dl", "unrelated", "") // provisioned; the bucket exists
	got, err := e.workflow(ns, "dl")
	if err != nil {
		t.Fatal(err)
	}
	kv, err := e.js.KeyValue(ctx, wfmeta.NamesForWorkflow(ns, "dl", string(got.UID)).Bucket)
	if err != nil {
		t.Fatal(err)
	}
	since := time.Now().UTC().Truncate(time.Second)
	for _, w := range []struct {
		pod  *corev1.Pod
		what string
	}{{a, `open of "y" (OnClose:1, Update)`}, {b, `open of "x" (OnClose:1, Update)`}} {
		st, _ := json.Marshal(wfmeta.PodStats{Pod: w.pod.Name, Host: "n1", Waits: []wfmeta.WaitStat{{What: w.what, Since: since}}})
		if _, err := kv.Put(ctx, wfmeta.StatsKey(string(w.pod.UID)), st); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 30*time.Second, "workflow Failed as Deadlocked", func() error {
		wf, err := e.workflow(ns, "dl")
		if err != nil {
			return err
		}
		c := meta.FindStatusCondition(wf.Status.Conditions, v1alpha1.ConditionFailed)
		if wf.Status.Phase != v1alpha1.WorkflowFailed || c == nil || c.Reason != ReasonDeadlocked ||
			!strings.Contains(c.Message, `a[0]: open of "y"`) || !strings.Contains(c.Message, `b[0]: open of "x"`) {
			return fmt.Errorf("phase %s, Failed condition %+v", wf.Status.Phase, c)
		}
		return nil
	})
	if ev := e.events(ns, ReasonDeadlocked); len(ev) != 1 {
		t.Errorf("Deadlocked events %q", ev)
	}
}
