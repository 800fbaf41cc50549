package controller

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/controller/inject"
	"github.com/sluice-io/sluice/controller/placement"
	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

// createPods creates the missing pods of the templated steps and the retries of failed
// instances. A step that reads another templated step's outputs (NoUpdate or Update) is
// created once that step's pods are bound to nodes, so that the scheduler can place it
// next to them (a pod affinity matches only pods that exist); steps that wait for each
// other are created together. Unless its placement is None: then at once. No new pod goes
// to a node of avoid (lost nodes).
func (r *WorkflowReconciler) createPods(ctx context.Context, wf *v1alpha1.Workflow, rules *semantics.RuleSet, inst map[instanceKey][]attempt, files []wfmeta.FileMeta, avoid []string) error {
	templated := map[string]*v1alpha1.Step{}
	for i := range wf.Spec.Steps {
		if s := &wf.Spec.Steps[i]; s.Template != nil {
			templated[s.Name] = s
		}
	}
	bound := func(step string) bool {
		s := templated[step]
		if s == nil {
			return true // created by someone else: nothing to wait for
		}
		for i := 0; i < int(ptr.Deref(s.Replicas, 1)); i++ {
			at := inst[instanceKey{step, i}]
			if len(at) == 0 || at[len(at)-1].pod.Spec.NodeName == "" {
				return false
			}
		}
		return true
	}
	waitsFor := func(s *v1alpha1.Step) []string {
		if s.Placement == v1alpha1.PlacementNone {
			return nil
		}
		var out []string
		for _, rule := range rules.Feeding(s.Name) {
			for _, p := range rule.Producers {
				if p != s.Name && !bound(p) {
					out = append(out, p)
				}
			}
		}
		return out
	}
	nodeOf := peerNodes(inst) // transport peer -> node of its latest scheduled attempt
	for _, n := range avoid {
		for peer, at := range nodeOf {
			if at == n {
				delete(nodeOf, peer) // its bytes there are gone
			}
		}
	}
	var creatable, waiting []*v1alpha1.Step
	for i := range wf.Spec.Steps {
		s := &wf.Spec.Steps[i]
		if s.Template == nil {
			continue
		}
		if len(waitsFor(s)) == 0 {
			creatable = append(creatable, s)
		} else {
			waiting = append(waiting, s)
		}
	}
	if len(creatable) == 0 && len(waiting) > 0 && r.nothingUnbound(inst) {
		creatable = waiting // a cycle of streaming steps: create them together
	}
	for _, s := range creatable {
		for i := 0; i < int(ptr.Deref(s.Replicas, 1)); i++ {
			at := inst[instanceKey{s.Name, i}]
			next := 0
			if len(at) > 0 {
				last := at[len(at)-1]
				done, ok := podDone(last.pod)
				if !done || ok {
					continue
				}
				if last.n >= int(ptr.Deref(s.BackoffLimit, 0)) {
					continue // failed for good; summarise fails the workflow
				}
				next = last.n + 1
				r.Recorder.Eventf(wf, corev1.EventTypeNormal, ReasonRetrying, "step %s instance %d failed (pod %s); retry %d of %d", s.Name, i, last.pod.Name, next, ptr.Deref(s.BackoffLimit, 0))
			}
			pod, err := r.podFor(wf, rules, s, i, next, files, nodeOf)
			if err != nil {
				return err
			}
			placement.Avoid(&pod.Spec, avoid)
			if err := r.Client.Create(ctx, pod); err != nil {
				if apierrors.IsAlreadyExists(err) {
					continue
				}
				return fmt.Errorf("creating pod %s of step %s: %w", pod.Name, s.Name, err)
			}
			ctrl.LoggerFrom(ctx).V(1).Info("created step pod", "pod", klog.KObj(pod), "step", s.Name, "instance", i, "attempt", next)
			if next == 0 && i == 0 {
				r.Recorder.Eventf(wf, corev1.EventTypeNormal, ReasonCreatedPod, "created %d pod(s) of step %s", ptr.Deref(s.Replicas, 1), s.Name)
			}
		}
	}
	return nil
}

