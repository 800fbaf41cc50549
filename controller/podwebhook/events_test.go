package podwebhook

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/sluice-io/sluice/api/v1alpha1"
)

// admit sends pod to h as the API server would, a dry run if dryRun.
func admit(t *testing.T, h *PodInjector, pod *corev1.Pod, dryRun bool) admission.Response {
	t.Helper()
	raw, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	return h.Handle(context.Background(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		Namespace: "tenant", Operation: admissionv1.Create, DryRun: &dryRun, Object: runtime.RawExtension{Raw: raw}}})
}

// events drains what the fake recorder holds.
func events(r *record.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-r.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

// A labelled pod that names a step the Workflow lacks, or an instance beyond its
// replicas, is refused, and the refusal is recorded as a Warning Event on the Workflow
// naming the pod, what created it, the key at fault and the steps there are: the pod
// itself never exists, and the engine's own log is often not where one looks. A dry run
// records nothing; a pod the webhook admits records nothing either.
func TestRefusedPodsAreEventsOnTheWorkflow(t *testing.T) {
	wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Name: "wf", Namespace: "tenant", UID: "u"},
		Spec: v1alpha1.WorkflowSpec{Steps: []v1alpha1.Step{{Name: "produce"}, {Name: "consume", Replicas: ptr.To[int32](2)}}}}
	rec := record.NewFakeRecorder(10)
	h := &PodInjector{Reader: oneWorkflow{wf: wf}, Decoder: admission.NewDecoder(testScheme(t)), Recorder: rec}
	pod := func(labels map[string]string) *corev1.Pod {
		l := map[string]string{v1alpha1.LabelInject: "true", v1alpha1.LabelWorkflow: "wf"}
		for k, v := range labels {
			l[k] = v
		}
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{GenerateName: "filter-", Namespace: "tenant", Labels: l,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "argoproj.io/v1alpha1", Kind: "Workflow", Name: "pipeline-x7k", UID: "a", Controller: ptr.To(true)}}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "busybox"}}}}
	}

	resp := admit(t, h, pod(map[string]string{v1alpha1.LabelStep: "filter"}), false)
	if resp.Allowed {
		t.Fatal("a pod naming an undeclared step was admitted")
	}
	want := `Warning UnknownStep pod filter-* (of Workflow pipeline-x7k) refused: label sluice.io/step: Workflow tenant/wf declares no step "filter" (its steps: produce, consume)`
	if got := events(rec); len(got) != 1 || got[0] != want {
		t.Errorf("events %q; want [%q]", got, want)
	}
	if !strings.Contains(resp.Result.Message, "label sluice.io/step") {
		t.Errorf("refusal %q does not name the label", resp.Result.Message)
	}

	if resp := admit(t, h, pod(map[string]string{v1alpha1.LabelStep: "consume", v1alpha1.LabelInstance: "2"}), false); resp.Allowed {
		t.Fatal("a pod naming instance 2 of a step of 2 replicas was admitted")
	}
	if got := events(rec); len(got) != 1 || !strings.HasPrefix(got[0], "Warning UnknownInstance pod filter-* (of Workflow pipeline-x7k) refused: label sluice.io/instance: instance 2") {
		t.Errorf("events %q; want one UnknownInstance naming the label", got)
	}

	if resp := admit(t, h, pod(map[string]string{v1alpha1.LabelStep: "filter"}), true); resp.Allowed {
		t.Fatal("a dry run of a pod naming an undeclared step was admitted")
	}
	if got := events(rec); len(got) != 0 {
		t.Errorf("a dry run recorded %q", got)
	}

	// Labels alone join the Workflow.
	if resp := admit(t, h, pod(map[string]string{v1alpha1.LabelStep: "consume", v1alpha1.LabelInstance: "1"}), false); !resp.Allowed || len(resp.Patches) == 0 {
		t.Fatalf("a pod labelled with a declared step: allowed %v, %d patches (%v); want injected", resp.Allowed, len(resp.Patches), resp.Result)
	}
	if got := events(rec); len(got) != 0 {
		t.Errorf("an admitted pod recorded %q", got)
	}
}
