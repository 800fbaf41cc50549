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
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
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

// noWorkflows is an API server without Workflows.
type noWorkflows struct{ client.Reader }

func (noWorkflows) Get(_ context.Context, key client.ObjectKey, _ client.Object, _ ...client.GetOption) error {
	return apierrors.NewNotFound(v1alpha1.GroupVersion.WithResource("workflows").GroupResource(), key.Name)
}
