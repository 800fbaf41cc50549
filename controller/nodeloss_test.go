package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/controller/placement"
	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

// A producer p writes v/* (fetched from its node) and s/* (`replicate: Stream`); c reads
// v/*, d reads s/*. Every step may be retried once.
const nodeLossYAML = `
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: NAME}
spec:
  steps:
  - name: p
    placement: None
    backoffLimit: 1
    template: {spec: {containers: [{name: main, image: busybox}]}}
    outputs:
    - {path: "v/*", commit: {rule: OnClose}}
    - {path: "s/*", commit: {rule: OnClose}, replicate: Stream}
  - name: c
    placement: None
    backoffLimit: 1
    template: {spec: {containers: [{name: main, image: busybox}]}}
    inputs: ["v/*"]
  - name: d
    placement: None
    backoffLimit: 1
    template: {spec: {containers: [{name: main, image: busybox}]}}
    inputs: ["s/*"]
`

func nodeWithReady(status corev1.ConditionStatus, since time.Time) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "b"}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
		{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse},
		{Type: corev1.NodeReady, Status: status, Reason: "NodeStatusUnknown", LastTransitionTime: metav1.NewTime(since)},
	}}}
}

// A node is lost once its Ready condition has been False or Unknown for the grace; until
// then the controller knows when to look again.
func TestLossOf(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	grace := 40 * time.Second
	if why, after := lossOf(nodeWithReady(corev1.ConditionTrue, now.Add(-time.Hour)), grace, now); why != "" || after != 0 {
		t.Errorf("Ready node: %q, %s", why, after)
	}
	if why, after := lossOf(nodeWithReady(corev1.ConditionUnknown, now.Add(-10*time.Second)), grace, now); why != "" || after != 30*time.Second {
		t.Errorf("Unknown for 10s: %q, look again after %s, want 30s", why, after)
	}
	why, after := lossOf(nodeWithReady(corev1.ConditionFalse, now.Add(-time.Minute)), grace, now)
	if after != 0 || !strings.Contains(why, "Ready condition has been False since 2026-01-02T03:03:05Z") || !strings.Contains(why, "grace of 40s") {
		t.Errorf("False for a minute: %q, %s", why, after)
	}
	if why, after := lossOf(&corev1.Node{}, grace, now); why != "" || after != 0 {
		t.Errorf("no conditions: %q, %s", why, after)
	}
}

