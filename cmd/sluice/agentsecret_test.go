package main

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/podconfig"
)

// The plugin takes a workflow's store server connection only from a Secret the controller
// labelled as that workflow's: a Secret of the agent namespace named after one
// workflow's UID but labelled as another's is refused; a missing one is nil, no error.
func TestAgentConnectionIsTheLabelledWorkflows(t *testing.T) {
	ctx := context.Background()
	wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "wf", UID: "uid-wf"}}
	other := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "other", UID: "uid-other"}}
	secret := func(w *v1alpha1.Workflow, labelledAs string) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: v1alpha1.DefaultAgentNamespace, Name: podconfig.AgentSecretName(string(w.UID)),
			Labels: map[string]string{v1alpha1.LabelAgentNamespace: "team", v1alpha1.LabelWorkflow: labelledAs}},
			Data: (&podconfig.Connection{URL: "nats://nats:4222"}).Data()}
	}
	api := fake.NewClientBuilder().WithScheme(scheme()).WithObjects(secret(wf, "wf"), secret(other, "wf")).Build()
	if c, err := getAgentConnection(ctx, api, v1alpha1.DefaultAgentNamespace, wf); err != nil || c == nil || c.URL != "nats://nats:4222" {
		t.Errorf("the workflow's own agent Secret: %+v, %v", c, err)
	}
	if c, err := getAgentConnection(ctx, api, v1alpha1.DefaultAgentNamespace, other); err == nil {
		t.Errorf("an agent Secret labelled as another workflow's was taken: %+v", c)
	}
	gone := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "gone", UID: "uid-gone"}}
	if c, err := getAgentConnection(ctx, api, v1alpha1.DefaultAgentNamespace, gone); err != nil || c != nil {
		t.Errorf("no agent Secret: %+v, %v; want nil and no error", c, err)
	}
}
