package controller

import (
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

// The status is a function of the spec and the pods (and their Jobs) alone: table-driven,
// no API server.
func TestComputeStatus(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	// pod is a pod of step[0], created at t0+age seconds, in phase ph; attempt < 0: no
	// attempt annotation (injected into a Job's or a user's pod); job: owned by that Job.
	pod := func(name, step string, age int, ph corev1.PodPhase, attempt int, job types.UID) corev1.Pod {
		p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(t0.Add(time.Duration(age) * time.Second)),
			Labels: map[string]string{v1alpha1.LabelWorkflow: "wf", v1alpha1.LabelStep: step, v1alpha1.LabelInstance: "0"}},
			Status: corev1.PodStatus{Phase: ph}}
		if attempt >= 0 {
			p.Annotations = map[string]string{v1alpha1.AnnotationAttempt: string(rune('0' + attempt))}
		}
		if job != "" {
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "job", UID: job, Controller: ptr.To(true)}}
		}
		return p
	}
	gaveUp := &batchv1.Job{Status: batchv1.JobStatus{Conditions: []batchv1.JobCondition{{Type: batchv1.JobFailed, Status: corev1.ConditionTrue}}}}
	retrying := &batchv1.Job{Status: batchv1.JobStatus{Active: 1}}
	templated := &corev1.PodTemplateSpec{}
	const R, S, F, P = corev1.PodRunning, corev1.PodSucceeded, corev1.PodFailed, corev1.PodPending
	for _, tc := range []struct {
		name    string
		prev    v1alpha1.WorkflowPhase
		backoff int32
		labels  bool // steps have no template (labelled pods)
		pods    []corev1.Pod
		jobs    map[types.UID]*batchv1.Job
		want    v1alpha1.WorkflowPhase
		steps   []v1alpha1.StepPhase // a, b
	}{
		{name: "no pods yet", want: v1alpha1.WorkflowPending, steps: []v1alpha1.StepPhase{"Pending", "Pending"}},
		{name: "pods scheduled, none running", pods: []corev1.Pod{pod("a", "a", 0, P, 0, "")},
			want: v1alpha1.WorkflowPending, steps: []v1alpha1.StepPhase{"Pending", "Pending"}},
		{name: "one running", pods: []corev1.Pod{pod("a", "a", 0, R, 0, "")},
			want: v1alpha1.WorkflowRunning, steps: []v1alpha1.StepPhase{"Running", "Pending"}},
		{name: "all succeeded", pods: []corev1.Pod{pod("a", "a", 0, S, 0, ""), pod("b", "b", 0, S, 0, "")},
			want: v1alpha1.WorkflowSucceeded, steps: []v1alpha1.StepPhase{"Succeeded", "Succeeded"}},
		{name: "failed attempt with a retry left", backoff: 1, pods: []corev1.Pod{pod("a", "a", 0, F, 0, "")},
			want: v1alpha1.WorkflowRunning, steps: []v1alpha1.StepPhase{"Pending", "Pending"}},
		{name: "retry failed too: backoffLimit spent", backoff: 1, pods: []corev1.Pod{pod("a-1", "a", 5, F, 1, ""), pod("a", "a", 0, F, 0, "")},
			want: v1alpha1.WorkflowFailed, steps: []v1alpha1.StepPhase{"Failed", "Pending"}},
		{name: "retry succeeded", backoff: 1, pods: []corev1.Pod{pod("a-1", "a", 5, S, 1, ""), pod("a", "a", 0, F, 0, ""), pod("b", "b", 0, S, 0, "")},
			want: v1alpha1.WorkflowSucceeded, steps: []v1alpha1.StepPhase{"Succeeded", "Succeeded"}},
		{name: "labelled Job retried and succeeded (listed newest first)", labels: true,
			pods: []corev1.Pod{pod("a-new", "a", 9, S, -1, "j"), pod("a-old", "a", 0, F, -1, "j"), pod("b", "b", 0, S, -1, "")},
			jobs: map[types.UID]*batchv1.Job{"j": retrying}, want: v1alpha1.WorkflowSucceeded, steps: []v1alpha1.StepPhase{"Succeeded", "Succeeded"}},
		{name: "labelled Job's pod failed, Job retrying", labels: true, pods: []corev1.Pod{pod("a", "a", 0, F, -1, "j")},
			jobs: map[types.UID]*batchv1.Job{"j": retrying}, want: v1alpha1.WorkflowRunning, steps: []v1alpha1.StepPhase{"Pending", "Pending"}},
		{name: "labelled Job's pod failed, Job not seen yet", labels: true, pods: []corev1.Pod{pod("a", "a", 0, F, -1, "j")},
			want: v1alpha1.WorkflowRunning, steps: []v1alpha1.StepPhase{"Pending", "Pending"}},
		{name: "labelled Job gave up", labels: true, pods: []corev1.Pod{pod("a", "a", 0, F, -1, "j")},
			jobs: map[types.UID]*batchv1.Job{"j": gaveUp}, want: v1alpha1.WorkflowFailed, steps: []v1alpha1.StepPhase{"Failed", "Pending"}},
		{name: "bare labelled pod failed: nothing retries it", labels: true, pods: []corev1.Pod{pod("a", "a", 0, F, -1, "")},
			want: v1alpha1.WorkflowFailed, steps: []v1alpha1.StepPhase{"Failed", "Pending"}},
		{name: "Succeeded is final", prev: v1alpha1.WorkflowSucceeded, pods: []corev1.Pod{pod("a", "a", 0, F, 0, "")},
			want: v1alpha1.WorkflowSucceeded, steps: []v1alpha1.StepPhase{"Failed", "Pending"}},
		{name: "Failed is final", prev: v1alpha1.WorkflowFailed, pods: []corev1.Pod{pod("a", "a", 0, S, 0, ""), pod("b", "b", 0, S, 0, "")},
			want: v1alpha1.WorkflowFailed, steps: []v1alpha1.StepPhase{"Succeeded", "Succeeded"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wf := &v1alpha1.Workflow{Spec: v1alpha1.WorkflowSpec{Steps: []v1alpha1.Step{{Name: "a"}, {Name: "b"}}}}
			wf.Status.Phase = tc.prev
			for i := range wf.Spec.Steps {
				wf.Spec.Steps[i].BackoffLimit = ptr.To(tc.backoff)
				if !tc.labels {
					wf.Spec.Steps[i].Template = templated
				}
			}
			got := computeStatus(wf, observed{instances: groupPods(tc.pods), jobs: tc.jobs})
			if got.Phase != tc.want {
				t.Errorf("phase %s, want %s (failure %q)", got.Phase, tc.want, got.Failure)
			}
			if (got.Failure != "") != (tc.want == v1alpha1.WorkflowFailed && tc.prev == "") {
				t.Errorf("failure %q with phase %s", got.Failure, got.Phase)
			}
			for i, want := range tc.steps {
				if got.Steps[i].Phase != want {
					t.Errorf("step %s is %s, want %s", got.Steps[i].Name, got.Steps[i].Phase, want)
				}
			}
		})
	}
}

