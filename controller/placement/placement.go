// Package placement computes where a step instance's pod should run so that its input
// bytes move through node memory rather than across nodes. It speaks the scheduler's
// language (pod and node affinities, kubernetes.io/hostname topology), so capacity,
// taints and everything else stay the scheduler's business: preferred terms fall back to
// any node with room; required ones keep the pod Pending until the node has room.
//
// The rules, in order (a step's spec.placement: None, Preferred, Required):
//  1. An input that fires NoUpdate is read while it is written: the instance goes to the
//     node of its producer (the producer instance of the same index when both steps have
//     as many instances, else any producer instance). Weight 100; with Required, the
//     first such producer (by name) becomes a requirement.
//  2. Otherwise, when committed input bytes already sit on nodes (a retried instance, a
//     step that starts late), the instance prefers the nodes holding most of them,
//     weighted by their share of the bytes.
//  3. Otherwise the instance prefers the node of its Update producers (weight 50): their
//     files' home node is where they were created.
//  4. Instances of a step with several replicas that no producer pairs spread over nodes
//     (weight 10), so that their reads and compute do not pile onto one node.
//
// Avoid then keeps a pod off nodes the controller took for lost (a required NotIn term).
package placement

import (
	"slices"
	"sort"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/semantics"
)

// HostnameKey is the node label placement uses as topology.
const HostnameKey = "kubernetes.io/hostname"

// Weights of the preferred terms (the scheduler's range is 1..100).
const (
	WeightStreaming = 100
	WeightCommitted = 50
	WeightSpread    = 10
)

// Request is what placement needs to know about one instance.
type Request struct {
	// Workflow is the workflow's name; Rules its compiled spec.
	Workflow string
	Rules    *semantics.RuleSet
	// Step and Instance name the instance; Policy is its step's spec.placement.
	Step     string
	Instance int
	Policy   v1alpha1.PlacementPolicy
	// InputBytes are the bytes of the step's committed inputs per node name, from the
	// workflow's metadata (home nodes); nil or empty when nothing is committed yet.
	InputBytes map[string]int64
}

// Affinity returns the pod affinity of the instance; nil when nothing applies.
func Affinity(req Request) *corev1.Affinity {
	if req.Policy == v1alpha1.PlacementNone || req.Rules == nil {
		return nil
	}
	me, ok := req.Rules.Step(req.Step)
	if !ok {
		return nil
	}
	var streaming, committed []string // producer steps
	seen := map[string]bool{}
	for _, r := range req.Rules.Feeding(req.Step) {
		for _, p := range r.Producers {
			if p == req.Step || seen[p+string(r.Fire)] {
				continue
			}
			seen[p+string(r.Fire)] = true
			if r.Fire == v1alpha1.FireNoUpdate {
				streaming = append(streaming, p)
			} else {
				committed = append(committed, p)
			}
		}
	}
	sort.Strings(streaming)
	sort.Strings(committed)

	aff := &corev1.Affinity{}
	paired := false
	term := func(producer string) corev1.PodAffinityTerm {
		labels := map[string]string{v1alpha1.LabelWorkflow: req.Workflow, v1alpha1.LabelStep: producer}
		if ps, ok := req.Rules.Step(producer); ok && ps.Replicas == me.Replicas && me.Replicas > 1 {
			labels[v1alpha1.LabelInstance] = strconv.Itoa(req.Instance)
			paired = true
		}
		return corev1.PodAffinityTerm{LabelSelector: &metav1.LabelSelector{MatchLabels: labels}, TopologyKey: HostnameKey}
	}
	podAff := &corev1.PodAffinity{}
	for i, p := range streaming {
		t := term(p)
		if i == 0 && req.Policy == v1alpha1.PlacementRequired {
			podAff.RequiredDuringSchedulingIgnoredDuringExecution = append(podAff.RequiredDuringSchedulingIgnoredDuringExecution, t)
			continue
		}
		podAff.PreferredDuringSchedulingIgnoredDuringExecution = append(podAff.PreferredDuringSchedulingIgnoredDuringExecution,
			corev1.WeightedPodAffinityTerm{Weight: WeightStreaming, PodAffinityTerm: t})
	}
	if len(streaming) == 0 {
		if prefs := byBytes(req.InputBytes); len(prefs) > 0 {
			aff.NodeAffinity = &corev1.NodeAffinity{PreferredDuringSchedulingIgnoredDuringExecution: prefs}
		} else {
			for _, p := range committed {
				podAff.PreferredDuringSchedulingIgnoredDuringExecution = append(podAff.PreferredDuringSchedulingIgnoredDuringExecution,
					corev1.WeightedPodAffinityTerm{Weight: WeightCommitted, PodAffinityTerm: term(p)})
			}
		}
	}
	if len(podAff.PreferredDuringSchedulingIgnoredDuringExecution) > 0 || len(podAff.RequiredDuringSchedulingIgnoredDuringExecution) > 0 {
		aff.PodAffinity = podAff
	}
	if me.Replicas > 1 && !paired {
		aff.PodAntiAffinity = &corev1.PodAntiAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{
			Weight: WeightSpread,
			PodAffinityTerm: corev1.PodAffinityTerm{
				LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{v1alpha1.LabelWorkflow: req.Workflow, v1alpha1.LabelStep: req.Step}},
				TopologyKey:   HostnameKey,
			},
		}}}
	}
	if aff.NodeAffinity == nil && aff.PodAffinity == nil && aff.PodAntiAffinity == nil {
		return nil
	}
	return aff
}

