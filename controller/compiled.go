package controller

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/validation"
)

// compiledRules is what compiling one generation of a Workflow gave.
type compiledRules struct {
	uid        types.UID
	generation int64
	rules      *semantics.RuleSet
	errs       field.ErrorList
}

// rulesOf compiles wf's spec with the reconcile's context, or returns what compiling its
// UID and generation gave before (rule sets are immutable and shared). A spec that does
// not compile is remembered too, so that a costly one is refused once per generation. It
// returns an error, and remembers nothing, when ctx ended before the compile did.
func (r *WorkflowReconciler) rulesOf(ctx context.Context, wf *v1alpha1.Workflow) (*semantics.RuleSet, field.ErrorList, error) {
	key := client.ObjectKeyFromObject(wf)
	r.compiledMu.Lock()
	c, ok := r.compiled[key]
	r.compiledMu.Unlock()
	if ok && c.uid == wf.UID && c.generation == wf.Generation {
		return c.rules, c.errs, nil
	}
	rules, errs, _ := semantics.Compile(ctx, &wf.Spec)
	if err := ctx.Err(); err != nil && len(errs) > 0 {
		return nil, nil, fmt.Errorf("compiling the rules of workflow %s: %w", key, err)
	}
	r.compiledMu.Lock()
	if r.compiled == nil {
		r.compiled = map[types.NamespacedName]compiledRules{}
	}
	r.compiled[key] = compiledRules{uid: wf.UID, generation: wf.Generation, rules: rules, errs: errs}
	r.compiledMu.Unlock()
	return rules, errs, nil
}

// forgetRules drops the compiled rules of a Workflow that is gone or going.
func (r *WorkflowReconciler) forgetRules(key types.NamespacedName) {
	r.compiledMu.Lock()
	delete(r.compiled, key)
	r.compiledMu.Unlock()
}

// templateErrors checks the pod templates of wf as the API server holds them, strictly
// (validation.TemplateErrors): a typed Workflow has dropped a misspelt or mis-cased
// field (`workingdir`, `Command`) that a Pod would refuse, so the controller would
// otherwise make pods without it. Each generation that passed is remembered, so a
// Workflow is read this way once per change of its spec.
func (r *WorkflowReconciler) templateErrors(ctx context.Context, wf *v1alpha1.Workflow) (field.ErrorList, error) {
	if gen, ok := r.templatesChecked.Load(wf.UID); ok && gen.(int64) == wf.Generation {
		return nil, nil
	}
	reader := r.APIReader
	if reader == nil {
		reader = r.Client
	}
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("Workflow"))
	if err := reader.Get(ctx, client.ObjectKeyFromObject(wf), u); err != nil {
		return nil, fmt.Errorf("reading workflow %s/%s to check its pod templates: %w", wf.Namespace, wf.Name, err)
	}
	if u.GetGeneration() != wf.Generation {
		return nil, nil // changed since: the reconcile of the new generation checks it
	}
	errs := validation.TemplateErrors(u.Object)
	if len(errs) == 0 {
		r.templatesChecked.Store(wf.UID, wf.Generation)
	}
	return errs, nil
}
