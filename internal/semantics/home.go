package semantics

import (
	"hash/fnv"

	"github.com/sluice-io/sluice/api/v1alpha1"
)

// HomeRule is how a file's home node is chosen (CAPIO-CL home_node_policies,
// spec.homeNode): the node that holds its bytes for the others to fetch and stores it in
// object storage when it is permanent.
type HomeRule struct {
	// Policy is HomeNodeCreate (the node of the instance that creates the file),
	// HomeNodeHashing (a hash of the path over the nodes, HashNode) or HomeNodeManual (the
	// node of the step instance Step[Instance]).
	Policy v1alpha1.HomeNodePolicy
	// Step and Instance name the step instance whose node is home (HomeNodeManual).
	Step     string
	Instance int
}

// Home returns the home-node rule of the file p: the first spec.homeNode.manual entry
// whose files match p; else Hashing or Create when p is listed under spec.homeNode.hashing
// or .create (hashing first); else spec.homeNode.policy, Create when unset. `sluice run`
// and the sidecar both decide by it.
func (rs *RuleSet) Home(p string) HomeRule {
	hn := rs.homeNode
	if hn == nil {
		return HomeRule{Policy: v1alpha1.HomeNodeCreate}
	}
	for _, m := range hn.Manual {
		if rs.MatchesAny(m.Files, p) {
			inst := 0
			if m.Instance != nil {
				inst = int(*m.Instance)
			}
			return HomeRule{Policy: v1alpha1.HomeNodeManual, Step: m.Step, Instance: inst}
		}
	}
	switch {
	case rs.MatchesAny(hn.Hashing, p):
		return HomeRule{Policy: v1alpha1.HomeNodeHashing}
	case rs.MatchesAny(hn.Create, p):
		return HomeRule{Policy: v1alpha1.HomeNodeCreate}
	case hn.Policy == v1alpha1.HomeNodeHashing:
		return HomeRule{Policy: v1alpha1.HomeNodeHashing}
	}
	return HomeRule{Policy: v1alpha1.HomeNodeCreate}
}

// HashNode returns the index, in [0, nodes), of the home node of p under HomeNodeHashing
// over nodes nodes (FNV-1a of the path; 0 when nodes < 2).
func HashNode(p string, nodes int) int {
	if nodes < 2 {
		return 0
	}
	h := fnv.New32a()
	h.Write([]byte(p))
	return int(h.Sum32() % uint32(nodes))
}