// byBytes turns bytes per node into preferred node terms weighted by each node's share
// (1..100), heaviest first; at most 10 nodes.
func byBytes(perNode map[string]int64) []corev1.PreferredSchedulingTerm {
	var total int64
	nodes := make([]string, 0, len(perNode))
	for n, b := range perNode {
		if b > 0 && n != "" {
			total += b
			nodes = append(nodes, n)
		}
	}
	sort.Slice(nodes, func(i, j int) bool {
		if perNode[nodes[i]] != perNode[nodes[j]] {
			return perNode[nodes[i]] > perNode[nodes[j]]
		}
		return nodes[i] < nodes[j]
	})
	if len(nodes) > 10 {
		nodes = nodes[:10]
	}
	var out []corev1.PreferredSchedulingTerm
	for _, n := range nodes {
		w := int32(perNode[n] * 100 / total)
		w = max(w, 1)
		out = append(out, corev1.PreferredSchedulingTerm{Weight: w, Preference: corev1.NodeSelectorTerm{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: HostnameKey, Operator: corev1.NodeSelectorOpIn, Values: []string{n}}},
		}})
	}
	return out
}

// Merge adds the terms of extra to the pod's own affinity (a template's affinity is kept).
func Merge(pod *corev1.PodSpec, extra *corev1.Affinity) {
	if extra == nil {
		return
	}
	if pod.Affinity == nil {
		pod.Affinity = &corev1.Affinity{}
	}
	a := pod.Affinity
	if extra.NodeAffinity != nil {
		if a.NodeAffinity == nil {
			a.NodeAffinity = &corev1.NodeAffinity{}
		}
		a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution = append(a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution, extra.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution...)
	}
	if extra.PodAffinity != nil {
		if a.PodAffinity == nil {
			a.PodAffinity = &corev1.PodAffinity{}
		}
		a.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution = append(a.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution, extra.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution...)
		a.PodAffinity.PreferredDuringSchedulingIgnoredDuringExecution = append(a.PodAffinity.PreferredDuringSchedulingIgnoredDuringExecution, extra.PodAffinity.PreferredDuringSchedulingIgnoredDuringExecution...)
	}
	if extra.PodAntiAffinity != nil {
		if a.PodAntiAffinity == nil {
			a.PodAntiAffinity = &corev1.PodAntiAffinity{}
		}
		a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution = append(a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution, extra.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution...)
	}
}

// Avoid keeps the pod off nodes (lost nodes, whose pods never confirm and whose bytes are
// gone): it adds `kubernetes.io/hostname NotIn nodes` to every node selector term the pod
// requires, or one such term when it requires none. The scheduler ORs the terms, so each
// must exclude the nodes; within a term the expressions are ANDed. Nodes are sorted.
func Avoid(pod *corev1.PodSpec, nodes []string) {
	if len(nodes) == 0 {
		return
	}
	nodes = slices.Sorted(slices.Values(nodes))
	notIn := corev1.NodeSelectorRequirement{Key: HostnameKey, Operator: corev1.NodeSelectorOpNotIn, Values: nodes}
	if pod.Affinity == nil {
		pod.Affinity = &corev1.Affinity{}
	}
	if pod.Affinity.NodeAffinity == nil {
		pod.Affinity.NodeAffinity = &corev1.NodeAffinity{}
	}
	na := pod.Affinity.NodeAffinity
	if na.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		na.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{}
	}
	req := na.RequiredDuringSchedulingIgnoredDuringExecution
	if len(req.NodeSelectorTerms) == 0 {
		req.NodeSelectorTerms = []corev1.NodeSelectorTerm{{}}
	}
	for i := range req.NodeSelectorTerms {
		req.NodeSelectorTerms[i].MatchExpressions = append(req.NodeSelectorTerms[i].MatchExpressions, notIn)
	}
	// A preference for an avoided node would only weigh against the others.
	na.PreferredDuringSchedulingIgnoredDuringExecution = slices.DeleteFunc(na.PreferredDuringSchedulingIgnoredDuringExecution,
		func(t corev1.PreferredSchedulingTerm) bool {
			return slices.ContainsFunc(t.Preference.MatchExpressions, func(e corev1.NodeSelectorRequirement) bool {
				return e.Key == HostnameKey && e.Operator == corev1.NodeSelectorOpIn &&
					slices.ContainsFunc(e.Values, func(v string) bool { return slices.Contains(nodes, v) })
			})
		})
}
