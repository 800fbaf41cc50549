package inject

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluice-io/sluice/api/v1alpha1"
)

func optInPod(labels, annotations map[string]string) *corev1.Pod {
	l := map[string]string{v1alpha1.LabelInject: "true"}
	for k, v := range labels {
		l[k] = v
	}
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Labels: l, Annotations: annotations}}
}

// A pod joins a Workflow by labels as well as by annotations (engines such as Calrissian
// set labels only), and its instance is the engine's own number for it where the engine
// has one: what each engine's pods carry, as the engine writes it.
func TestInstanceFromPodReadsLabelsAndEngineNumbers(t *testing.T) {
	const wf, step = v1alpha1.AnnotationWorkflow, v1alpha1.AnnotationStep
	for name, tc := range map[string]struct {
		labels, annotations map[string]string
		step                string
		instance            int
		from                string
	}{
		"annotations only": {annotations: map[string]string{wf: "w", step: "s", v1alpha1.AnnotationInstance: "2"}, step: "s", instance: 2,
			from: "annotation sluice.io/instance"},
		"labels only": {labels: map[string]string{wf: "w", step: "s", v1alpha1.LabelInstance: "3"}, step: "s", instance: 3,
			from: "label sluice.io/instance"},
		"label and annotation agreeing":         {labels: map[string]string{wf: "w", step: "s"}, annotations: map[string]string{wf: "w", step: "s"}, step: "s"},
		"workflow by label, step by annotation": {labels: map[string]string{wf: "w"}, annotations: map[string]string{step: "s"}, step: "s"},
		"no instance: 0":                        {labels: map[string]string{wf: "w", step: "s"}, step: "s"},
		"an Indexed Job's completion index (annotation)": {labels: map[string]string{wf: "w", step: "s"},
			annotations: map[string]string{KeyJobCompletionIndex: "4"}, step: "s", instance: 4, from: "annotation " + KeyJobCompletionIndex},
		"an Indexed Job's completion index (label)": {labels: map[string]string{wf: "w", step: "s", KeyJobCompletionIndex: "5"},
			step: "s", instance: 5, from: "label " + KeyJobCompletionIndex},
		"a StatefulSet's ordinal": {labels: map[string]string{wf: "w", step: "s", KeyStatefulSetPodIndex: "1"}, step: "s", instance: 1,
			from: "label " + KeyStatefulSetPodIndex},
		"a Kubeflow replica index": {labels: map[string]string{wf: "w", step: "s", KeyKubeflowReplicaIndex: "2",
			"training.kubeflow.org/replica-type": "worker"}, step: "s", instance: 2, from: "label " + KeyKubeflowReplicaIndex},
		"an Airflow mapped task": {labels: map[string]string{wf: "w", step: "s", "dag_id": "d", "task_id": "s", "run_id": "manual__x",
			"kubernetes_pod_operator": "True", KeyAirflowMapIndex: "6", "try_number": "1"}, step: "s", instance: 6, from: "label map_index"},
		"a map_index label of some other tool is no instance": {labels: map[string]string{wf: "w", step: "s", KeyAirflowMapIndex: "6"}, step: "s"},
		"an Argo withItems node": {labels: map[string]string{wf: "w", step: "s"},
			annotations: map[string]string{KeyArgoNodeName: "recipe-x7k.consume(2:c)"}, step: "s", instance: 2},
		"an Argo withItems node retried": {labels: map[string]string{wf: "w", step: "s"},
			annotations: map[string]string{KeyArgoNodeName: "recipe-x7k.consume(1:{\"n\":1})(3)"}, step: "s", instance: 1},
		"an Argo node retried, not fanned out": {labels: map[string]string{wf: "w", step: "s"},
			annotations: map[string]string{KeyArgoNodeName: "recipe-x7k.consume(3)"}, step: "s"},
		"sluice.io/instance before the engine's number": {labels: map[string]string{wf: "w", step: "s", KeyJobCompletionIndex: "5"},
			annotations: map[string]string{v1alpha1.AnnotationInstance: "1"}, step: "s", instance: 1, from: "annotation sluice.io/instance"},
	} {
		t.Run(name, func(t *testing.T) {
			w, in, from, err := InstanceFromPod(optInPod(tc.labels, tc.annotations))
			if err != nil {
				t.Fatal(err)
			}
			if w != "w" || in.Step != tc.step || in.Instance != tc.instance {
				t.Errorf("workflow %q step %q instance %d; want w %s %d", w, in.Step, in.Instance, tc.step, tc.instance)
			}
			if tc.from != "" && from.Instance != tc.from {
				t.Errorf("instance from %q; want %q", from.Instance, tc.from)
			}
		})
	}
}

// What a labelled pod cannot ask for is refused with the key at fault named: a missing
// workflow or step, a label and an annotation that disagree, an instance that is no
// number (the engine's too), a relative mount path.
func TestInstanceFromPodRefusals(t *testing.T) {
	const wf, step = v1alpha1.AnnotationWorkflow, v1alpha1.AnnotationStep
	for name, tc := range map[string]struct {
		labels, annotations map[string]string
		want                string
	}{
		"no workflow":  {labels: map[string]string{step: "s"}, want: "label or annotation sluice.io/workflow is required"},
		"no step":      {annotations: map[string]string{wf: "w"}, want: "label or annotation sluice.io/step is required"},
		"steps differ": {labels: map[string]string{wf: "w", step: "a"}, annotations: map[string]string{step: "b"}, want: `annotation sluice.io/step ("b") and label sluice.io/step ("a") disagree`},
		"workflows differ": {labels: map[string]string{wf: "w", step: "a"}, annotations: map[string]string{wf: "v"},
			want: `annotation sluice.io/workflow ("v") and label sluice.io/workflow ("w") disagree`},
		"a negative instance label":    {labels: map[string]string{wf: "w", step: "s", v1alpha1.LabelInstance: "-1"}, want: `label sluice.io/instance: "-1" is not a non-negative integer`},
		"an engine index not a number": {labels: map[string]string{wf: "w", step: "s", KeyStatefulSetPodIndex: "x"}, want: `label apps.kubernetes.io/pod-index: "x"`},
		"a relative mount path":        {labels: map[string]string{wf: "w", step: "s"}, annotations: map[string]string{v1alpha1.AnnotationMountPath: "data"}, want: `annotation sluice.io/mount-path: "data" is not an absolute path`},
	} {
		t.Run(name, func(t *testing.T) {
			_, _, _, err := InstanceFromPod(optInPod(tc.labels, tc.annotations))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v; want one containing %q", err, tc.want)
			}
		})
	}
}