// Which files go with a lost node (held only there, neither replicated nor stored), which
// attempts fail with it, and which instance then cannot get its input: no API server.
func TestLostFilesAndAttempts(t *testing.T) {
	wf := workflowFrom(t, "ns", strings.Replace(nodeLossYAML, "NAME", "w", 1))
	wf.UID = "wf-uid"
	rules, errs, _ := semantics.Compile(context.Background(), &wf.Spec)
	if len(errs) > 0 {
		t.Fatal(errs.ToAggregate())
	}
	lost := map[string]string{"b": "its Ready condition has been Unknown"}
	nodeOf := map[string]string{"p-0": "b"}
	files := []wfmeta.FileMeta{
		{Path: "v/only-b", Holders: []string{"b"}},
		{Path: "v/also-a", Holders: []string{"a", "b"}},
		{Path: "v/stored", Holders: []string{"b"}, URI: "s3://bucket/v/stored"},
		{Path: "s/streamed", Holders: []string{"b"}},
		{Path: "v/home-only", Home: "p-0"}, // a record naming no holder: its home's node
		{Path: "v/on-a", Holders: []string{"a"}},
	}
	got := lostFiles(rules, files, lost, nodeOf)
	var paths []string
	for _, f := range got {
		paths = append(paths, f.Path)
		if f.Node != "b" || f.Reason != lost["b"] {
			t.Errorf("lost %+v, want node b and its reason", f)
		}
	}
	if want := []string{"v/home-only", "v/only-b"}; !slices.Equal(paths, want) {
		t.Errorf("lost files %q, want %q", paths, want)
	}
	if got := lostFiles(rules, files, nil, nodeOf); got != nil {
		t.Errorf("no node lost, yet files lost: %+v", got)
	}

	owned := func(name, node string, phase corev1.PodPhase) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, OwnerReferences: []metav1.OwnerReference{
			{APIVersion: "sluice.io/v1alpha1", Kind: "Workflow", Name: wf.Name, UID: wf.UID, Controller: ptr.To(true)}}},
			Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{Phase: phase}}
	}
	jobs := owned("p-job", "b", corev1.PodRunning)
	jobs.OwnerReferences = nil
	inst := map[instanceKey][]attempt{
		{"p", 0}: {{pod: owned("p0", "b", corev1.PodRunning)}},
		{"c", 0}: {{pod: owned("c0", "a", corev1.PodRunning)}},
		{"d", 0}: {{pod: owned("d0", "b", corev1.PodSucceeded)}},
	}
	at := failLostAttempts(wf, inst, lost)
	if len(at) != 1 || at[0].pod.Name != "p0" || at[0].node != "b" || at[0].key != (instanceKey{"p", 0}) {
		t.Fatalf("lost attempts %+v, want p0 on b", at)
	}
	if p := inst[instanceKey{"p", 0}][0].pod; p.Status.Phase != corev1.PodFailed || p.Status.Reason != ReasonNodeLost ||
		p.Status.Message != "node b was lost: its Ready condition has been Unknown" {
		t.Errorf("lost attempt's observed status %+v", p.Status)
	}
	if p := inst[instanceKey{"c", 0}][0].pod; p.Status.Phase != corev1.PodRunning {
		t.Errorf("an attempt on a node not lost: %+v", p.Status)
	}
	if got := failLostAttempts(wf, map[instanceKey][]attempt{{"p", 0}: {{pod: jobs}}}, lost); got != nil {
		t.Errorf("another tool's pod counted as the controller's lost attempt: %+v", got)
	}

	// c runs on a: it may hold v/only-b already, and its read would say so if not.
	if why := inputLoss(wf, rules, inst, got); why != "" {
		t.Errorf("a running consumer failed the workflow: %s", why)
	}
	for name, at := range map[string][]attempt{
		"no pod yet": nil,
		"pending":    {{pod: owned("c0", "", corev1.PodPending)}},
		"failed":     {{pod: owned("c0", "a", corev1.PodFailed)}},
	} {
		inst[instanceKey{"c", 0}] = at
		why := inputLoss(wf, rules, inst, got)
		if !strings.Contains(why, "step c instance 0 needs v/home-only, whose bytes were lost with node b") {
			t.Errorf("%s: %q", name, why)
		}
	}
	inst[instanceKey{"c", 0}] = []attempt{{pod: owned("c0", "a", corev1.PodFailed)}, {pod: owned("c0-r1", "a", corev1.PodSucceeded)}}
	if why := inputLoss(wf, rules, inst, got); why != "" {
		t.Errorf("a consumer that succeeded failed the workflow: %s", why)
	}
	// A file recorded lost earlier stays lost (the node may be back, or its Node gone).
	merged := mergeLost([]wfmeta.LostFile{{Path: "v/z", Node: "old"}, {Path: "v/only-b", Node: "old"}}, got)
	if len(merged) != 3 || merged[0].Path != "v/home-only" || merged[1].Path != "v/only-b" || merged[1].Node != "old" || merged[2].Path != "v/z" {
		t.Errorf("merged %+v: want the recorded ones kept as recorded, the new ones added, by path", merged)
	}
	// d reads only s/*, which the stream keeps.
	inst = map[instanceKey][]attempt{{"c", 0}: {{pod: owned("c0", "a", corev1.PodSucceeded)}}}
	if why := inputLoss(wf, rules, inst, got); why != "" {
		t.Errorf("a consumer of replicated files failed the workflow: %s", why)
	}
}

