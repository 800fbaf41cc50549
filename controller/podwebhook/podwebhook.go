// Package podwebhook is the mutating admission webhook that gives pods labelled
// sluice.io/inject=true streaming (PodInjector): it checks the pod's sluice.io/*
// annotations against its namespace's Workflow and adds the sidecar, the CSI volumes
// and the environment that package inject builds. Pods of other tools (Argo, Nextflow,
// Snakemake, plain Jobs) join a Workflow this way.
package podwebhook

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/controller/inject"
)

// InjectPath is the URL path the pod injection webhook is served on.
const InjectPath = "/inject-pod"

// PodInjector is the mutating admission webhook for pods labelled sluice.io/inject=true
// (the MutatingWebhookConfiguration's objectSelector sends no other pod). It reads the
// sluice.io/* annotations, checks that the named Workflow exists in the pod's namespace
// and declares the step, and adds the sidecar, the volumes and the environment (package
// inject). Refusals name the annotation at fault.
type PodInjector struct {
	// Reader reads Workflows (the manager's cache).
	Reader client.Reader
	// APIReader, when set, reads from the API server a Workflow that Reader does not have:
	// a Workflow created a moment before its pods may not be in the cache yet.
	APIReader client.Reader
	// Decoder decodes admission requests.
	Decoder admission.Decoder
	// Options are the sidecar's settings.
	Options inject.Options
}

// Handle implements admission.Handler.
func (h *PodInjector) Handle(ctx context.Context, req admission.Request) admission.Response {
	pod := &corev1.Pod{}
	if err := h.Decoder.Decode(req, pod); err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding the pod: %w", err))
	}
	if pod.Labels[v1alpha1.LabelInject] != "true" {
		return admission.Allowed("not labelled " + v1alpha1.LabelInject + "=true")
	}
	if _, ok := pod.Annotations[v1alpha1.AnnotationInjected]; ok {
		// Only the webhook sets the mark: a pod that carries it asks to skip injection
		// (and the checks above the sidecar) with volumes of its own choosing.
		return admission.Denied(fmt.Sprintf("annotation %s is set by Sluice's webhook, never by a pod; remove it", v1alpha1.AnnotationInjected))
	}
	name, in, err := inject.InstanceFromAnnotations(pod)
	if err != nil {
		return admission.Denied(err.Error())
	}
	ns := req.Namespace
	if ns == "" {
		ns = pod.Namespace
	}
	if strings.Contains(name, "/") {
		return admission.Denied(fmt.Sprintf("annotation %s: %q names a Workflow in another namespace; a pod can join only a Workflow of its own namespace (%s)", v1alpha1.AnnotationWorkflow, name, ns))
	}
	var wf v1alpha1.Workflow
	key := types.NamespacedName{Namespace: ns, Name: name}
	err = h.Reader.Get(ctx, key, &wf)
	if apierrors.IsNotFound(err) && h.APIReader != nil {
		err = h.APIReader.Get(ctx, key, &wf)
	}
	if err != nil {
		if apierrors.IsNotFound(err) {
			return admission.Denied(fmt.Sprintf("annotation %s: Workflow %s/%s does not exist", v1alpha1.AnnotationWorkflow, ns, name))
		}
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("reading Workflow %s/%s: %w", ns, name, err))
	}
	if !wf.DeletionTimestamp.IsZero() {
		return admission.Denied(fmt.Sprintf("annotation %s: Workflow %s/%s is being deleted", v1alpha1.AnnotationWorkflow, ns, name))
	}
	var step *v1alpha1.Step
	for i := range wf.Spec.Steps {
		if wf.Spec.Steps[i].Name == in.Step {
			step = &wf.Spec.Steps[i]
		}
	}
	if step == nil {
		return admission.Denied(fmt.Sprintf("annotation %s: Workflow %s/%s declares no step %q", v1alpha1.AnnotationStep, ns, name, in.Step))
	}
	if replicas := ptr.Deref(step.Replicas, 1); in.Instance >= int(replicas) {
		return admission.Denied(fmt.Sprintf("annotation %s: instance %d, but step %q has %d replicas (instances 0..%d)", v1alpha1.AnnotationInstance, in.Instance, in.Step, replicas, replicas-1))
	}
	if err := inject.Pod(pod, &wf, in, h.Options); err != nil {
		return admission.Denied(err.Error())
	}
	raw, err := json.Marshal(pod)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	return admission.PatchResponseFromRaw(req.Object.Raw, raw)
}
