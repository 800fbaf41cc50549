package placement

import (
	"context"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"sigs.k8s.io/yaml"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/semantics"
)

const spec = `
steps:
- name: split
  replicas: 4
  outputs: [{path: "chunks/*", commit: {rule: OnClose}, fire: NoUpdate}]
- name: count
  replicas: 4
  inputs: ["chunks/*"]
  outputs: [{path: "counts/*", commit: {rule: OnClose}}]
- name: reduce
  inputs: ["counts/*"]
- name: scan
  replicas: 3
  inputs: ["chunks/*"]
- name: solo
  replicas: 5
`

func rules(t *testing.T) *semantics.RuleSet {
	t.Helper()
	var s v1alpha1.WorkflowSpec
	if err := yaml.UnmarshalStrict([]byte(spec), &s); err != nil {
		t.Fatal(err)
	}
	rs, errs, _ := semantics.Compile(context.Background(), &s)
	if len(errs) > 0 {
		t.Fatal(errs.ToAggregate())
	}
	return rs
}

// A NoUpdate consumer with as many instances as its producer follows its own producer
// instance: preferred, or required with Required.
func TestStreamingConsumerFollowsItsProducerInstance(t *testing.T) {
	rs := rules(t)
	a := Affinity(Request{Workflow: "wc", Rules: rs, Step: "count", Instance: 2, Policy: v1alpha1.PlacementPreferred})
	if a == nil || a.PodAffinity == nil || len(a.PodAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 1 {
		t.Fatalf("affinity %+v", a)
	}
	term := a.PodAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0]
	sel := term.PodAffinityTerm.LabelSelector.MatchLabels
	if term.Weight != WeightStreaming || sel[v1alpha1.LabelStep] != "split" || sel[v1alpha1.LabelInstance] != "2" || sel[v1alpha1.LabelWorkflow] != "wc" {
		t.Errorf("term %+v", term)
	}
	if a.PodAntiAffinity != nil {
		t.Error("paired instances were also spread: the pairing already places them")
	}
	r := Affinity(Request{Workflow: "wc", Rules: rs, Step: "count", Instance: 0, Policy: v1alpha1.PlacementRequired})
	if r == nil || len(r.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution) != 1 || len(r.PodAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 0 {
		t.Errorf("Required: %+v", r)
	}
	if Affinity(Request{Workflow: "wc", Rules: rs, Step: "count", Policy: v1alpha1.PlacementNone}) != nil {
		t.Error("placement None produced an affinity")
	}
}

// An unpaired NoUpdate consumer goes to any producer instance's node and spreads.
func TestUnpairedConsumerSpreads(t *testing.T) {
	a := Affinity(Request{Workflow: "wc", Rules: rules(t), Step: "scan", Instance: 1, Policy: v1alpha1.PlacementPreferred})
	if a == nil || a.PodAffinity == nil || a.PodAntiAffinity == nil {
		t.Fatalf("affinity %+v", a)
	}
	if _, has := a.PodAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm.LabelSelector.MatchLabels[v1alpha1.LabelInstance]; has {
		t.Error("an unpaired consumer was tied to one producer instance")
	}
	if w := a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].Weight; w != WeightSpread {
		t.Errorf("spread weight %d", w)
	}
}

// With committed inputs on nodes, an Update consumer prefers the nodes by their share of
// the bytes; without, its producers' nodes.
func TestCommittedBytesWeighNodes(t *testing.T) {
	rs := rules(t)
	a := Affinity(Request{Workflow: "wc", Rules: rs, Step: "reduce", Policy: v1alpha1.PlacementPreferred,
		InputBytes: map[string]int64{"node-a": 300, "node-b": 700, "node-c": 0}})
	if a == nil || a.NodeAffinity == nil {
		t.Fatalf("affinity %+v", a)
	}
	terms := a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution
	if len(terms) != 2 || terms[0].Preference.MatchExpressions[0].Values[0] != "node-b" || terms[0].Weight != 70 || terms[1].Weight != 30 {
		t.Errorf("node terms %+v", terms)
	}
	b := Affinity(Request{Workflow: "wc", Rules: rs, Step: "reduce", Policy: v1alpha1.PlacementPreferred})
	if b == nil || b.PodAffinity == nil || b.PodAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].Weight != WeightCommitted {
		t.Errorf("without committed bytes: %+v", b)
	}
	if s := Affinity(Request{Workflow: "wc", Rules: rs, Step: "solo", Policy: v1alpha1.PlacementPreferred}); s == nil || s.PodAffinity != nil || s.PodAntiAffinity == nil {
		t.Errorf("a step without inputs: %+v, want spreading only", s)
	}
}

// A retry placed after a node was lost never goes back there: every required term of the
// template excludes the node, and no preference for it is kept.
func TestAvoidExcludesLostNodes(t *testing.T) {
	pod := &corev1.PodSpec{Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{
			{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}}},
			{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"b"}}}},
		}},
		PreferredDuringSchedulingIgnoredDuringExecution: byBytes(map[string]int64{"lost": 90, "alive": 10}),
	}}}
	Avoid(pod, []string{"lost", "gone"})
	na := pod.Affinity.NodeAffinity
	for i, term := range na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		last := term.MatchExpressions[len(term.MatchExpressions)-1]
		if len(term.MatchExpressions) != 2 || last.Key != HostnameKey || last.Operator != corev1.NodeSelectorOpNotIn ||
			!slices.Equal(last.Values, []string{"gone", "lost"}) {
			t.Errorf("required term %d: %+v", i, term)
		}
	}
	if len(na.PreferredDuringSchedulingIgnoredDuringExecution) != 1 || na.PreferredDuringSchedulingIgnoredDuringExecution[0].Preference.MatchExpressions[0].Values[0] != "alive" {
		t.Errorf("preferences %+v", na.PreferredDuringSchedulingIgnoredDuringExecution)
	}

	bare := &corev1.PodSpec{}
	Avoid(bare, []string{"lost"})
	if terms := bare.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms; len(terms) != 1 || terms[0].MatchExpressions[0].Values[0] != "lost" {
		t.Errorf("terms %+v", terms)
	}
	Avoid(bare, nil)
}
