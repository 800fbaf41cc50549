package controller

import (
	"context"
	"errors"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluice-io/sluice/api/v1alpha1"
)

// A reconcile compiles a Workflow's rules once per UID and generation: later reconciles
// of the same generation (every pod event causes one) share the rule set, or the
// refusal, without compiling again; a new generation or a Workflow of the same name
// made again compiles anew; a reconcile whose context ended first keeps nothing and
// returns the context's error rather than a refusal of the spec.
func TestRulesAreCompiledOncePerGeneration(t *testing.T) {
	r := &WorkflowReconciler{}
	wf := &v1alpha1.Workflow{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "w", UID: "u1", Generation: 1},
		Spec:       v1alpha1.WorkflowSpec{Steps: []v1alpha1.Step{{Name: "a", Outputs: []v1alpha1.Output{{Path: "out/*"}}}}},
	}
	ctx := context.Background()
	first, errs, err := r.rulesOf(ctx, wf)
	if err != nil || len(errs) > 0 || first == nil {
		t.Fatalf("rulesOf = %v, %v, %v", first, errs, err)
	}
	again, _, _ := r.rulesOf(ctx, wf)
	if again != first {
		t.Error("the same generation was compiled again")
	}
	wf.Generation = 2
	if next, _, _ := r.rulesOf(ctx, wf); next == first {
		t.Error("a new generation kept the old rules")
	}
	wf.UID = "u2"
	if other, _, _ := r.rulesOf(ctx, wf); other == first {
		t.Error("a Workflow made again under the same name kept the old rules")
	}

	bad := wf.DeepCopy()
	bad.Name, bad.Generation = "bad", 1
	bad.Spec.Steps[0].Outputs = append(bad.Spec.Steps[0].Outputs, v1alpha1.Output{Path: "out/x", Commit: v1alpha1.CommitSpec{Rule: v1alpha1.CommitOnClose}})
	_, errs1, _ := r.rulesOf(ctx, bad)
	_, errs2, _ := r.rulesOf(ctx, bad)
	if len(errs1) == 0 || &errs1[0] != &errs2[0] {
		t.Errorf("an invalid spec: errors %v then %v, want one refusal kept", errs1, errs2)
	}

	ended, cancel := context.WithCancel(ctx)
	cancel()
	fresh := wf.DeepCopy()
	fresh.Name = "fresh"
	if _, errs, err := r.rulesOf(ended, fresh); !errors.Is(err, context.Canceled) || len(errs) > 0 {
		t.Errorf("with an ended context: errors %v, error %v; want context.Canceled and no refusal", errs, err)
	}
	if rs, errs, err := r.rulesOf(ctx, fresh); rs == nil || len(errs) > 0 || err != nil {
		t.Errorf("after an ended context, a live one: %v, %v, %v; want the rules", rs, errs, err)
	} else if !strings.Contains(rs.Rules()[0].String(), "out/*") {
		t.Errorf("rules %v", rs.Rules())
	}
}