// readyNode creates node name, Ready, and returns a function that sets its Ready
// condition, as the node lifecycle controller would.
func (e *env) readyNode(t *testing.T, name string) func(corev1.ConditionStatus, time.Time) {
	t.Helper()
	ctx := context.Background()
	if err := e.k8s.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{placement.HostnameKey: name}}}); err != nil {
		t.Fatalf("creating node %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = e.k8s.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
	})
	set := func(s corev1.ConditionStatus, since time.Time) {
		t.Helper()
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			var n corev1.Node
			if err := e.k8s.Get(ctx, types.NamespacedName{Name: name}, &n); err != nil {
				return err
			}
			n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: s, Reason: "Test",
				LastTransitionTime: metav1.NewTime(since), LastHeartbeatTime: metav1.NewTime(since)}}
			return e.k8s.Status().Update(ctx, &n)
		})
		if err != nil {
			t.Fatalf("setting node %s Ready %s: %v", name, s, err)
		}
	}
	set(corev1.ConditionTrue, time.Now())
	return set
}

// running sets a pod Running, as its kubelet would.
func (e *env) running(t *testing.T, p *corev1.Pod) {
	t.Helper()
	e.setPodStatus(t, p, "setting Running", func(st *corev1.PodStatus) { st.Phase = corev1.PodRunning })
}

// A node whose Ready condition stays Unknown past the grace is lost: the attempt running
// there fails with it (NodeLost), a retry is created that cannot go back there, and the
// lost pod is force-deleted, since its kubelet will never confirm.
func TestLostNodeRetriesItsAttemptElsewhere(t *testing.T) {
	const grace = 3 * time.Second
	e := startEnv(t, func(r *WorkflowReconciler) { r.NodeLostGrace = grace })
	ns, p, setB := e.producerOnNode(t, "nodeloss-retry")
	e.running(t, p)

	lostAt := time.Now().Truncate(time.Second) // as the API stores it
	setB(corev1.ConditionUnknown, lostAt)
	retried := e.waitPod(t, ns, "w-p-0-r1")
	if waited := time.Since(lostAt); waited < grace {
		t.Errorf("retried %s after the node went Unknown, within the grace of %s", waited, grace)
	}
	na := retried.Spec.Affinity.NodeAffinity
	if na == nil || na.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		t.Fatalf("retry's affinity %+v: nothing keeps it off the lost node", retried.Spec.Affinity)
	}
	for _, term := range na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		if !slices.ContainsFunc(term.MatchExpressions, func(r corev1.NodeSelectorRequirement) bool {
			return r.Key == placement.HostnameKey && r.Operator == corev1.NodeSelectorOpNotIn && slices.Contains(r.Values, "nodeloss-retry-b")
		}) {
			t.Errorf("required term %+v lets the retry onto the lost node", term)
		}
	}
	for _, pref := range na.PreferredDuringSchedulingIgnoredDuringExecution {
		if slices.ContainsFunc(pref.Preference.MatchExpressions, func(r corev1.NodeSelectorRequirement) bool { return slices.Contains(r.Values, "nodeloss-retry-b") }) {
			t.Errorf("the retry prefers the lost node: %+v", pref)
		}
	}
	eventually(t, 20*time.Second, "the lost pod removed", func() error {
		if _, err := e.pod(t, ns, "w-p-0"); !apierrors.IsNotFound(err) {
			return fmt.Errorf("pod w-p-0 still there (%w)", err)
		}
		return nil
	})
	eventually(t, 20*time.Second, "a NodeLost Event", func() error {
		ev := e.events(ns, ReasonNodeLost)
		if len(ev) != 1 || !strings.Contains(ev[0], "step p instance 0 (pod w-p-0) failed: node nodeloss-retry-b was lost") ||
			!strings.Contains(ev[0], "retried as pod w-p-0-r1") {
			return fmt.Errorf("NodeLost events %q", ev)
		}
		return nil
	})
	wf, err := e.workflow(ns, "w")
	if err != nil {
		t.Fatal(err)
	}
	if wf.Status.Phase == v1alpha1.WorkflowFailed {
		t.Errorf("a lost attempt with a retry left failed the workflow: %+v", wf.Status.Conditions)
	}
}

