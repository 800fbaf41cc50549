package controller

import (
	"cmp"
	"context"
	"fmt"
	"strconv"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sluice-io/sluice/api/v1alpha1"
)

// jobsOf returns the Jobs that own the given pods, by UID (a Job that no longer exists is
// left out).
func (r *WorkflowReconciler) jobsOf(ctx context.Context, pods []corev1.Pod) (map[types.UID]*batchv1.Job, error) {
	jobs := map[types.UID]*batchv1.Job{}
	for i := range pods {
		for _, ref := range pods[i].OwnerReferences {
			if ref.Kind != "Job" || ref.APIVersion != batchv1.SchemeGroupVersion.String() {
				continue
			}
			if _, seen := jobs[ref.UID]; seen {
				continue
			}
			var j batchv1.Job
			err := r.Client.Get(ctx, types.NamespacedName{Namespace: pods[i].Namespace, Name: ref.Name}, &j)
			if apierrors.IsNotFound(err) || err == nil && j.UID != ref.UID {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("reading Job %s/%s of pod %s: %w", pods[i].Namespace, ref.Name, pods[i].Name, err)
			}
			jobs[ref.UID] = &j
		}
	}
	return jobs, nil
}

// attempt is one pod run of a step instance.
type attempt struct {
	pod *corev1.Pod
	n   int // the attempt's number, 0 first
}

type instanceKey struct {
	step     string
	instance int
}

// groupPods sorts the workflow's pods by step instance, attempts in order.
func groupPods(pods []corev1.Pod) map[instanceKey][]attempt {
	out := map[instanceKey][]attempt{}
	for i := range pods {
		p := &pods[i]
		idx, err := strconv.Atoi(p.Labels[v1alpha1.LabelInstance])
		if err != nil {
			continue
		}
		n, _ := strconv.Atoi(p.Annotations[v1alpha1.AnnotationAttempt])
		k := instanceKey{p.Labels[v1alpha1.LabelStep], idx}
		out[k] = append(out[k], attempt{pod: p, n: n})
	}
	for k := range out {
		sortAttempts(out[k])
	}
	return out
}

// podDone reports whether the pod ended, and whether it succeeded.
func podDone(p *corev1.Pod) (done, ok bool) {
	switch p.Status.Phase {
	case corev1.PodSucceeded:
		return true, true
	case corev1.PodFailed:
		return true, false
	}
	return false, false
}

// podFailure describes why a pod failed: the first app container's termination.
func podFailure(p *corev1.Pod) string {
	for _, c := range p.Status.ContainerStatuses {
		if t := c.State.Terminated; t != nil && t.ExitCode != 0 {
			return fmt.Sprintf("container %s exited %d: %s", c.Name, t.ExitCode, cmp.Or(t.Message, t.Reason))
		}
	}
	return cmp.Or(p.Status.Message, p.Status.Reason, "failed")
}

// stopPods deletes the workflow's unfinished pods it created: once a step failed for
// good, its consumers would wait for its files until their wait timeout. They get the
// API's default grace period (30 s), not the long one given for a successful drain.
func (r *WorkflowReconciler) stopPods(ctx context.Context, wf *v1alpha1.Workflow, inst map[instanceKey][]attempt) {
	for _, at := range inst {
		p := at[len(at)-1].pod
		if done, _ := podDone(p); done || !p.DeletionTimestamp.IsZero() || !metav1.IsControlledBy(p, wf) {
			continue
		}
		if err := r.Client.Delete(ctx, p, client.GracePeriodSeconds(30)); client.IgnoreNotFound(err) != nil {
			ctrl.LoggerFrom(ctx).Error(err, "stopping pod of failed workflow", "pod", klog.KObj(p))
		}
	}
}
