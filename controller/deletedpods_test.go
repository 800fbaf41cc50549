package controller

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sluice-io/sluice/api/v1alpha1"
)

// Engines delete their pods once they end (Airflow's KubernetesPodOperator by default,
// Argo's podGC, Nextflow's cleanup): a labelled pod that succeeded and was then deleted
// still counts for its step instance, from the outcome the controller recorded of it, so
// the Workflow succeeds once its other steps do and its status still names the pod.
func TestDeletedLabelledPodsStillCount(t *testing.T) {
	e := startEnv(t)
	ctx := context.Background()
	ns := e.namespace(t, "deleted")
	const doc = `
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: engine}
spec:
  steps:
  - name: a
    outputs: [{path: x.txt, commit: {rule: OnClose}}]
  - name: b
    inputs: [x.txt]
    outputs: [{path: y.txt, commit: {rule: OnClose}}]
`
	if err := e.k8s.Create(ctx, workflowFrom(t, ns, doc)); err != nil {
		t.Fatal(err)
	}
	pod := func(name, step string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
			Labels: map[string]string{v1alpha1.LabelWorkflow: "engine", v1alpha1.LabelStep: step, v1alpha1.LabelInstance: "0",
				"dag_id": "d", "task_id": step, "kubernetes_pod_operator": "True"}},
			Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "main", Image: "busybox"}}}}
		if err := e.k8s.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	stepA := func(wf *v1alpha1.Workflow) v1alpha1.StepStatus {
		for _, s := range wf.Status.Steps {
			if s.Name == "a" {
				return s
			}
		}
		return v1alpha1.StepStatus{}
	}

	e.recordCommit(t, ns, "engine", "x.txt", "")
	a := pod("a-7psexxa6", "a")
	b := pod("b-2kq9d0ms", "b")
	e.finish(t, a, corev1.PodSucceeded, 0)
	eventually(t, 20*time.Second, "step a counted Succeeded", func() error {
		wf, err := e.workflow(ns, "engine")
		if err != nil || stepA(wf).Phase != v1alpha1.StepSucceeded {
			return fmt.Errorf("step a %+v (%w)", stepA(wf), err)
		}
		return nil
	})
	// The engine deletes the pod it is done with.
	if err := e.k8s.Delete(ctx, a, client.GracePeriodSeconds(0)); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "pod a gone", func() error {
		if _, err := e.pod(t, ns, a.Name); err == nil {
			return fmt.Errorf("pod %s still there", a.Name)
		}
		return nil
	})
	e.recordCommit(t, ns, "engine", "y.txt", "")
	e.finish(t, b, corev1.PodSucceeded, 0)
	eventually(t, 20*time.Second, "workflow Succeeded", func() error {
		wf, err := e.workflow(ns, "engine")
		if err != nil {
			return err
		}
		if wf.Status.Phase != v1alpha1.WorkflowSucceeded {
			return fmt.Errorf("phase %q, conditions %+v, steps %+v", wf.Status.Phase, wf.Status.Conditions, wf.Status.Steps)
		}
		if s := stepA(wf); s.Succeeded != 1 || len(s.Instances) != 1 || s.Instances[0].Pod != a.Name {
			return fmt.Errorf("step a %+v: want its deleted pod %s counted", s, a.Name)
		}
		return nil
	})
}
