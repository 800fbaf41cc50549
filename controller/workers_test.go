package controller

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-io/sluice/internal/wfmeta"
)

// stallingStreams blocks every metadata read of workflows whose bucket names slow until
// the reconcile's context ends, and says when the first one started.
type stallingStreams struct {
	Streams
	slow    string
	stalled chan struct{}
	once    sync.Once
}

func (s *stallingStreams) Metadata(ctx context.Context, names wfmeta.Names) (wfmeta.Meta, error) {
	if strings.Contains(names.Bucket, s.slow) {
		s.once.Do(func() { close(s.stalled) })
		<-ctx.Done()
		return wfmeta.Meta{}, ctx.Err()
	}
	return s.Streams.Metadata(ctx, names)
}

// stallThenProvision creates Workflow first, whose metadata reads st stalls, waits until
// it is reconciled (stalled), then creates Workflow second and waits for its pod: the
// controller still provisions workflows while one hangs.
func stallThenProvision(t *testing.T, e *env, st *stallingStreams, ns, first, second string) {
	t.Helper()
	ctx := context.Background()
	const doc = `
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: NAME}
spec:
  steps:
  - name: a
    template: {spec: {containers: [{name: main, image: busybox}]}}
    outputs: [{path: x, commit: {rule: OnClose}}]
`
	if err := e.k8s.Create(ctx, workflowFrom(t, ns, strings.Replace(doc, "NAME", first, 1))); err != nil {
		t.Fatal(err)
	}
	select {
	case <-st.stalled:
	case <-time.After(20 * time.Second):
		t.Fatalf("workflow %s was never reconciled", first)
	}
	if err := e.k8s.Create(ctx, workflowFrom(t, ns, strings.Replace(doc, "NAME", second, 1))); err != nil {
		t.Fatal(err)
	}
	e.waitPod(t, ns, second+"-a-0")
}

// One Workflow whose reconcile hangs (its KV bucket does not answer) holds one worker:
// another Workflow is still provisioned and its pods created.
func TestOneSlowWorkflowDoesNotStallOthers(t *testing.T) {
	st := &stallingStreams{slow: "_slow-", stalled: make(chan struct{})}
	e := startEnv(t, func(r *WorkflowReconciler) { st.Streams = r.Streams; r.Streams = st })
	stallThenProvision(t, e, st, e.namespace(t, "workers"), "slow", "fast")
}

// A reconcile that hangs ends at the reconcile timeout: with a single worker, a Workflow
// whose metadata read never answers still lets another be provisioned, since each of its
// reconciles ends (and is retried) instead of holding the worker for ever.
func TestAHungReconcileEndsAtTheTimeout(t *testing.T) {
	st := &stallingStreams{slow: "_hung-", stalled: make(chan struct{})}
	e := startEnv(t, func(r *WorkflowReconciler) {
		st.Streams, r.Streams = r.Streams, st
		r.Workers, r.ReconcileTimeout = 1, 2*time.Second
	})
	stallThenProvision(t, e, st, e.namespace(t, "timeout"), "hung", "next")
}
