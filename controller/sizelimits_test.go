package controller

import (
	"context"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	"github.com/sluice-io/sluice/api/v1alpha1"
)

// A Workflow whose spec.volume asks for a larger memory or disk tier than the
// installation's maximum is refused before it is provisioned: Ready=False with reason
// SizeNotPermitted naming the field, and no configuration Secret (so no sidecar runs for
// it). One within the maxima, or without sizes, is provisioned.
func TestSizeLimitAboveTheInstallationsMaximumIsRefused(t *testing.T) {
	e := startEnv(t, func(r *WorkflowReconciler) {
		r.WorkflowMemoryMax, r.WorkflowDiskMax = 64<<20, 1<<30
	})
	ctx := context.Background()
	ns := e.namespace(t, "tier-sizes")
	wf := func(name, volume string) *v1alpha1.Workflow {
		return workflowFrom(t, ns, fmt.Sprintf(`
kind: Workflow
metadata: {name: %s}
spec:
  volume: %s
  steps:
  - name: a
    outputs: [{path: out.txt}]
`, name, volume))
	}
	refused := map[string]string{
		"memory-too-large": `{sizeLimit: 65Mi}`,
		"disk-too-large":   `{sizeLimit: 64Mi, disk: {sizeLimit: 2Gi}}`,
	}
	accepted := map[string]string{
		"at-the-maximum": `{sizeLimit: 64Mi, disk: {sizeLimit: 1Gi}}`,
		"unsized":        `{}`,
	}
	for _, set := range []map[string]string{refused, accepted} {
		for name, volume := range set {
			if err := e.k8s.Create(ctx, wf(name, volume)); err != nil {
				t.Fatal(err)
			}
		}
	}
	for name := range refused {
		e.expectRefused(t, ns, name, ReasonSizeNotPermitted, "sizeLimit")
	}
	for name := range accepted {
		eventually(t, 20*time.Second, name+": Ready", func() error {
			got, err := e.workflow(ns, name)
			if err != nil {
				return err
			}
			if !meta.IsStatusConditionTrue(got.Status.Conditions, v1alpha1.ConditionReady) {
				return fmt.Errorf("conditions %+v", got.Status.Conditions)
			}
			return nil
		})
	}
}
