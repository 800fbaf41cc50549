package inject

import (
	"fmt"
	"regexp"
	"strconv"

	corev1 "k8s.io/api/core/v1"

	"github.com/sluice-io/sluice/api/v1alpha1"
)

// Keys of the engines' own pod metadata that number a pod among its siblings, read (in
// this order) for the instance of a labelled pod that names none itself.
const (
	// KeyJobCompletionIndex is an Indexed Job's completion index, an annotation and, since
	// Kubernetes 1.28, a label of its pods (Kubeflow Trainer and JobSet run Indexed Jobs).
	KeyJobCompletionIndex = "batch.kubernetes.io/job-completion-index"
	// KeyStatefulSetPodIndex is a StatefulSet pod's ordinal (a label, Kubernetes 1.28+).
	KeyStatefulSetPodIndex = "apps.kubernetes.io/pod-index"
	// KeyKubeflowReplicaIndex is the replica index the Kubeflow training operator (v1:
	// PyTorchJob, TFJob, ...) labels each replica's pod with.
	KeyKubeflowReplicaIndex = "training.kubeflow.org/replica-index"
	// KeyAirflowMapIndex is the map index Airflow's KubernetesPodOperator labels the pod
	// of a mapped task instance with (task.expand(...)); unmapped tasks have none.
	KeyAirflowMapIndex = "map_index"
	// KeyArgoNodeName is the annotation Argo Workflows puts the pod's node name in; a
	// task or step fanned out by withItems, withParam or withSequence is named
	// "<parent>.<task>(<index>:<item>)".
	KeyArgoNodeName = "workflows.argoproj.io/node-name"
)

// argoItem matches the "(<index>:" that opens the item part of an Argo node name; a
// retry's "(<attempt>)" has no colon and does not match.
var argoItem = regexp.MustCompile(`\((\d+):`)

// Origins says where each part of a labelled pod's request came from ("annotation
// sluice.io/step", "label map_index", ...), so that a refusal names what to change.
type Origins struct {
	// Workflow is where the Workflow's name came from.
	Workflow string
	// Step is where the step's name came from.
	Step string
	// Instance is where the instance came from; empty when the pod names none (0).
	Instance string
}

// lookup reads key from the pod's annotations, else from its labels. A pod that sets
// both, to different values, is refused: which one it meant is not for Sluice to guess.
func lookup(pod *corev1.Pod, key string) (value, origin string, err error) {
	a, inAnnotations := pod.Annotations[key]
	l, inLabels := pod.Labels[key]
	switch {
	case inAnnotations && inLabels && a != l:
		return "", "", fmt.Errorf("annotation %s (%q) and label %s (%q) disagree; set one of them", key, a, key, l)
	case inAnnotations:
		return a, "annotation " + key, nil
	case inLabels:
		return l, "label " + key, nil
	}
	return "", "", nil
}

// InstanceFromPod reads the step instance a pod labelled sluice.io/inject=true asks for.
// Each of sluice.io/workflow, sluice.io/step, sluice.io/instance and sluice.io/mode may be
// an annotation or a label (engines such as Calrissian set labels only); the first two are
// required; sluice.io/mount-path is an annotation (a label cannot hold a path). With no sluice.io/instance, the instance is the
// one the pod's engine numbers it by: an Indexed Job's completion index, a StatefulSet
// pod's ordinal, a Kubeflow replica index, an Airflow mapped task's map index, an Argo
// node's item index, in this order; else 0. The errors name the key at fault.
func InstanceFromPod(pod *corev1.Pod) (wf string, in Instance, from Origins, err error) {
	wf, from.Workflow, err = lookup(pod, v1alpha1.AnnotationWorkflow)
	if err != nil {
		return "", in, from, err
	}
	if wf == "" {
		return "", in, from, fmt.Errorf("label or annotation %s is required on a pod labelled %s=true", v1alpha1.AnnotationWorkflow, v1alpha1.LabelInject)
	}
	in.Step, from.Step, err = lookup(pod, v1alpha1.AnnotationStep)
	if err != nil {
		return "", in, from, err
	}
	if in.Step == "" {
		return "", in, from, fmt.Errorf("label or annotation %s is required on a pod labelled %s=true", v1alpha1.AnnotationStep, v1alpha1.LabelInject)
	}
	idx, origin, err := instanceOf(pod)
	if err != nil {
		return "", in, from, err
	}
	if idx != "" {
		n, err := strconv.Atoi(idx)
		if err != nil || n < 0 {
			return "", in, from, fmt.Errorf("%s: %q is not a non-negative integer", origin, idx)
		}
		in.Instance, from.Instance = n, origin
	}
	// A label's value cannot hold a path ("/" is not allowed): an annotation only.
	in.MountPath = pod.Annotations[v1alpha1.AnnotationMountPath]
	if in.MountPath != "" && in.MountPath[0] != '/' {
		return "", in, from, fmt.Errorf("annotation %s: %q is not an absolute path", v1alpha1.AnnotationMountPath, in.MountPath)
	}
	if in.Mode, _, err = lookup(pod, v1alpha1.AnnotationMode); err != nil {
		return "", in, from, err
	}
	return wf, in, from, nil
}

// instanceOf returns the pod's instance as it is written and where it came from: its own
// sluice.io/instance, else the first of its engine's numbers it carries ("" if none).
func instanceOf(pod *corev1.Pod) (value, origin string, err error) {
	for _, key := range []string{v1alpha1.AnnotationInstance, KeyJobCompletionIndex, KeyStatefulSetPodIndex, KeyKubeflowReplicaIndex} {
		if v, origin, err := lookup(pod, key); err != nil || v != "" {
			return v, origin, err
		}
	}
	if v := pod.Labels[KeyAirflowMapIndex]; v != "" && pod.Labels["kubernetes_pod_operator"] == "True" {
		return v, "label " + KeyAirflowMapIndex, nil
	}
	if name := pod.Annotations[KeyArgoNodeName]; name != "" {
		if m := argoItem.FindAllStringSubmatch(name, -1); len(m) > 0 {
			return m[len(m)-1][1], fmt.Sprintf("annotation %s (%q)", KeyArgoNodeName, name), nil
		}
	}
	return "", "", nil
}
