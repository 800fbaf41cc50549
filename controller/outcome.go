package controller

import (
	"context"
	"fmt"
	"strconv"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

// appOutcome reports how pod's app containers (spec.containers; the native sidecar is
// an init container) ended, and whether that is final: every app container terminated
// and none will be restarted in place. A container that failed under restartPolicy
// OnFailure or Always will run again, so it is not final; a pod the kubelet marked Failed
// (evicted, deadline exceeded) is.
func appOutcome(pod *corev1.Pod) (wfmeta.Outcome, bool) {
	if pod.Status.Phase == corev1.PodFailed {
		reason := pod.Status.Reason
		if reason == "" {
			reason = "pod failed"
		}
		if o, ok := containersOutcome(pod); ok && !o.Succeeded {
			reason = o.Reason
		}
		return wfmeta.Outcome{Reason: reason}, true
	}
	o, ok := containersOutcome(pod)
	if !ok {
		return wfmeta.Outcome{}, false
	}
	if !o.Succeeded && pod.Spec.RestartPolicy != corev1.RestartPolicyNever {
		return wfmeta.Outcome{}, false
	}
	return o, true
}

// containersOutcome is the outcome of pod's app containers once all have terminated:
// success when every one exited 0, otherwise the first failure.
func containersOutcome(pod *corev1.Pod) (wfmeta.Outcome, bool) {
	if len(pod.Spec.Containers) == 0 {
		return wfmeta.Outcome{}, false
	}
	state := map[string]*corev1.ContainerStateTerminated{}
	for i := range pod.Status.ContainerStatuses {
		cs := &pod.Status.ContainerStatuses[i]
		state[cs.Name] = cs.State.Terminated
	}
	o := wfmeta.Outcome{Succeeded: true}
	for _, c := range pod.Spec.Containers {
		t := state[c.Name]
		if t == nil {
			return wfmeta.Outcome{}, false
		}
		if t.ExitCode != 0 && o.Succeeded {
			o = wfmeta.Outcome{Reason: fmt.Sprintf("container %s exited with code %d (%s)", c.Name, t.ExitCode, t.Reason)}
		}
	}
	return o, true
}

// describeAttempt adds to o which attempt of which step instance pod was, and the Job
// that controls it (owner, if a Job), so that recordedPods can stand in for the pod once
// it is gone.
func describeAttempt(o *wfmeta.Outcome, pod *corev1.Pod, owner *metav1.OwnerReference) {
	o.Pod, o.Step, o.Node, o.Created = pod.Name, pod.Labels[v1alpha1.LabelStep], pod.Spec.NodeName, pod.CreationTimestamp.UTC()
	o.Instance, _ = strconv.Atoi(pod.Labels[v1alpha1.LabelInstance])
	o.Attempt, _ = strconv.Atoi(pod.Annotations[v1alpha1.AnnotationAttempt])
	if owner != nil && owner.Kind == "Job" && owner.APIVersion == batchv1.SchemeGroupVersion.String() {
		o.Job, o.JobUID = owner.Name, string(owner.UID)
	}
}

// recordedPods returns pods and, for each outcome recorded of a labelled pod of another
// tool that is no longer among them (its engine deleted it once it ended), a stand-in
// pod built from the outcome: name, step instance, attempt, node, owning Job and final
// phase. The workflow's status then still counts the attempt, as it did while the pod
// existed; without it, an instance whose pod was deleted would count as never started,
// and the Workflow would neither succeed nor fail.
func recordedPods(wf *v1alpha1.Workflow, pods []corev1.Pod, outcomes map[string]wfmeta.Outcome) []corev1.Pod {
	present := make(map[types.UID]bool, len(pods))
	for i := range pods {
		present[pods[i].UID] = true
	}
	out := pods
	for uid, o := range outcomes {
		if o.Step == "" || present[types.UID(uid)] {
			continue
		}
		p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: o.Pod, Namespace: wf.Namespace, UID: types.UID(uid),
			CreationTimestamp: metav1.NewTime(o.Created),
			Labels: map[string]string{v1alpha1.LabelWorkflow: wf.Name, v1alpha1.LabelStep: o.Step,
				v1alpha1.LabelInstance: strconv.Itoa(o.Instance)},
			Annotations: map[string]string{v1alpha1.AnnotationAttempt: strconv.Itoa(o.Attempt)}},
			Spec:   corev1.PodSpec{NodeName: o.Node},
			Status: corev1.PodStatus{Phase: corev1.PodSucceeded}}
		if !o.Succeeded {
			p.Status.Phase, p.Status.Message = corev1.PodFailed, o.Reason
		}
		if o.Job != "" {
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: batchv1.SchemeGroupVersion.String(), Kind: "Job",
				Name: o.Job, UID: types.UID(o.JobUID), Controller: ptr.To(true)}}
		}
		out = append(out, p)
	}
	return out
}

// recordOutcomes writes, once per pod, the final outcome of the app containers of each
// of the workflow's pods into its KV bucket, where the pod's sidecar waits for it before
// it records the instance's termination (wfmeta.Outcome). A write that fails is
// logged and tried again at the next reconcile.
func (r *WorkflowReconciler) recordOutcomes(ctx context.Context, wfUID types.UID, names wfmeta.Names, pods []corev1.Pod) {
	log := ctrl.LoggerFrom(ctx)
	for i := range pods {
		pod := &pods[i]
		o, final := appOutcome(pod)
		if !final || r.outcomeRecorded(wfUID, pod.UID) {
			continue
		}
		if owner := metav1.GetControllerOf(pod); owner == nil || owner.UID != wfUID {
			describeAttempt(&o, pod, owner)
		}
		if err := r.Streams.RecordOutcome(ctx, names, string(pod.UID), o); err != nil {
			log.Error(err, "recording a pod's outcome for its sidecar", "pod", klog.KObj(pod))
			continue
		}
		r.markOutcome(wfUID, pod.UID)
		log.V(1).Info("recorded a pod's outcome for its sidecar", "pod", klog.KObj(pod), "succeeded", o.Succeeded, "reason", o.Reason)
	}
}

func (r *WorkflowReconciler) outcomeRecorded(wf, pod types.UID) bool {
	r.watchMu.Lock()
	defer r.watchMu.Unlock()
	return r.outcomes[wf][pod]
}

func (r *WorkflowReconciler) markOutcome(wf, pod types.UID) {
	r.watchMu.Lock()
	defer r.watchMu.Unlock()
	if r.outcomes == nil {
		r.outcomes = map[types.UID]map[types.UID]bool{}
	}
	if r.outcomes[wf] == nil {
		r.outcomes[wf] = map[types.UID]bool{}
	}
	r.outcomes[wf][pod] = true
}