// A file held only on a lost node is reported lost (its KV record, a FilesLost Event),
// and the consumer that has yet to read it fails the Workflow naming the node and the
// file (InputLost); the `replicate: Stream` file written there is not lost.
func TestLostNodeLosesItsFiles(t *testing.T) {
	e := startEnv(t)
	ctx := context.Background()
	ns, p, setB := e.producerOnNode(t, "nodeloss-files")
	for _, f := range []string{"v/a", "s/x"} {
		e.putFile(t, ns, "w", wfmeta.FileMeta{Path: f, Size: 1, Home: "p-0", Holders: []string{"nodeloss-files-b"}})
	}
	e.finish(t, p, corev1.PodSucceeded, 0)
	e.waitPod(t, ns, "w-c-0") // Pending: it has yet to read v/a

	setB(corev1.ConditionUnknown, time.Now().Add(-time.Hour))
	eventually(t, 20*time.Second, "w Failed as InputLost", func() error {
		wf, err := e.workflow(ns, "w")
		if err != nil {
			return err
		}
		cond := meta.FindStatusCondition(wf.Status.Conditions, v1alpha1.ConditionFailed)
		if wf.Status.Phase != v1alpha1.WorkflowFailed || cond == nil || cond.Reason != ReasonInputLost ||
			!strings.Contains(cond.Message, "step c instance 0 needs v/a, whose bytes were lost with node nodeloss-files-b") {
			return fmt.Errorf("phase %s, Failed condition %+v", wf.Status.Phase, cond)
		}
		return nil
	})
	ev := e.events(ns, ReasonFilesLost)
	if len(ev) != 1 || !strings.Contains(ev[0], "node nodeloss-files-b was lost with 1 file(s) held only there") || !strings.Contains(ev[0], "v/a") {
		t.Errorf("FilesLost events %q", ev)
	}
	wf, err := e.workflow(ns, "w")
	if err != nil {
		t.Fatal(err)
	}
	kv, err := e.js.KeyValue(ctx, wfmeta.NamesForWorkflow(ns, "w", string(wf.UID)).Bucket)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := kv.Get(ctx, wfmeta.LostKey("v/a"))
	if err != nil {
		t.Fatalf("no record of v/a lost: %v", err)
	}
	var l wfmeta.LostFile
	if err := json.Unmarshal(rec.Value(), &l); err != nil || l.Node != "nodeloss-files-b" || l.Path != "v/a" {
		t.Errorf("record %s (%v)", rec.Value(), err)
	}
	if _, err := kv.Get(ctx, wfmeta.LostKey("s/x")); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("the replicated s/x recorded lost (%v)", err)
	}
}

// producerOnNode creates namespace name, a Ready node name+"-b", and Workflow w of
// nodeLossYAML there, binds w's producer pod to the node and returns them, with the
// node's Ready setter.
func (e *env) producerOnNode(t *testing.T, name string) (string, *corev1.Pod, func(corev1.ConditionStatus, time.Time)) {
	t.Helper()
	ns := e.namespace(t, name)
	setReady := e.readyNode(t, name+"-b")
	if err := e.k8s.Create(context.Background(), workflowFrom(t, ns, strings.Replace(nodeLossYAML, "NAME", "w", 1))); err != nil {
		t.Fatal(err)
	}
	p := e.waitPod(t, ns, "w-p-0")
	e.bind(t, p, name+"-b")
	return ns, p, setReady
}

// putFile records a committed file in workflow name's KV bucket, as its home node would.
func (e *env) putFile(t *testing.T, ns, name string, f wfmeta.FileMeta) {
	t.Helper()
	ctx := context.Background()
	wf, err := e.workflow(ns, name)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := e.js.KeyValue(ctx, wfmeta.NamesForWorkflow(ns, name, string(wf.UID)).Bucket)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(f)
	if _, err := kv.Put(ctx, wfmeta.FileKey(f.Path), b); err != nil {
		t.Fatal(err)
	}
}
