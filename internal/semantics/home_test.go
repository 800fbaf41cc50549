package semantics

import (
	"testing"

	"github.com/sluice-io/sluice/api/v1alpha1"
)

// A file's home rule comes from spec.homeNode: a manual entry first, then the hashing and
// create lists, then the default policy; Create when homeNode is absent.
func TestHomeRule(t *testing.T) {
	const steps = `
steps:
- name: p
  replicas: 2
  outputs: [{path: "a/*"}, {path: "b/*"}, {path: "c/*"}, {path: "d/*"}]
`
	for _, tc := range []struct {
		name, homeNode, path string
		want                 HomeRule
	}{
		{"no homeNode", "", "a/x", HomeRule{Policy: v1alpha1.HomeNodeCreate}},
		{"manual entry", "homeNode: {policy: Hashing, manual: [{step: p, instance: 1, files: [\"a/*\"]}]}", "a/x",
			HomeRule{Policy: v1alpha1.HomeNodeManual, Step: "p", Instance: 1}},
		{"manual entry, instance defaults to 0", "homeNode: {manual: [{step: p, files: [\"a/*\"]}]}", "a/x",
			HomeRule{Policy: v1alpha1.HomeNodeManual, Step: "p"}},
		{"hashing list", "homeNode: {hashing: [\"b/*\"]}", "b/x", HomeRule{Policy: v1alpha1.HomeNodeHashing}},
		{"create list under a hashing policy", "homeNode: {policy: Hashing, create: [\"c/*\"]}", "c/x", HomeRule{Policy: v1alpha1.HomeNodeCreate}},
		{"default policy Hashing", "homeNode: {policy: Hashing}", "d/x", HomeRule{Policy: v1alpha1.HomeNodeHashing}},
		{"default policy Create", "homeNode: {policy: Create, hashing: [\"b/*\"]}", "d/x", HomeRule{Policy: v1alpha1.HomeNodeCreate}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs := compileYAML(t, tc.homeNode+steps)
			if got := rs.Home(tc.path); got != tc.want {
				t.Errorf("Home(%q) = %+v, want %+v", tc.path, got, tc.want)
			}
		})
	}
}

// HashNode spreads paths over every node and always gives a path the same node.
func TestHashNodeSpreadsPaths(t *testing.T) {
	seen := map[int]bool{}
	for _, p := range []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l"} {
		n := HashNode(p, 3)
		if n < 0 || n >= 3 || HashNode(p, 3) != n {
			t.Fatalf("HashNode(%q, 3) = %d, not a stable index in [0, 3)", p, n)
		}
		seen[n] = true
	}
	if len(seen) != 3 {
		t.Errorf("12 paths reached nodes %v of 3", seen)
	}
	if HashNode("a", 1) != 0 {
		t.Error("one node: HashNode must be 0")
	}
}