// The status names each step's oldest wait, from what the sidecars of its running pods
// recorded, and the workflow's oldest; what pods that no longer run recorded is ignored.
func TestStatusNamesWaits(t *testing.T) {
	since := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	pod := func(name, step string, ph corev1.PodPhase) corev1.Pod {
		return corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{v1alpha1.LabelWorkflow: "wf", v1alpha1.LabelStep: step, v1alpha1.LabelInstance: "0"}},
			Status: corev1.PodStatus{Phase: ph}}
	}
	wf := &v1alpha1.Workflow{Spec: v1alpha1.WorkflowSpec{Steps: []v1alpha1.Step{{Name: "a"}, {Name: "b"}, {Name: "c"}}}}
	got := computeStatus(wf, observed{
		instances: groupPods([]corev1.Pod{pod("a-0", "a", corev1.PodSucceeded), pod("b-0", "b", corev1.PodRunning), pod("c-0", "c", corev1.PodRunning)}),
		stats: []wfmeta.PodStats{
			{Pod: "a-0", Waits: []wfmeta.WaitStat{{What: `open of "old" (OnClose:1, Update)`, Since: since.Add(-time.Hour)}}},
			{Pod: "b-0", Waits: []wfmeta.WaitStat{{What: `read of "f" (OnClose:1, NoUpdate)`, Since: since.Add(time.Minute)}}},
			{Pod: "c-0", Waits: []wfmeta.WaitStat{{What: `open of "g" (OnTermination:1, Update)`, Since: since}}},
		},
	})
	if got.StepProgress != "a 1/1, b 0/1 waiting, c 0/1 waiting" {
		t.Errorf("step progress %q", got.StepProgress)
	}
	if got.Waiting != `c[0]: open of "g" (OnTermination:1, Update)` {
		t.Errorf("the workflow's oldest wait is %q", got.Waiting)
	}
	if b := got.Steps[1]; b.Waiting != `b[0]: read of "f" (OnClose:1, NoUpdate)` || b.WaitingSince == nil || !b.WaitingSince.Time.Equal(since.Add(time.Minute)) {
		t.Errorf("step b: waiting %q since %v", b.Waiting, b.WaitingSince)
	}
	if got.Steps[0].Waiting != "" {
		t.Errorf("a finished pod's last recorded wait is shown: %q", got.Steps[0].Waiting)
	}
}
