package csidriver

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sluice-io/sluice/api/v1alpha1"
)

// APIRetirement reads Workflows from the API server (through a cache): a workflow is
// retired when it no longer exists, is being deleted, or has condition DataRemoved True;
// it is finished (Finisher) when its Succeeded or Failed condition is True.
type APIRetirement struct {
	// Reader reads Workflows.
	Reader client.Reader
}

// Retired implements Retirement.
func (r APIRetirement) Retired(ctx context.Context, ns, wf string) (bool, error) {
	return r.check(ctx, ns, wf, func(w *v1alpha1.Workflow) bool {
		return !w.DeletionTimestamp.IsZero() || meta.IsStatusConditionTrue(w.Status.Conditions, v1alpha1.ConditionDataRemoved)
	})
}

// Finished implements Finisher.
func (r APIRetirement) Finished(ctx context.Context, ns, wf string) (bool, error) {
	return r.check(ctx, ns, wf, func(w *v1alpha1.Workflow) bool {
		return meta.IsStatusConditionTrue(w.Status.Conditions, v1alpha1.ConditionSucceeded) ||
			meta.IsStatusConditionTrue(w.Status.Conditions, v1alpha1.ConditionFailed)
	})
}

// check reads workflow ns/wf and returns what is says of it; a workflow that no longer
// exists is retired and finished alike.
func (r APIRetirement) check(ctx context.Context, ns, wf string, is func(*v1alpha1.Workflow) bool) (bool, error) {
	var w v1alpha1.Workflow
	err := r.Reader.Get(ctx, types.NamespacedName{Namespace: ns, Name: wf}, &w)
	if apierrors.IsNotFound(err) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading workflow %s/%s: %w", ns, wf, err)
	}
	return is(&w), nil
}
