package controller

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/controller/inject"
)

// oneStepWorkflow is Workflow name of namespace ns with one templated step, which writes
// one file.
func oneStepWorkflow(t *testing.T, ns, name string) *v1alpha1.Workflow {
	t.Helper()
	return workflowFrom(t, ns, `
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: `+name+`}
spec:
  steps:
  - name: a
    template: {spec: {containers: [{name: main, image: busybox, command: ["true"]}]}}
    outputs: [{path: x, commit: {rule: OnClose}}]
`)
}

func TestParseAgentUsers(t *testing.T) {
	for in, want := range map[string]AgentUsers{"": {}, "2100000000-2100065535": {First: 2100000000, Count: 65536}, "7-7": {First: 7, Count: 1}} {
		if got, err := ParseAgentUsers(in); err != nil || got != want {
			t.Errorf("ParseAgentUsers(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{"0-10", "10-9", "5", "a-b", "1-2147483648", "-5-7"} {
		if _, err := ParseAgentUsers(in); err == nil {
			t.Errorf("ParseAgentUsers(%q) took it", in)
		}
	}
}

// sidecarUser is the user ID the sidecar of pod runs as.
func sidecarUser(t *testing.T, pod *corev1.Pod) int64 {
	t.Helper()
	for _, c := range pod.Spec.InitContainers {
		if c.Name == inject.SidecarName && c.SecurityContext != nil {
			if u, g := ptr.Deref(c.SecurityContext.RunAsUser, 0), ptr.Deref(c.SecurityContext.RunAsGroup, 0); u != g {
				t.Errorf("pod %s's sidecar runs as user %d, group %d: want the same", pod.Name, u, g)
			}
			return ptr.Deref(c.SecurityContext.RunAsUser, 0)
		}
	}
	t.Fatalf("pod %s has no sidecar", pod.Name)
	return 0
}

// No two workflows' sidecars (nor their store servers, which run as status.agentUser
// too) share a user, so none shares another's per-user kernel limits (issue 42): the
// controller gives each workflow a user ID of its --agent-users range, before its first
// pod, whether the controller makes the pod or the webhook injects an engine's pod
// created a moment after the Workflow; a workflow finds none while every ID is taken,
// and gets the ID of a deleted one.
func TestWorkflowsRunAsUsersOfTheirOwn(t *testing.T) {
	const first = 2100000000
	e := startEnv(t, func(r *WorkflowReconciler) { r.AgentUsers = AgentUsers{First: first, Count: 2} })
	ctx := context.Background()
	ns := e.namespace(t, "agent-users")
	templated := oneStepWorkflow(t, ns, "templated")
	if err := e.k8s.Create(ctx, templated); err != nil {
		t.Fatal(err)
	}
	if err := e.k8s.Create(ctx, workflowFrom(t, ns, joinable)); err != nil {
		t.Fatal(err)
	}
	// At once: the reconciler may not have seen the Workflow yet.
	p := labelledPod("writer", map[string]string{v1alpha1.AnnotationWorkflow: "jobs", v1alpha1.AnnotationStep: "writer"})
	p.Namespace = ns
	if err := e.k8s.Create(ctx, p); err != nil {
		t.Fatalf("creating a labelled pod: %v", err)
	}
	engines, _ := e.pod(t, ns, "writer")
	ours := e.waitPod(t, ns, "templated-a-0")
	users := map[string]int64{}
	for name, pod := range map[string]*corev1.Pod{"jobs": engines, "templated": ours} {
		wf, err := e.workflow(ns, name)
		if err != nil {
			t.Fatal(err)
		}
		u := ptr.Deref(wf.Status.AgentUser, 0)
		if u < first || u >= first+2 {
			t.Errorf("workflow %s: status.agentUser %d, want one of %d..%d", name, u, first, first+1)
		}
		if got := sidecarUser(t, pod); got != u {
			t.Errorf("workflow %s's pod %s: sidecar runs as %d, want its workflow's %d", name, pod.Name, got, u)
		}
		users[name] = u
	}
	if users["jobs"] == users["templated"] {
		t.Fatalf("both workflows run as user %d", users["jobs"])
	}

	third := oneStepWorkflow(t, ns, "third")
	if err := e.k8s.Create(ctx, third); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the third workflow waiting for a user ID", func() error {
		wf, err := e.workflow(ns, "third")
		if err != nil {
			return err
		}
		c := meta.FindStatusCondition(wf.Status.Conditions, v1alpha1.ConditionReady)
		if c == nil || c.Status != "False" || c.Reason != ReasonNoAgentUser || wf.Status.AgentUser != nil {
			return fmt.Errorf("Ready %+v, agentUser %v", c, wf.Status.AgentUser)
		}
		return nil
	})
	if _, err := e.pod(t, ns, "third-a-0"); err == nil {
		t.Fatal("a pod of the workflow without a user ID was created")
	}
	if err := e.k8s.Delete(ctx, templated); err != nil {
		t.Fatal(err)
	}
	eventually(t, 40*time.Second, "the third workflow running as the deleted one's user", func() error {
		wf, err := e.workflow(ns, "third")
		if err != nil {
			return err
		}
		if got := ptr.Deref(wf.Status.AgentUser, 0); got != users["templated"] {
			return fmt.Errorf("agentUser %d, want %d", got, users["templated"])
		}
		return nil
	})
}

