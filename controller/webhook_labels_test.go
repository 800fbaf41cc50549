package controller

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/controller/inject"
	"github.com/sluice-io/sluice/controller/podwebhook"
)

// Against a real API server: a pod that joins a Workflow by labels only (as engines that
// set no annotations make them) is injected as the step instance its labels and its
// engine's numbering name: an Airflow mapped task's map_index, an Argo withItems node's
// item index. A labelled pod naming a step the Workflow lacks is refused, and the
// refusal is a Warning Event on the Workflow, naming the pod and the steps there are.
func TestWebhookJoinsByLabelsAndRecordsUnknownSteps(t *testing.T) {
	e := startEnv(t)
	ctx := context.Background()
	ns := e.namespace(t, "by-labels")
	if err := e.k8s.Create(ctx, workflowFrom(t, ns, joinable)); err != nil {
		t.Fatal(err)
	}
	byLabels := func(name string, labels, annotations map[string]string) *corev1.Pod {
		p := labelledPod(name, annotations)
		p.Namespace = ns
		p.Labels[v1alpha1.LabelWorkflow] = "jobs"
		for k, v := range labels {
			p.Labels[k] = v
		}
		return p
	}
	for _, tc := range []struct {
		pod      *corev1.Pod
		step     string
		instance string
	}{
		{byLabels("writer", map[string]string{v1alpha1.LabelStep: "writer"}, nil), "writer", "0"},
		{byLabels("reader-airflow", map[string]string{v1alpha1.LabelStep: "reader", "dag_id": "d", "task_id": "reader", "run_id": "manual__1",
			"kubernetes_pod_operator": "True", inject.KeyAirflowMapIndex: "1"}, nil), "reader", "1"},
		{byLabels("reader-argo", map[string]string{v1alpha1.LabelStep: "reader", "workflows.argoproj.io/workflow": "pipe"},
			map[string]string{inject.KeyArgoNodeName: "pipe.reader(0:a)"}), "reader", "0"},
	} {
		if err := e.k8s.Create(ctx, tc.pod); err != nil {
			t.Fatalf("pod %s, labelled to join: %v", tc.pod.Name, err)
		}
		got, err := e.pod(t, ns, tc.pod.Name)
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Spec.InitContainers) == 0 || got.Spec.InitContainers[0].Name != inject.SidecarName {
			t.Errorf("pod %s: no sidecar injected", tc.pod.Name)
		}
		if got.Labels[v1alpha1.LabelStep] != tc.step || got.Labels[v1alpha1.LabelInstance] != tc.instance {
			t.Errorf("pod %s: step %q instance %q; want %s %s", tc.pod.Name, got.Labels[v1alpha1.LabelStep], got.Labels[v1alpha1.LabelInstance], tc.step, tc.instance)
		}
	}

	bad := byLabels("", map[string]string{v1alpha1.LabelStep: "filter"}, nil)
	bad.GenerateName = "filter-"
	bad.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "engine-run", UID: "9f0c"}}
	err := e.k8s.Create(ctx, bad)
	if err == nil || !strings.Contains(err.Error(), `label sluice.io/step: Workflow `+ns+`/jobs declares no step "filter" (its steps: writer, reader)`) {
		t.Fatalf("a pod labelled with an undeclared step: %v; want refused naming the label and the steps", err)
	}
	want := `pod filter-* (of ConfigMap engine-run) refused: label sluice.io/step: Workflow ` + ns + `/jobs declares no step "filter" (its steps: writer, reader)`
	eventually(t, 20*time.Second, "an UnknownStep Event on the Workflow", func() error {
		got := e.events(ns, podwebhook.ReasonUnknownStep)
		if len(got) != 1 || got[0] != want {
			return fmt.Errorf("UnknownStep events %q; want [%q]", got, want)
		}
		return nil
	})
}
