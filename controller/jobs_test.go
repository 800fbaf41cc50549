package controller

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/sluice-io/sluice/api/v1alpha1"
)

// labelledJob creates a Job whose pods belong to step[0] of workflow wf, as a user's Job
// labelled for Sluice; envtest runs no Job controller, so the test makes its pods.
func (e *env) labelledJob(t *testing.T, ns, name, wf, step string) *batchv1.Job {
	t.Helper()
	labels := map[string]string{v1alpha1.LabelWorkflow: wf, v1alpha1.LabelStep: step, v1alpha1.LabelInstance: "0"}
	j := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: batchv1.JobSpec{BackoffLimit: ptr.To[int32](3), Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: labels},
			Spec:       corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "main", Image: "busybox"}}},
		}}}
	if err := e.k8s.Create(context.Background(), j); err != nil {
		t.Fatal(err)
	}
	return j
}

// jobPod creates a pod of Job j, as the Job controller would, and sets its phase.
func (e *env) jobPod(t *testing.T, j *batchv1.Job, name string, phase corev1.PodPhase, exit int32) {
	t.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: j.Namespace, Labels: j.Spec.Template.Labels,
		OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(j, batchv1.SchemeGroupVersion.WithKind("Job"))}},
		Spec: j.Spec.Template.Spec}
	if err := e.k8s.Create(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	e.finish(t, p, phase, exit)
}

// A labelled Job's pod that fails and is retried by the Job does not fail the Workflow:
// only the Job giving up does. The Workflow of a Job whose retry succeeds is Succeeded,
// with no Failed=True condition.
func TestLabelledJobRetries(t *testing.T) {
	e := startEnv(t)
	ctx := context.Background()
	ns := e.namespace(t, "jobs")
	doc := `
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: NAME}
spec:
  steps:
  - name: a
    outputs: [{path: x, commit: {rule: OnClose}}]
`
	for _, name := range []string{"retried", "gives-up"} {
		if err := e.k8s.Create(ctx, workflowFrom(t, ns, strings.Replace(doc, "NAME", name, 1))); err != nil {
			t.Fatal(err)
		}
	}
	stepFailures := func(name string, want int32) func() error {
		return func() error {
			wf, err := e.workflow(ns, name)
			if err != nil {
				return err
			}
			if len(wf.Status.Steps) == 0 || wf.Status.Steps[0].Failed != want {
				return fmt.Errorf("step status %+v, want %d failed pods counted", wf.Status.Steps, want)
			}
			return nil
		}
	}

	// The Job's first pod fails; the controller has seen it (the step counts it) ...
	j := e.labelledJob(t, ns, "retried", "retried", "a")
	e.jobPod(t, j, "retried-first", corev1.PodFailed, 1)
	eventually(t, 20*time.Second, "the failed pod counted", stepFailures("retried", 1))
	// ... and the Job's retry succeeds, its output committed.
	e.recordCommit(t, ns, "retried", "x", "")
	e.jobPod(t, j, "retried-second", corev1.PodSucceeded, 0)
	eventually(t, 20*time.Second, "workflow Succeeded", func() error {
		wf, err := e.workflow(ns, "retried")
		if err != nil {
			return err
		}
		if wf.Status.Phase != v1alpha1.WorkflowSucceeded {
			return fmt.Errorf("phase %q, conditions %+v", wf.Status.Phase, wf.Status.Conditions)
		}
		if meta.IsStatusConditionTrue(wf.Status.Conditions, v1alpha1.ConditionFailed) {
			return fmt.Errorf("Succeeded with Failed=True: %+v", wf.Status.Conditions)
		}
		return nil
	})

	// A Job that gives up fails its Workflow, naming the pod.
	j = e.labelledJob(t, ns, "gives-up", "gives-up", "a")
	e.jobPod(t, j, "gives-up-first", corev1.PodFailed, 3)
	eventually(t, 20*time.Second, "the failed pod counted", stepFailures("gives-up", 1))
	if wf, err := e.workflow(ns, "gives-up"); err != nil || wf.Status.Phase == v1alpha1.WorkflowFailed {
		t.Fatalf("the workflow failed while its Job could still retry (%v)", err)
	}
	now := metav1.Now()
	j.Status = batchv1.JobStatus{StartTime: &now, Failed: 1, Conditions: []batchv1.JobCondition{
		{Type: batchv1.JobFailureTarget, Status: corev1.ConditionTrue, Reason: "BackoffLimitExceeded", LastTransitionTime: now},
		{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, Reason: "BackoffLimitExceeded", LastTransitionTime: now},
	}}
	if err := e.k8s.Status().Update(ctx, j); err != nil {
		t.Fatalf("marking the Job failed: %v", err)
	}
	eventually(t, 20*time.Second, "workflow Failed", func() error {
		wf, err := e.workflow(ns, "gives-up")
		if err != nil {
			return err
		}
		c := meta.FindStatusCondition(wf.Status.Conditions, v1alpha1.ConditionFailed)
		if wf.Status.Phase != v1alpha1.WorkflowFailed || c == nil || !strings.Contains(c.Message, "gives-up-first") {
			return fmt.Errorf("phase %q, Failed condition %+v", wf.Status.Phase, c)
		}
		return nil
	})
}
