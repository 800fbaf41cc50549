package controller

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

// observed is what one reconcile saw of a Workflow's pods: each step instance's attempts
// in order, and the Jobs that own labelled pods (by UID), whose own retry policy decides
// when a failed pod fails its instance.
type observed struct {
	instances map[instanceKey][]attempt
	jobs      map[types.UID]*batchv1.Job
	// stats are what the pods' sidecars recorded in the KV bucket (waits, problems).
	stats []wfmeta.PodStats
}

// computedStatus is the part of a Workflow's status that follows from its spec and the
// pods observed, with no I/O: Reconcile writes it and does the side effects (events,
// stopping pods).
type computedStatus struct {
	Steps    []v1alpha1.StepStatus
	Progress string // "done/total" steps
	// StepProgress and Waiting are the status fields of the same names.
	StepProgress, Waiting string
	Phase                 v1alpha1.WorkflowPhase
	// Failure names the instance that failed the workflow and why ("" unless it failed).
	Failure string
	// Running is true when a pod of the workflow is running.
	Running bool
}

// computeStatus derives the step statuses, progress and phase of wf from the pods in obs.
// An instance has succeeded once one of its attempts has; it has failed for good when its
// last attempt failed and no retry will follow: the step's backoffLimit is spent (pods
// the controller creates), the owning Job has given up (Failed or FailureTarget condition,
// for labelled pods of a Job, which makes its own retries), or at once for a labelled pod
// that nothing retries. Once Succeeded or Failed, the phase never changes (Kubernetes API
// conventions: a terminal phase is final), so a late pod event cannot flip a finished
// workflow.
func computeStatus(wf *v1alpha1.Workflow, obs observed) computedStatus {
	var c computedStatus
	done, started := 0, false
	waits := runningWaits(obs)
	var progress []string
	var oldest time.Time
	for _, s := range wf.Spec.Steps {
		ss := v1alpha1.StepStatus{Name: s.Name}
		replicas := int(ptr.Deref(s.Replicas, 1))
		stepFailed := false
		for i := 0; i < replicas; i++ {
			at := obs.instances[instanceKey{s.Name, i}]
			if len(at) > 0 {
				last := at[len(at)-1].pod
				ss.Instances = append(ss.Instances, v1alpha1.InstanceStatus{Instance: int32(i), Pod: last.Name,
					Node: last.Spec.NodeName, Phase: last.Status.Phase, Attempts: int32(len(at))})
			}
			succeeded := false
			for _, a := range at {
				fin, ok := podDone(a.pod)
				switch {
				case fin && ok:
					ss.Succeeded++
					succeeded = true
				case fin:
					ss.Failed++
				case a.pod.Status.Phase == corev1.PodRunning:
					ss.Running++
				}
			}
			if succeeded || len(at) == 0 {
				continue
			}
			last := at[len(at)-1]
			if fin, ok := podDone(last.pod); fin && !ok && !retried(&s, last, obs.jobs) && c.Failure == "" {
				c.Failure = fmt.Sprintf("step %s instance %d failed (pod %s: %s)", s.Name, i, last.pod.Name, podFailure(last.pod))
				stepFailed = true
			}
		}
		switch {
		case ss.Succeeded >= int32(replicas):
			ss.Phase = v1alpha1.StepSucceeded
			done++
		case stepFailed:
			ss.Phase = v1alpha1.StepFailed
		case ss.Running > 0:
			ss.Phase = v1alpha1.StepRunning
		default:
			ss.Phase = v1alpha1.StepPending
		}
		c.Running = c.Running || ss.Running > 0
		started = started || ss.Running > 0 || ss.Succeeded > 0 || ss.Failed > 0
		state := ""
		if w, ok := waits[s.Name]; ok && ss.Phase == v1alpha1.StepRunning {
			ss.Waiting, ss.WaitingSince = w.What, &metav1.Time{Time: w.Since}
			state = " waiting"
			if oldest.IsZero() || w.Since.Before(oldest) {
				oldest, c.Waiting = w.Since, w.What
			}
		} else if ss.Phase == v1alpha1.StepFailed {
			state = " failed"
		}
		progress = append(progress, fmt.Sprintf("%s %d/%d%s", s.Name, min(ss.Succeeded, int32(replicas)), replicas, state))
		c.Steps = append(c.Steps, ss)
	}
	c.Progress = fmt.Sprintf("%d/%d", done, len(wf.Spec.Steps))
	c.StepProgress = strings.Join(progress, ", ")
	switch prev := wf.Status.Phase; {
	case prev == v1alpha1.WorkflowSucceeded || prev == v1alpha1.WorkflowFailed:
		c.Phase, c.Failure = prev, ""
	case c.Failure != "":
		c.Phase = v1alpha1.WorkflowFailed
	case done == len(wf.Spec.Steps):
		c.Phase = v1alpha1.WorkflowSucceeded
	case started:
		c.Phase = v1alpha1.WorkflowRunning
	default:
		c.Phase = v1alpha1.WorkflowPending
	}
	return c
}

