package controller

import (
	"context"
	"encoding/json"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	"sigs.k8s.io/yaml"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/controller/inject"
	"github.com/sluice-io/sluice/controller/podwebhook"
)

// A pod created a moment after its Workflow is injected even when the manager's cache
// does not have the Workflow yet: the webhook reads it from the API server then.
func TestWebhookReadsAWorkflowTheCacheLacks(t *testing.T) {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = v1alpha1.AddToScheme(s)
	wf := &v1alpha1.Workflow{}
	if err := yaml.UnmarshalStrict([]byte(joinable), wf); err != nil {
		t.Fatal(err)
	}
	wf.Namespace = "ns1"
	cache := fake.NewClientBuilder().WithScheme(s).Build()
	api := fake.NewClientBuilder().WithScheme(s).WithObjects(wf).Build()
	pod := labelledPod("w", map[string]string{v1alpha1.AnnotationWorkflow: "jobs", v1alpha1.AnnotationStep: "writer"})
	raw, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	req := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "1", Namespace: "ns1", Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw}}}
	h := &podwebhook.PodInjector{Reader: cache, Decoder: admission.NewDecoder(s), Options: inject.Options{Image: "sluice:test"}}
	if resp := h.Handle(context.Background(), req); resp.Allowed {
		t.Fatal("without the API reader, a Workflow the cache lacks was found")
	}
	h.APIReader = api
	if resp := h.Handle(context.Background(), req); !resp.Allowed || len(resp.Patches) == 0 {
		t.Fatalf("with the API reader: allowed %v, %d patches (%v); want the pod injected", resp.Allowed, len(resp.Patches), resp.Result)
	}
}
