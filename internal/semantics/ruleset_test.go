package semantics

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"

	"github.com/sluice-io/sluice/api/v1alpha1"
)

func TestCompileRejects(t *testing.T) {
	for _, tc := range []struct {
		name, spec string
		want       string // the whole aggregated error text must contain this
	}{
		{"overlapping globs with different rules", `
steps:
- name: a
  outputs: [{path: "*.dat", commit: {rule: OnClose}}]
- name: b
  outputs: [{path: "file_*", fire: NoUpdate}]`,
			`spec.steps[1].outputs[0].path: Invalid value: "file_*": overlaps "*.dat" declared at spec.steps[0].outputs[0]: both can match the same path with different rules`},
		{"same path, two rules", `
steps:
- name: a
  outputs: [{path: f, commit: {rule: OnClose}}]
- name: b
  outputs: [{path: f}]`,
			`spec.steps[1].outputs[0]: Invalid value: "f": conflicts with spec.steps[0].outputs[0]: the same path "f" is declared with another rule`},
		{"OnFile cycle", `
steps:
- name: a
  outputs:
  - {path: x, commit: {rule: OnFile, files: [x2]}}
  - {path: x2, commit: {rule: OnFile, files: [x3]}}
  - {path: x3, commit: {rule: OnFile, files: [x]}}`,
			`OnFile dependency cycle: x -> x2 -> x3 -> x`},
		{"steps that wait on each other's termination", `
steps:
- name: a
  inputs: [b.txt]
  outputs: [{path: a.txt}]
- name: b
  inputs: [a.txt]
  outputs: [{path: b.txt}]`,
			`steps wait on each other for ever: step a reads "b.txt" of step b, which reads "a.txt" of step a`},
		{"a three-step wait cycle through a glob", `
steps:
- name: a
  inputs: ["c/*"]
  outputs: [{path: a.txt}]
- name: b
  inputs: [a.txt]
  outputs: [{path: "b/*", commit: {rule: OnTermination}}]
- name: c
  inputs: [b/x]
  outputs: [{path: "c/*"}]`,
			`step a reads "c/*" of step c, which reads "b/*" of step b, which reads "a.txt" of step a`},
		{"OnFile self cycle", `
steps:
- name: a
  outputs: [{path: x, commit: {rule: OnFile, files: [x]}}]`,
			`OnFile dependency cycle: x -> x`},
		{"OnFile undeclared", `
steps:
- name: a
  outputs: [{path: x, commit: {rule: OnFile, files: [nowhere]}}]`,
			`spec.steps[0].outputs[0].commit.files: Invalid value: "nowhere": OnFile dependency "nowhere" is not declared by any output`},
		{"OnFile glob", `
steps:
- name: a
  outputs: [{path: x, commit: {rule: OnFile, files: ["x*"]}}, {path: x1}]`,
			`spec.steps[0].outputs[0].commit.files[0]: Invalid value: "x*": an OnFile dependency must name a file or directory, not a glob`},
		{"OnNFiles on a file", `
steps:
- name: a
  outputs: [{path: x, commit: {rule: OnNFiles, count: 2}}]`,
			`spec.steps[0].outputs[0].commit.rule: Invalid value: "OnNFiles": OnNFiles applies only to type Directory`},
		{"OnNFiles without count", `
steps:
- name: a
  outputs: [{path: x, type: Directory, commit: {rule: OnNFiles}}]`,
			`spec.steps[0].outputs[0].commit.count: Required value: OnNFiles needs the number of files`},
		{"OnFile without files", `
steps:
- name: a
  outputs: [{path: x, commit: {rule: OnFile}}]`,
			`spec.steps[0].outputs[0].commit.files: Required value: OnFile needs at least one file`},
		{"count zero", `
steps:
- name: a
  outputs: [{path: x, commit: {rule: OnClose, count: 0}}]`,
			`spec.steps[0].outputs[0].commit.count: Invalid value: 0: must be at least 1`},
		{"OnTermination count above instances", `
steps:
- name: a
  replicas: 2
  outputs: [{path: x, commit: {rule: OnTermination, count: 3}}]`,
			`spec.steps[0].outputs[0].commit.count: Invalid value: 3: OnTermination waits for 3 instances but the producers of "x" have 2`},
		{"dot-dot", `
steps:
- name: a
  outputs: [{path: ../etc/passwd}]`,
			`spec.steps[0].outputs[0].path: Invalid value: "../etc/passwd": "../etc/passwd": path has a ".." segment`},
		{"bad class", `
steps:
- name: a
  outputs: [{path: "x[a"}]`,
			`malformed [...] class`},
		{"duplicate step", `
steps:
- name: a
- name: a`,
			`spec.steps[1].name: Duplicate value: "a"`},
		{"no steps", `steps: []`, `spec.steps: Required value`},
		{"manual home node on unknown step", `
steps:
- name: a
  outputs: [{path: x}]
homeNode: {policy: Manual, manual: [{files: [x], step: nope}]}`,
			`spec.homeNode.manual[0].step: Not found: "nope"`},
		{"manual home node instance out of range", `
steps:
- name: a
  replicas: 2
  outputs: [{path: x}]
homeNode: {policy: Manual, manual: [{files: [x], step: a, instance: 2}]}`,
			`spec.homeNode.manual[0].instance: Invalid value: 2: step "a" has instances 0..1`},
		{"alias of alias", `
aliases: [{name: g1, files: [a]}, {name: g2, files: [g1]}]
steps:
- name: a`,
			`spec.aliases[1].files[0]: Invalid value: "g1": an alias cannot name another alias`},
		{"Consumed with no consumer", `
steps:
- name: a
  outputs: [{path: "tmp/*", lifetime: Consumed}]
- name: b
  inputs: [other]`,
			`spec.steps[0].outputs[0].lifetime: Invalid value: "Consumed": no step declares "tmp/*" as an input`},
		{"Consumed and permanent", `
permanent: [tmp]
steps:
- name: a
  outputs: [{path: "tmp/*", lifetime: Consumed}]
- name: b
  inputs: ["tmp/*"]`,
			`spec.steps[0].outputs[0].lifetime: Invalid value: "Consumed": "tmp/*" is permanent`},
		{"Consumed directory", `
steps:
- name: a
  outputs: [{path: d, type: Directory, lifetime: Consumed}]
- name: b
  inputs: [d]`,
			`spec.steps[0].outputs[0].lifetime: Invalid value: "Consumed": Consumed applies to files`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs, errs, _ := compileSpec(t, tc.spec)
			if len(errs) == 0 {
				t.Fatalf("Compile accepted it; want error containing %q", tc.want)
			}
			if rs != nil {
				t.Error("Compile returned a rule set together with errors")
			}
			if got := errs.ToAggregate().Error(); !strings.Contains(got, tc.want) {
				t.Errorf("error = %s\nwant it to contain %s", got, tc.want)
			}
		})
	}
}

