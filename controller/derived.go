package controller

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/pathpattern"
	"github.com/sluice-io/sluice/internal/podconfig"
	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

// A failed Workflow keeps in object storage only results that rest on nothing that failed,
// as a failed `sluice run` keeps them in --out (docs/kubernetes.md, "Only whole results
// succeed"): once none of its pods runs any more (a stopped pod's sidecar may still store
// what it committed), every stored permanent output made by a step that did not succeed,
// that did not deliver a declared output, or that reads (by its declared inputs) what such
// a step makes, directly or through other steps, is removed with the workflow's own
// storage keys and listed in status.removedOutputs with why, with a Warning Event.

// ReasonRemovedOutputs is the Event of permanent outputs a failed workflow removed.
const ReasonRemovedOutputs = "RemovedOutputs"

// failedLineage returns, for each step of failed wf whose results cannot be trusted, why:
// it did not succeed, an output it declares is unmet, or it reads what such a step makes.
func failedLineage(wf *v1alpha1.Workflow, rules *semantics.RuleSet, files []wfmeta.FileMeta) map[string]string {
	bad := map[string]string{}
	for _, s := range wf.Status.Steps {
		if s.Phase != v1alpha1.StepSucceeded {
			bad[s.Name] = fmt.Sprintf("step %s did not succeed (%s)", s.Name, cmp.Or(string(s.Phase), "not run"))
		}
	}
	for _, s := range rules.Steps() {
		if !slices.ContainsFunc(wf.Status.Steps, func(st v1alpha1.StepStatus) bool { return st.Name == s.Name }) {
			bad[s.Name] = fmt.Sprintf("step %s did not run", s.Name)
		}
	}
	for _, u := range unmetOutputs(rules, files) {
		for _, s := range u.Steps {
			if _, ok := bad[s]; !ok {
				bad[s] = fmt.Sprintf("step %s did not deliver %s", s, u.String())
			}
		}
	}
	for changed := true; changed; {
		changed = false
		for _, s := range rules.Steps() {
			if _, ok := bad[s.Name]; ok {
				continue
			}
			for _, rule := range rules.Feeding(s.Name) {
				from := slices.IndexFunc(rule.Producers, func(p string) bool { _, ok := bad[p]; return ok && p != s.Name })
				if from >= 0 {
					p := rule.Producers[from]
					bad[s.Name] = fmt.Sprintf("step %s reads what step %s makes; %s", s.Name, p, bad[p])
					changed = true
					break
				}
			}
		}
	}
	return bad
}

// removalPass bounds one reconcile's removal of a failed workflow's derived outputs
// (removeDerivedOutputs): an object store that does not answer holds a worker no longer,
// and the next pass, 2 s later, goes on.
const removalPass = 20 * time.Second

// removeDerivedOutputs removes, once no pod of the failed workflow wf runs (pods), the
// stored permanent outputs (files, from its KV bucket) that failedLineage says may rest on
// what failed, and records them in status.removedOutputs and status.outputs. It reports
// whether it must look again (a pod still runs, or a removal failed).
func (r *WorkflowReconciler) removeDerivedOutputs(ctx context.Context, wf *v1alpha1.Workflow, rules *semantics.RuleSet, pods []corev1.Pod, files []wfmeta.FileMeta) (bool, error) {
	if wf.Status.Phase != v1alpha1.WorkflowFailed {
		return false, nil
	}
	for i := range pods {
		if done, _ := podDone(&pods[i]); !done {
			return true, nil // its sidecar may still store what it committed
		}
	}
	bad := failedLineage(wf, rules, files)
	removed := map[string]bool{}
	for _, o := range wf.Status.RemovedOutputs {
		removed[o.Path] = true
	}
	type doomed struct{ path, uri, why string }
	var todo []doomed
	for _, f := range files {
		if f.URI == "" || removed[f.Path] {
			continue
		}
		rule := rules.Resolve(f.Path).Rule
		if rule == nil {
			continue
		}
		producers := slices.Sorted(slices.Values(rule.Producers))
		for _, p := range producers {
			if why, ok := bad[p]; ok {
				todo = append(todo, doomed{f.Path, f.URI, fmt.Sprintf("made by step %s: %s", p, why)})
				break
			}
		}
	}
	if len(todo) == 0 {
		return false, nil
	}
	var sec corev1.Secret
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: wf.Namespace, Name: podconfig.SecretName(wf.Name)}, &sec); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil // no configuration, so no keys: nothing was stored with them
		}
		return true, fmt.Errorf("reading the configuration Secret of %s/%s: %w", wf.Namespace, wf.Name, err)
	}
	st, ca, err := podconfig.FromSecret(sec.Data)
	if err != nil || st == nil {
		return false, err
	}
	obj, err := st.Open(ctx, ca)
	if err != nil {
		return true, fmt.Errorf("opening the object storage of %s/%s: %w", wf.Namespace, wf.Name, err)
	}
	var failed []string
	var names []string
	for _, d := range todo {
		if err := obj.Remove(ctx, d.path); err != nil {
			failed = append(failed, fmt.Sprintf("%s: %v", pathpattern.Printable(d.path), err))
			continue
		}
		ctrl.LoggerFrom(ctx).Info("removed a stored permanent output that may rest on what failed", "path", pathpattern.Printable(d.path), "uri", d.uri, "reason", d.why)
		wf.Status.RemovedOutputs = append(wf.Status.RemovedOutputs, v1alpha1.RemovedOutput{Path: d.path, URI: d.uri, Reason: d.why})
		removed[d.path] = true
		names = append(names, fmt.Sprintf("%s (%s)", pathpattern.Printable(d.path), d.why))
	}
	sort.Slice(wf.Status.RemovedOutputs, func(i, j int) bool { return wf.Status.RemovedOutputs[i].Path < wf.Status.RemovedOutputs[j].Path })
	wf.Status.Outputs = slices.DeleteFunc(wf.Status.Outputs, func(o v1alpha1.PermanentOutput) bool { return removed[o.Path] })
	if len(names) > 0 {
		r.Recorder.Event(wf, corev1.EventTypeWarning, ReasonRemovedOutputs,
			"removed from object storage, as they may rest on what failed: "+strings.Join(names, "; "))
	}
	if len(failed) > 0 {
		return true, fmt.Errorf("removing permanent outputs of failed %s/%s: %s", wf.Namespace, wf.Name, strings.Join(failed, "; "))
	}
	return false, nil
}
