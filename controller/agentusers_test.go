package controller

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/controller/inject"
	"github.com/sluice-io/sluice/internal/podconfig"
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
	e := startEnv(t, func(r *WorkflowReconciler) {
		r.AgentUsers, r.AgentNamespace = AgentUsers{First: first, Count: 2}, v1alpha1.DefaultAgentNamespace
	})
	ctx := context.Background()
	agents := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.DefaultAgentNamespace}}
	if err := e.k8s.Create(ctx, agents); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
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

// Two controller processes (a rollout's old and new pod) give workflows user IDs at
// once, each from its own memory: the claims in the API keep any ID from being given
// twice; a workflow asked for again gets its own again, also when its status patch was
// lost; a workflow an earlier controller provisioned keeps the shared user; a deleted
// workflow's ID is given again only after the range has gone round; a stale copy of a
// workflow never records a second ID over the first.
func TestAgentUsersAreClaimedInTheAPI(t *testing.T) {
	ctx := context.Background()
	wf := func(name string) *v1alpha1.Workflow {
		return &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: name, UID: types.UID("uid-" + name)}}
	}
	a, b, c, d, old := wf("a"), wf("b"), wf("c"), wf("d"), wf("old")
	oldSecret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: podconfig.SecretName("old"),
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "sluice.io/v1alpha1", Kind: "Workflow", Name: "old", UID: old.UID, Controller: ptr.To(true)}}}}
	api := fake.NewClientBuilder().WithScheme(scheme()).WithObjects(a, b, c, d, old, oldSecret).
		WithStatusSubresource(&v1alpha1.Workflow{}).Build()
	process := func() *WorkflowReconciler {
		return &WorkflowReconciler{Client: api, AgentNamespace: "sluice-agents", AgentUsers: AgentUsers{First: 10, Count: 3}}
	}
	one, two := process(), process()
	got := map[int64]string{}
	for i, w := range []*v1alpha1.Workflow{a, b, c} {
		r := []*WorkflowReconciler{one, two}[i%2]
		u, err := r.agentUser(ctx, w.DeepCopy())
		if err != nil {
			t.Fatal(err)
		}
		if other, ok := got[u]; ok {
			t.Fatalf("workflows %s and %s both got user %d", other, w.Name, u)
		}
		got[u] = w.Name
	}
	if u, err := two.agentUser(ctx, a.DeepCopy()); err != nil || got[u] != "a" {
		t.Errorf("workflow a asked again (its status never patched): user %d (%v), want its own", u, err)
	}
	if _, err := one.agentUser(ctx, d.DeepCopy()); !errors.Is(err, errNoAgentUser) {
		t.Errorf("a fourth workflow with three IDs claimed: %v, want errNoAgentUser", err)
	}
	if u, err := one.agentUser(ctx, old.DeepCopy()); err != nil || u != v1alpha1.DefaultAgentUser {
		t.Errorf("a workflow an earlier controller provisioned: user %d (%v), want %d", u, err, v1alpha1.DefaultAgentUser)
	}

	// a's status holds its ID; a stale copy of a (read before) must not record another.
	stale := a.DeepCopy()
	if err := one.ensureAgentUser(ctx, a); err != nil {
		t.Fatal(err)
	}
	stale.Status.AgentUser = nil
	if err := one.removeAgentUser(ctx, b); err != nil { // b deleted: its ID free again
		t.Fatal(err)
	}
	if err := two.ensureAgentUser(ctx, stale); err == nil && *stale.Status.AgentUser != *a.Status.AgentUser {
		t.Errorf("a stale copy recorded user %d over a's %d", *stale.Status.AgentUser, *a.Status.AgentUser)
	}
	var now v1alpha1.Workflow
	if err := api.Get(ctx, client.ObjectKeyFromObject(a), &now); err != nil || ptr.Deref(now.Status.AgentUser, 0) != *a.Status.AgentUser {
		t.Errorf("a's status.agentUser is %v (%v), want %d", now.Status.AgentUser, err, *a.Status.AgentUser)
	}
	// d gets b's ID, the only free one; with a fourth ID in the range it would get that
	// first (after the last given).
	if u, err := one.agentUser(ctx, d.DeepCopy()); err != nil || got[u] != "b" {
		t.Errorf("d after b's deletion: user %d (%v), want b's", u, err)
	}
	wide := &WorkflowReconciler{Client: api, AgentNamespace: "sluice-agents", AgentUsers: AgentUsers{First: 10, Count: 4}}
	e := wf("e")
	if err := api.Create(ctx, e); err != nil {
		t.Fatal(err)
	}
	if err := wide.removeAgentUser(ctx, a); err != nil {
		t.Fatal(err)
	}
	if u, err := wide.agentUser(ctx, e); err != nil || u != 13 {
		t.Errorf("a process started after the others gives %d (%v), want 13 (after the saved cursor), not a's freed 10", u, err)
	}
}