func TestCompileAccepts(t *testing.T) {
	for _, tc := range []struct{ name, spec string }{
		{"dir rule and dir/file rule", `
steps:
- name: split
  outputs:
  - {path: chunks, type: Directory, commit: {rule: OnNFiles, count: 8}, fire: NoUpdate}
  - {path: "chunks/*", commit: {rule: OnClose}}`},
		{"identical overlapping rules", `
steps:
- name: a
  outputs: [{path: "out/*", commit: {rule: OnClose}}, {path: "out/a", commit: {rule: OnClose}}]`},
		{"several producers of one file", `
steps:
- name: a
  outputs: [{path: log, commit: {rule: OnClose, count: 2}}]
- name: b
  outputs: [{path: log, commit: {rule: OnClose, count: 2}}]`},
		{"OnFile on a directory", `
steps:
- name: a
  outputs:
  - {path: d, type: Directory, commit: {rule: OnNFiles, count: 2}}
  - {path: summary, commit: {rule: OnFile, files: [d]}}`},
		{"a wait cycle that can progress: OnClose and NoUpdate", `
steps:
- name: a
  inputs: [b.txt]
  outputs: [{path: a.txt, commit: {rule: OnClose}}]
- name: b
  inputs: [a.txt]
  outputs: [{path: b.txt}]
- name: c
  inputs: [d.txt]
  outputs: [{path: c.txt, fire: NoUpdate}]
- name: d
  inputs: [c.txt]
  outputs: [{path: d.txt}]`},
		{"a step that reads its own output", `
steps:
- name: a
  inputs: [a.txt]
  outputs: [{path: a.txt}]`},
		{"disjoint classes", `
steps:
- name: a
  outputs: [{path: "part[0-4]", commit: {rule: OnClose}}, {path: "part[5-9]", fire: NoUpdate}]`},
		{"Consumed read through a glob and through its directory", `
steps:
- name: a
  outputs: [{path: "tmp/*", lifetime: Consumed}, {path: "one", lifetime: Consumed}]
- name: b
  inputs: [tmp]
- name: c
  inputs: ["o*"]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, errs, _ := compileSpec(t, tc.spec); len(errs) > 0 {
				t.Fatalf("Compile: %v", errs.ToAggregate())
			}
		})
	}
}

func TestAliasesExpandEverywhere(t *testing.T) {
	rs := compileYAML(t, `
aliases: [{name: results, files: ["res/a.txt", summary]}]
steps:
- name: p
  outputs:
  - {path: results, commit: {rule: OnClose}}
  - {path: final, commit: {rule: OnFile, files: [results]}}
permanent: [results]`)
	for _, p := range []string{"res/a.txt", "summary"} {
		if r := rs.Resolve(p); r.Commit != "OnClose" || !rs.IsPermanent(p) {
			t.Errorf("%s: commit %q permanent %v; want OnClose via the alias, permanent", p, r.Commit, rs.IsPermanent(p))
		}
	}
	if r := rs.Resolve("final"); len(r.Deps) != 2 {
		t.Errorf("final deps = %v, want the alias's two files", r.Deps)
	}
	if rs.IsPermanent("final") {
		t.Error("final is not permanent")
	}
}

func TestCompileDefaults(t *testing.T) {
	rs := compileYAML(t, `
steps:
- name: a
  replicas: 3
  outputs: [{path: x}]
- name: b
  replicas: 2
  outputs: [{path: x}, {path: x2, commit: {rule: OnClose}}]`)
	x := rs.Resolve("x")
	if x.Commit != "OnTermination" || x.Count != 5 || x.Fire != "Update" {
		t.Errorf("x = %s:%d %s; want OnTermination over all 5 producer instances, Update", x.Commit, x.Count, x.Fire)
	}
	if x2 := rs.Resolve("x2"); x2.Count != 1 {
		t.Errorf("x2 OnClose count = %d, want 1", x2.Count)
	}
	if got := x.Rule.Producers; len(got) != 2 || got[0] != "a" || got[1] != "b" {
		t.Errorf("producers of x = %v, want [a b]", got)
	}
}

func TestInputNobodyDeclaresIsAWarning(t *testing.T) {
	_, errs, warns := compileSpec(t, `
steps:
- name: a
  outputs: [{path: "chunks/*", commit: {rule: OnClose}}]
- name: b
  inputs: [chunks/one, external.csv, "chunks/*"]`)
	if len(errs) > 0 {
		t.Fatal(errs.ToAggregate())
	}
	var undeclared []string
	for _, w := range warns {
		if strings.Contains(w, "is not declared by any output") {
			undeclared = append(undeclared, w)
		}
	}
	if len(undeclared) != 1 || !strings.Contains(undeclared[0], `spec.steps[1].inputs[1]: "external.csv" is not declared by any output`) {
		t.Errorf("warnings = %q, want one about external.csv not being declared", warns)
	}
}

func TestResolveOverridesAndNearestDirectory(t *testing.T) {
	rs := compileYAML(t, `
steps:
- name: a
  outputs:
  - {path: d, type: Directory, commit: {rule: OnNFiles, count: 1}}
  - {path: d/sub, type: Directory, fire: NoUpdate}
  - {path: d/special, commit: {rule: OnClose, count: 2}}`)
	if r := rs.Resolve("d/special"); r.Commit != "OnClose" || r.Count != 2 || r.Dir != "" {
		t.Errorf("d/special = %+v, want its own rule", r)
	}
	if r := rs.Resolve("d/sub/x"); r.Dir != "d/sub" || r.Fire != "NoUpdate" {
		t.Errorf("d/sub/x = %+v, want d/sub's rule", r)
	}
	if r := rs.Resolve("d/other"); r.Dir != "d" {
		t.Errorf("d/other = %+v, want d's rule", r)
	}
	if r := rs.Resolve("elsewhere"); r.Governed() {
		t.Errorf("elsewhere is governed by %v", r.Rule)
	}
}

// spec.tiers (CAPIO-CL storage) says which files a node store keeps on disk: those listed
// in tiers.fs, or below a directory listed there, unless tiers.memory pins them.
func TestTiersPlaceFiles(t *testing.T) {
	rs, errs, warns := compileSpec(t, `
tiers: {fs: [big.dat, chunks, "parts/*.bin"], memory: [chunks/hot]}
steps:
- name: p
  outputs: [{path: big.dat}, {path: chunks, type: Directory}, {path: "parts/*"}]`)
	if len(errs) > 0 {
		t.Fatalf("tiers refused: %v", errs.ToAggregate())
	}
	if len(warns) > 0 {
		t.Errorf("warnings: %q", warns)
	}
	for p, want := range map[string]bool{
		"big.dat": true, "chunks/c1": true, "chunks/sub/c2": true, "parts/a.bin": true,
		"chunks/hot": false, "parts/a.txt": false, "other": false, "big.dat.tmp": false,
	} {
		if got := rs.OnDisk(p); got != want {
			t.Errorf("OnDisk(%q) = %v, want %v", p, got, want)
		}
	}
	if !rs.HasDiskTier() {
		t.Error("HasDiskTier() = false with tiers.fs set")
	}
}

// A member of an alias output with an output of its own in the same step takes that
// output's rule; the alias's rule covers the other members. Another step declaring a
// member with a different rule is still a conflict.
func TestMemberRulesRefineTheGroup(t *testing.T) {
	rs := compileYAML(t, `
aliases: [{name: g, files: [a.dat, b.dat]}]
steps:
- name: p
  outputs:
  - {path: g, commit: {rule: OnTermination}}
  - {path: a.dat, commit: {rule: OnClose}, fire: NoUpdate}
- name: c
  inputs: [g]`)
	if r := rs.Resolve("a.dat"); r.Rule == nil || r.Commit != "OnClose" || r.Fire != "NoUpdate" {
		t.Errorf("a.dat resolves to %+v, want its own OnClose NoUpdate", r)
	}
	if r := rs.Resolve("b.dat"); r.Rule == nil || r.Commit != "OnTermination" || r.Fire != "Update" {
		t.Errorf("b.dat resolves to %+v, want the alias's OnTermination", r)
	}
	_, errs, _ := compileSpec(t, `
aliases: [{name: g, files: [a.dat, b.dat]}]
steps:
- name: p
  outputs: [{path: g, commit: {rule: OnTermination}}]
- name: q
  outputs: [{path: a.dat, commit: {rule: OnClose}}]`)
	if len(errs) == 0 {
		t.Error("two steps declaring a.dat with different rules compiled")
	}
}

// manyOverlapping is a two-step spec of 2n outputs in which every output of one step
// overlaps every output of the other with another rule: n² refusals to find.
func manyOverlapping(n int) string {
	var b strings.Builder
	b.WriteString("steps:\n- name: a\n  outputs:\n")
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "  - {path: \"*%d\", fire: NoUpdate}\n", i)
	}
	b.WriteString("- name: b\n  outputs:\n")
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "  - {path: \"%d*\", commit: {rule: OnClose}}\n", i)
	}
	return b.String()
}

// Admission bounds what a Workflow costs: a spec of 2,000 mutually overlapping outputs
// (a million overlapping pairs; it took 18.9 s and 1.27 GB) is refused listing the first
// overlaps only, and one of more than MaxOutputPatterns patterns is refused outright.
func TestCompileBoundsItsCost(t *testing.T) {
	_, errs, _ := compileSpec(t, manyOverlapping(1000))
	if len(errs) == 0 || len(errs) > maxOverlapErrors+1 {
		t.Errorf("2,000 overlapping outputs: %d errors, want between 1 and %d", len(errs), maxOverlapErrors+1)
	}
	if last := errs[len(errs)-1].Error(); !strings.Contains(last, "more overlapping patterns, not listed") {
		t.Errorf("last error = %s, want it to say more were not listed", last)
	}
	var b strings.Builder
	b.WriteString("steps:\n- name: a\n  outputs:\n")
	for i := 0; i <= MaxOutputPatterns; i++ {
		fmt.Fprintf(&b, "  - {path: \"f%d\"}\n", i)
	}
	_, errs, _ = compileSpec(t, b.String())
	if got := errs.ToAggregate().Error(); !strings.Contains(got, "Too many") {
		t.Errorf("%d output patterns: %s, want a Too many refusal", MaxOutputPatterns+1, got)
	}
}

// validate explains the listing rule where a step globs files another step makes in a
// plain directory.
func TestGlobInputOfAnotherStepsFilesExplainsListings(t *testing.T) {
	spec := `
steps:
- name: count
  replicas: 3
  outputs: [{path: "counts/*", commit: {rule: OnClose}}]
- name: reduce
  inputs: ["counts/*"]`
	rs, errs, warns := compileSpec(t, spec)
	if len(errs) > 0 || len(warns) > 0 {
		t.Fatalf("errors %v, warnings %q: want none, a glob input is no mistake", errs.ToAggregate(), warns)
	}
	var s v1alpha1.WorkflowSpec
	if err := yaml.UnmarshalStrict([]byte(spec), &s); err != nil {
		t.Fatal(err)
	}
	notes := ListingNotes(&s, rs)
	want := `spec.steps[1].inputs[0]: a listing of "counts" (a glob, ls, find) ends only once step count has exited`
	if !slices.ContainsFunc(notes, func(w string) bool { return strings.HasPrefix(w, want) }) {
		t.Errorf("notes %q, want one starting %q", notes, want)
	}
}

// countdownCtx is a context whose Err turns to Canceled at its n-th call: a compile that
// looks at its context is stopped part way, deterministically.
type countdownCtx struct {
	context.Context
	n int
}

func (c *countdownCtx) Err() error {
	if c.n--; c.n <= 0 {
		return context.Canceled
	}
	return nil
}

// Compile stops when its context ends, even in the middle of a costly comparison, with
// one internal error (not a refusal of the spec) that a caller tells by ctx.Err(); an
// already ended context compiles nothing.
func TestCompileStopsWhenTheContextEnds(t *testing.T) {
	var b strings.Builder
	b.WriteString("steps:\n")
	seg := strings.Repeat("*a", 126) + "*"
	for i := 0; i < 10; i++ {
		fmt.Fprintf(&b, "- name: s%d\n  outputs: [{path: %q}]\n", i, strings.Repeat(seg+"/", 7)+seg[:249]+fmt.Sprintf("[%c]", 0x100+i))
	}
	var s v1alpha1.WorkflowSpec
	if err := yaml.UnmarshalStrict([]byte(b.String()), &s); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{1, 3} {
		ctx := &countdownCtx{Context: context.Background(), n: n}
		rs, errs, _ := Compile(ctx, &s)
		if rs != nil || len(errs) != 1 || errs[0].Type != field.ErrorTypeInternal || !strings.Contains(errs[0].Error(), "context canceled") {
			t.Errorf("context ending at its call %d: rules %v, errors %.300v; want one internal error naming the context", n, rs != nil, errs.ToAggregate())
		}
		if ctx.Err() == nil {
			t.Error("the context did not end")
		}
	}
	if _, errs, _ := Compile(context.Background(), &s); len(errs) != 0 {
		t.Errorf("with a live context: %.300v, want no error", errs.ToAggregate())
	}
}

// Each length limit is refused with an error naming the field, before anything is
// compared: a segment over 255 bytes, a pattern over 4,096, more entries than
// MaxPatterns (aliases expanded), and a comparison over the work budget ("too costly").
func TestCompileLimitsNameTheField(t *testing.T) {
	long := strings.Repeat("a", 256)
	for _, tc := range []struct{ spec, want string }{
		{"steps: [{name: a, outputs: [{path: \"x/" + long + "\"}]}]", `spec.steps[0].outputs[0].path: Invalid value: "x/aaaa`},
		{"steps: [{name: a, inputs: [\"" + strings.Repeat("a/", 2048) + "a\"]}]", "spec.steps[0].inputs[0]: Invalid value"},
	} {
		_, errs, _ := compileSpec(t, tc.spec)
		if got := errs.ToAggregate(); got == nil || !strings.Contains(got.Error(), tc.want) || !strings.Contains(got.Error(), "pattern too long") {
			t.Errorf("got %.300v, want an error starting %q saying the pattern is too long", got, tc.want)
		}
	}
	var b strings.Builder
	b.WriteString("aliases: [{name: g, files: [")
	for i := 0; i < 1024; i++ {
		fmt.Fprintf(&b, "f%d,", i)
	}
	b.WriteString("]}]\nsteps:\n")
	for i := 0; i < 65; i++ {
		fmt.Fprintf(&b, "- name: s%d\n  inputs: [g]\n", i)
	}
	_, errs, _ := compileSpec(t, b.String())
	if got := errs.ToAggregate(); got == nil || !strings.Contains(got.Error(), "spec.steps[63].inputs: Too many: 66560: must have at most 65536") {
		t.Errorf("65 steps reading an alias of 1,024 files: %.300v, want spec.steps[63].inputs: Too many", got)
	}
	b.Reset()
	b.WriteString("steps:\n")
	seg := strings.Repeat("*a", 126) + "*"
	for i := 0; i < 60; i++ {
		fmt.Fprintf(&b, "- name: s%d\n  outputs: [{path: %q}]\n", i, strings.Repeat(seg+"/", 15)+seg[:249]+fmt.Sprintf("[%c]", 0x100+i))
	}
	_, errs, _ = compileSpec(t, b.String())
	if got := errs.ToAggregate(); got == nil || !strings.Contains(got.Error(), "].outputs[0].path: Forbidden: too costly to check") {
		t.Errorf("60 long globs compared in full: %.300v, want a too costly refusal naming an output's path", got)
	}
}
