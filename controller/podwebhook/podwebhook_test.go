package podwebhook

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/sluice-io/sluice/api/v1alpha1"
)

// A labelled pod that sets the webhook's injected mark itself is refused: it would skip
// injection and its checks, keeping CSI volumes of its own choosing (issue 32, finding 4).
func TestSelfSetInjectedMarkIsRefused(t *testing.T) {
	scheme := testScheme(t)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "tenant", Labels: map[string]string{v1alpha1.LabelInject: "true"},
			Annotations: map[string]string{v1alpha1.AnnotationInjected: "true", v1alpha1.AnnotationWorkflow: "no-such-workflow", v1alpha1.AnnotationStep: "s"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "busybox"}}},
	}
	raw, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	h := &PodInjector{Reader: noWorkflows{}, Decoder: admission.NewDecoder(scheme)}
	resp := h.Handle(context.Background(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		Namespace: "tenant", Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw}}})
	if resp.Allowed || !strings.Contains(resp.Result.Message, v1alpha1.AnnotationInjected) {
		t.Fatalf("a pod that set %s itself: allowed %v (%s); want refused naming the annotation", v1alpha1.AnnotationInjected, resp.Allowed, resp.Result.Message)
	}
}

// A labelled pod that shares its process namespace is refused: every container of it
// would see the sidecar's process, which holds the workflow's credentials (issue 43,
// finding 5). The same pod without it is injected.
func TestPodSharingItsProcessNamespaceIsRefused(t *testing.T) {
	scheme := testScheme(t)
	wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Name: "wf", Namespace: "tenant", UID: "u"},
		Spec: v1alpha1.WorkflowSpec{Steps: []v1alpha1.Step{{Name: "s"}}}}
	h := &PodInjector{Reader: oneWorkflow{wf: wf}, Decoder: admission.NewDecoder(scheme)}
	for _, share := range []bool{true, false} {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "tenant", Labels: map[string]string{v1alpha1.LabelInject: "true"},
				Annotations: map[string]string{v1alpha1.AnnotationWorkflow: "wf", v1alpha1.AnnotationStep: "s"}},
			Spec: corev1.PodSpec{ShareProcessNamespace: &share, Containers: []corev1.Container{{Name: "app", Image: "busybox"}}},
		}
		raw, err := json.Marshal(pod)
		if err != nil {
			t.Fatal(err)
		}
		resp := h.Handle(context.Background(), admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
			Namespace: "tenant", Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw}}})
		switch {
		case share && (resp.Allowed || !strings.Contains(resp.Result.Message, "spec.shareProcessNamespace")):
			t.Errorf("a pod sharing its process namespace: allowed %v (%v); want refused naming spec.shareProcessNamespace", resp.Allowed, resp.Result)
		case !share && (!resp.Allowed || len(resp.Patches) == 0):
			t.Errorf("a pod that does not share its process namespace: allowed %v, %d patches (%v); want injected", resp.Allowed, len(resp.Patches), resp.Result)
		}
	}
}

// oneWorkflow is an API server with one Workflow.
type oneWorkflow struct {
	client.Reader
	wf *v1alpha1.Workflow
}

func (o oneWorkflow) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	if key.Namespace != o.wf.Namespace || key.Name != o.wf.Name {
		return apierrors.NewNotFound(v1alpha1.GroupVersion.WithResource("workflows").GroupResource(), key.Name)
	}
	o.wf.DeepCopyInto(obj.(*v1alpha1.Workflow))
	return nil
}

// testScheme holds core/v1 and Sluice's types.
func testScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	return scheme
}

// noWorkflows is an API server without Workflows.
type noWorkflows struct{ client.Reader }

func (noWorkflows) Get(_ context.Context, key client.ObjectKey, _ client.Object, _ ...client.GetOption) error {
	return apierrors.NewNotFound(v1alpha1.GroupVersion.WithResource("workflows").GroupResource(), key.Name)
}