// runningWaits returns, per step, the oldest wait the sidecars of its running pods
// recorded, its What prefixed with the instance (`c[0]: open of ...`). Stats of pods that
// no longer run are left out: what they recorded last is no longer waiting.
func runningWaits(obs observed) map[string]wfmeta.WaitStat {
	running := map[string]instanceKey{}
	for k, at := range obs.instances {
		for _, a := range at {
			if a.pod.Status.Phase == corev1.PodRunning {
				running[a.pod.Name] = k
			}
		}
	}
	out := map[string]wfmeta.WaitStat{}
	for _, ps := range obs.stats {
		k, ok := running[ps.Pod]
		if !ok || len(ps.Waits) == 0 {
			continue
		}
		w := ps.Waits[0]
		if cur, ok := out[k.step]; !ok || w.Since.Before(cur.Since) {
			out[k.step] = wfmeta.WaitStat{What: fmt.Sprintf("%s[%d]: %s", k.step, k.instance, w.What), Since: w.Since}
		}
	}
	return out
}

// retried reports whether a failed attempt will be followed by another: the controller
// retries its own pods up to the step's backoffLimit; a Job retries its pods until it
// gives up; a bare labelled pod is never retried.
func retried(s *v1alpha1.Step, a attempt, jobs map[types.UID]*batchv1.Job) bool {
	if s.Template != nil {
		return a.n < int(ptr.Deref(s.BackoffLimit, 0))
	}
	for _, ref := range a.pod.OwnerReferences {
		if ref.Kind != "Job" || ref.Controller == nil || !*ref.Controller {
			continue
		}
		job, ok := jobs[ref.UID]
		if !ok {
			// Not seen yet (or deleted): a Job that still exists decides; until it is
			// seen, the pod's failure is not final.
			return true
		}
		return !jobGaveUp(job)
	}
	return false
}

// jobGaveUp reports whether a Job has failed for good: its Failed condition, or the
// FailureTarget condition Kubernetes sets before it terminates the Job's pods (batch/v1).
func jobGaveUp(j *batchv1.Job) bool {
	for _, c := range j.Status.Conditions {
		if (c.Type == batchv1.JobFailed || c.Type == batchv1.JobFailureTarget) && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// sortAttempts orders the attempts of one instance: by the controller's attempt number
// (pods it created), then by creation time and name (pods a Job or a user created, which
// carry no number).
func sortAttempts(at []attempt) {
	slices.SortFunc(at, func(a, b attempt) int {
		return cmp.Or(cmp.Compare(a.n, b.n),
			a.pod.CreationTimestamp.Time.Compare(b.pod.CreationTimestamp.Time),
			cmp.Compare(a.pod.Name, b.pod.Name))
	})
}