func (r *WorkflowReconciler) nothingUnbound(inst map[instanceKey][]attempt) bool {
	for _, at := range inst {
		if p := at[len(at)-1].pod; p.Spec.NodeName == "" && p.DeletionTimestamp.IsZero() {
			if done, _ := podDone(p); !done {
				return false
			}
		}
	}
	return true
}

// PodName is the name of attempt n of instance i of step: <workflow>-<step>-<i>, with
// -r<n> for retries, made a DNS label (step names may hold "_", "." and capitals), and
// shortened with a hash when longer than 63 characters.
func PodName(wf, step string, i, n int) string {
	s := strings.ToLower(wf + "-" + strings.NewReplacer("_", "-", ".", "-").Replace(step) + "-" + strconv.Itoa(i))
	if n > 0 {
		s += "-r" + strconv.Itoa(n)
	}
	if len(s) <= 63 {
		return s
	}
	h := sha256.Sum256([]byte(s))
	return strings.TrimRight(s[:52], "-") + "-" + hex.EncodeToString(h[:])[:10]
}

// podFor builds attempt n of instance i of step s from its template.
func (r *WorkflowReconciler) podFor(wf *v1alpha1.Workflow, rules *semantics.RuleSet, s *v1alpha1.Step, i, n int, files []wfmeta.FileMeta, nodeOf map[string]string) (*corev1.Pod, error) {
	t := s.Template.DeepCopy()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:        PodName(wf.Name, s.Name, i, n),
			Namespace:   wf.Namespace,
			Labels:      t.Labels,
			Annotations: t.Annotations,
		},
		Spec: t.Spec,
	}
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[v1alpha1.AnnotationAttempt] = strconv.Itoa(n)
	delete(pod.Annotations, v1alpha1.AnnotationInjected)
	if pod.Labels != nil {
		delete(pod.Labels, v1alpha1.LabelInject) // the controller injects its own pods
	}
	// Retries are the controller's (backoffLimit): a container restarted in place would
	// replay its writes into the same instance.
	pod.Spec.RestartPolicy = corev1.RestartPolicyNever
	if pod.Spec.TerminationGracePeriodSeconds == nil {
		// After the app exits, the sidecar's drain (outcome, publishing, uploading the
		// permanent outputs it is home for) must end within the grace period, or the
		// kubelet kills it mid-upload.
		pod.Spec.TerminationGracePeriodSeconds = ptr.To(v1alpha1.DrainGracePeriodSeconds)
	}
	if err := inject.Pod(pod, wf, inject.Instance{Step: s.Name, Instance: i}, r.Inject); err != nil {
		return nil, fmt.Errorf("spec.steps[%s].template: %w", s.Name, err)
	}
	placement.Merge(&pod.Spec, placement.Affinity(placement.Request{
		Workflow: wf.Name, Rules: rules, Step: s.Name, Instance: i,
		Policy: cmp.Or(s.Placement, v1alpha1.PlacementPreferred), InputBytes: inputBytes(rules, s.Name, files, nodeOf),
	}))
	if err := controllerutil.SetControllerReference(wf, pod, r.Client.Scheme()); err != nil {
		return nil, err
	}
	return pod, nil
}

// inputBytes sums the committed bytes of step's inputs per node: the nodes a file's
// record says hold its bytes (fileNodes: its holders, else its home peer's node, nodeOf
// mapping peers to their nodes), not the node of whoever recorded it, which for a file
// committed after its creator ended is a store server or another pod.
func inputBytes(rules *semantics.RuleSet, step string, files []wfmeta.FileMeta, nodeOf map[string]string) map[string]int64 {
	si, ok := rules.Step(step)
	if !ok || len(files) == 0 {
		return nil
	}
	out := map[string]int64{}
	for _, f := range files {
		if !rules.MatchesAny(si.Inputs, f.Path) {
			continue
		}
		for _, n := range fileNodes(f, nodeOf) {
			out[n] += f.Size
		}
	}
	return out
}
