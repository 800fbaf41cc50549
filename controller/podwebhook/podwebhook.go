// Package podwebhook is the mutating admission webhook that gives pods labelled
// sluice.io/inject=true streaming (PodInjector): it checks the pod's sluice.io/*
// annotations or labels against its namespace's Workflow and adds the sidecar, the CSI volumes
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
	"k8s.io/client-go/tools/record"
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
// sluice.io/* annotations or labels (inject.InstanceFromPod), checks that the named
// Workflow exists in the pod's namespace and declares the step instance, and adds the
// sidecar, the volumes and the environment (package inject). Refusals name the
// annotation or label at fault; those for an undeclared step or instance are also
// recorded as Events on the Workflow.
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
	// Recorder, when set, records a Warning Event on the Workflow when a pod that names it
	// is refused for a step or instance it does not declare (ReasonUnknownStep,
	// ReasonUnknownInstance).
	Recorder record.EventRecorder
	// AgentUser, when set, gives the Workflow its user ID (status.agentUser) if it has
	// none yet, before its first pod is injected: the sidecar runs as it
	// (controller.WorkflowReconciler.EnsureAgentUser). Dry runs do not call it.
	AgentUser func(ctx context.Context, wf *v1alpha1.Workflow) error
}

// Reasons of the Events the webhook records on a Workflow.
const (
	// ReasonUnknownStep: a pod named a step the Workflow does not declare, and was refused.
	ReasonUnknownStep = "UnknownStep"
	// ReasonUnknownInstance: a pod named an instance beyond its step's replicas, and was
	// refused.
	ReasonUnknownInstance = "UnknownInstance"
)

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
	name, in, from, err := inject.InstanceFromPod(pod)
	if err != nil {
		return admission.Denied(err.Error())
	}
	ns := req.Namespace
	if ns == "" {
		ns = pod.Namespace
	}
	if strings.Contains(name, "/") {
		return admission.Denied(fmt.Sprintf("%s: %q names a Workflow in another namespace; a pod can join only a Workflow of its own namespace (%s)", from.Workflow, name, ns))
	}
	var wf v1alpha1.Workflow
	key := types.NamespacedName{Namespace: ns, Name: name}
	err = h.Reader.Get(ctx, key, &wf)
	if apierrors.IsNotFound(err) && h.APIReader != nil {
		err = h.APIReader.Get(ctx, key, &wf)
	}
	if err != nil {
		if apierrors.IsNotFound(err) {
			return admission.Denied(fmt.Sprintf("%s: Workflow %s/%s does not exist", from.Workflow, ns, name))
		}
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("reading Workflow %s/%s: %w", ns, name, err))
	}
	if !wf.DeletionTimestamp.IsZero() {
		return admission.Denied(fmt.Sprintf("%s: Workflow %s/%s is being deleted", from.Workflow, ns, name))
	}
	var step *v1alpha1.Step
	var steps []string
	for i := range wf.Spec.Steps {
		steps = append(steps, wf.Spec.Steps[i].Name)
		if wf.Spec.Steps[i].Name == in.Step {
			step = &wf.Spec.Steps[i]
		}
	}
	if step == nil {
		msg := fmt.Sprintf("%s: Workflow %s/%s declares no step %q (its steps: %s)", from.Step, ns, name, in.Step, strings.Join(steps, ", "))
		h.refused(req, &wf, pod, ReasonUnknownStep, msg)
		return admission.Denied(msg)
	}
	if replicas := ptr.Deref(step.Replicas, 1); in.Instance >= int(replicas) {
		msg := fmt.Sprintf("%s: instance %d, but step %q has %d replicas (instances 0..%d)", from.Instance, in.Instance, in.Step, replicas, replicas-1)
		if from.Instance == "" {
			msg = "no instance set, so 0" + msg[len(": instance 0"):]
		}
		h.refused(req, &wf, pod, ReasonUnknownInstance, msg)
		return admission.Denied(msg)
	}
	if h.AgentUser != nil && wf.Status.AgentUser == nil && !ptr.Deref(req.DryRun, false) {
		if err := h.AgentUser(ctx, &wf); err != nil {
			return admission.Errored(http.StatusServiceUnavailable, fmt.Errorf("giving workflow %s/%s a user ID: %w", ns, name, err))
		}
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

// refused records a Warning Event on the Workflow that a pod asking to join it was
// refused: the pod never exists, so without it the refusal is seen only by whatever
// created the pod (an engine's log, a Job's events). Dry runs record nothing.
func (h *PodInjector) refused(req admission.Request, wf *v1alpha1.Workflow, pod *corev1.Pod, reason, msg string) {
	if h.Recorder == nil || ptr.Deref(req.DryRun, false) {
		return
	}
	h.Recorder.Eventf(wf, corev1.EventTypeWarning, reason, "pod %s refused: %s", podDescription(pod), msg)
}

// podDescription names a pod at admission, where it may have only a generateName, and
// what created it (its controller, else its first owner).
func podDescription(pod *corev1.Pod) string {
	name := pod.Name
	if name == "" {
		name = pod.GenerateName + "*"
	}
	owners := pod.OwnerReferences
	for _, o := range owners {
		if ptr.Deref(o.Controller, false) {
			return fmt.Sprintf("%s (of %s %s)", name, o.Kind, o.Name)
		}
	}
	if len(owners) > 0 {
		return fmt.Sprintf("%s (of %s %s)", name, owners[0].Kind, owners[0].Name)
	}
	return name
}
