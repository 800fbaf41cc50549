package controller

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"

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
