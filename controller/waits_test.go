package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

// What a running pod's sidecar records (its waits, a failed wait, a failed upload) shows
// in the Workflow: kubectl get swf's Waiting and Step progress columns, and one Warning
// Event per problem for kubectl describe.
func TestWaitsAndProblemsReachTheWorkflow(t *testing.T) {
	e := startEnv(t)
	ctx := context.Background()
	ns := e.namespace(t, "waits")
	wf := workflowFrom(t, ns, `
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: waits}
spec:
  steps:
  - name: p
    outputs: [{path: late.txt, commit: {rule: OnClose}}]
  - name: c
    inputs: [late.txt]
`)
	if err := e.k8s.Create(ctx, wf); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "c-0", Namespace: ns,
		Labels: map[string]string{v1alpha1.LabelWorkflow: "waits", v1alpha1.LabelStep: "c", v1alpha1.LabelInstance: "0"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "busybox"}}}}
	if err := e.k8s.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	e.finish(t, pod, corev1.PodRunning, 0)
	var created struct{ UID string }
	eventually(t, 20*time.Second, "workflow provisioned", func() error {
		got, err := e.workflow(ns, "waits")
		if err != nil || got.Status.Phase == "" {
			return fmt.Errorf("phase %q (%w)", got.Status.Phase, err)
		}
		created.UID = string(got.UID)
		return nil
	})
	names := wfmeta.NamesForWorkflow(ns, "waits", created.UID)
	kv, err := e.js.KeyValue(ctx, names.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	since := time.Now().UTC().Truncate(time.Second)
	stats, _ := json.Marshal(wfmeta.PodStats{Pod: "c-0", Host: "n1",
		Waits: []wfmeta.WaitStat{{What: `open of "late.txt" (OnClose:1, Update)`, Since: since}},
		Problems: []wfmeta.PodProblem{
			{Kind: wfmeta.ProblemWaitFailed, Message: `open of "x" (OnClose:1, Update): waiting for creation: context deadline exceeded`, At: since},
			{Kind: wfmeta.ProblemUploadFailed, Message: "storing permanent output r.txt: access denied", At: since.Add(time.Second)},
		}})
	if _, err := kv.Put(ctx, wfmeta.StatsKey(string(pod.UID)), stats); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the wait in the status", func() error {
		got, err := e.workflow(ns, "waits")
		if err != nil {
			return err
		}
		if got.Status.Waiting != `c[0]: open of "late.txt" (OnClose:1, Update)` || got.Status.StepProgress != "p 0/1, c 0/1 waiting" {
			return fmt.Errorf("waiting %q, step progress %q", got.Status.Waiting, got.Status.StepProgress)
		}
		return nil
	})
	eventually(t, 20*time.Second, "an Event per problem", func() error {
		waits, uploads := e.events(ns, ReasonWaitFailed), e.events(ns, ReasonUploadFailed)
		if len(waits) != 1 || !strings.Contains(waits[0], `pod c-0: open of "x"`) || len(uploads) != 1 || !strings.Contains(uploads[0], "access denied") {
			return fmt.Errorf("WaitFailed events %q, UploadFailed events %q", waits, uploads)
		}
		return nil
	})
}