// emptyLister is a client.Reader whose List finds no Workflow: a cache that has seen
// none of the user IDs chosen yet.
type emptyLister struct{ client.Reader }

func (emptyLister) List(context.Context, client.ObjectList, ...client.ListOption) error { return nil }

// While the cache lags behind the status patches, workflows chosen for at once still get
// different user IDs, and a workflow asked for again gets its own again; a choice the
// cache never shows (its workflow was deleted first) is free again after givenFor.
func TestAgentUsersAreNotGivenTwiceWhileTheCacheLags(t *testing.T) {
	now := time.Unix(1e9, 0)
	r := &WorkflowReconciler{AgentUsers: AgentUsers{First: 10, Count: 3}, Now: func() time.Time { return now }}
	ctx := context.Background()
	wf := func(uid string) *v1alpha1.Workflow {
		return &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid)}}
	}
	got := map[int64]string{}
	for _, uid := range []string{"a", "b", "c"} {
		u, err := r.agentUser(ctx, emptyLister{}, wf(uid), false)
		if err != nil {
			t.Fatal(err)
		}
		if other, ok := got[u]; ok {
			t.Fatalf("workflows %s and %s both got user %d", other, uid, u)
		}
		got[u] = uid
	}
	if u, err := r.agentUser(ctx, emptyLister{}, wf("a"), false); err != nil || got[u] != "a" {
		t.Errorf("workflow a asked again: user %d (%v), want its own", u, err)
	}
	if _, err := r.agentUser(ctx, emptyLister{}, wf("d"), false); !errors.Is(err, errNoAgentUser) {
		t.Errorf("a fourth workflow with three IDs given: %v, want errNoAgentUser", err)
	}
	now = now.Add(givenFor + time.Second)
	if u, err := r.agentUser(ctx, emptyLister{}, wf("d"), false); err != nil || u < 10 || u > 12 {
		t.Errorf("after givenFor: user %d (%v), want one of the range again", u, err)
	}
	// A workflow provisioned before (Ready) keeps the shared user; so does every one
	// without a range.
	if u, _ := r.agentUser(ctx, emptyLister{}, wf("e"), true); u != v1alpha1.DefaultAgentUser {
		t.Errorf("a provisioned workflow without a user: %d, want %d", u, v1alpha1.DefaultAgentUser)
	}
	if u, _ := (&WorkflowReconciler{}).agentUser(ctx, emptyLister{}, wf("f"), false); u != v1alpha1.DefaultAgentUser {
		t.Errorf("no range: %d, want %d", u, v1alpha1.DefaultAgentUser)
	}
}
