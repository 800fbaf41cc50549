package validation

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/semantics"
)

// maxStoredBytes is what etcd stores of one object by default (--max-request-bytes,
// 1.5 MiB): no Workflow the API server keeps is larger.
const maxStoredBytes = 3 << 19

// worstSpecs are the costliest Workflows the CRD admits that we know of, each under
// maxStoredBytes, one per thing a spec can make Compile do: compare long globs cell by
// cell, compare very many cheap globs, relate very many inputs to the outputs, expand
// aliases, resolve dependencies, search step cycles.
func worstSpecs() map[string]v1alpha1.WorkflowSpec {
	specs := map[string]v1alpha1.WorkflowSpec{}
	// steps spreads outputs over steps of at most 1,024 (the CRD's limit) named prefix0,
	// prefix1, ...
	steps := func(prefix string, outs []v1alpha1.Output) []v1alpha1.Step {
		var ss []v1alpha1.Step
		for i := 0; i < len(outs); i += 1024 {
			ss = append(ss, v1alpha1.Step{Name: fmt.Sprintf("%s%d", prefix, i/1024), Outputs: outs[i:min(i+1024, len(outs))]})
		}
		return ss
	}
	rule := func(i int) v1alpha1.CommitSpec {
		if i%2 == 0 {
			return v1alpha1.CommitSpec{Rule: v1alpha1.CommitOnClose}
		}
		return v1alpha1.CommitSpec{Rule: v1alpha1.CommitOnTermination}
	}

	// The finding: long globs whose every pair must be compared in full, each segment
	// of 253 bytes of stars and literals, the last told apart only by a class at the end.
	seg := strings.Repeat("*a", 126) + "*"
	var long []v1alpha1.Output
	for i := 0; len(long)*4200 < maxStoredBytes-8<<10; i++ {
		last := strings.Repeat("*a", 124) + "*[" + string(rune(0x100+i)) + "]"
		long = append(long, v1alpha1.Output{Path: strings.Repeat(seg+"/", 15) + last, Commit: rule(i)})
	}
	specs["long globs"] = v1alpha1.WorkflowSpec{Steps: steps("a", long)}

	// The issue's own shape, as long as the CRD now lets it be: a class, 253 literal
	// runes, a class.
	var classy []v1alpha1.Output
	for i := 0; len(classy) < semantics.MaxOutputPatterns && len(classy)*280 < maxStoredBytes-8<<10; i++ {
		classy = append(classy, v1alpha1.Output{Path: "[ab]" + strings.Repeat("a", 243) + fmt.Sprintf("%04d", i) + "[ab]", Commit: rule(i)})
	}
	specs["classes"] = v1alpha1.WorkflowSpec{Steps: steps("a", classy)}

	// As many outputs as Compile takes, all globs of one depth: every pair is compared.
	var many []v1alpha1.Output
	for i := 0; i < semantics.MaxOutputPatterns; i++ {
		many = append(many, v1alpha1.Output{Path: fmt.Sprintf("*-%05d.txt", i), Commit: rule(i)})
	}
	specs["many globs"] = v1alpha1.WorkflowSpec{Steps: steps("a", many)}

	// As many glob inputs as Compile takes, against as many glob outputs.
	consumers := steps("p", many)
	for s := 0; s < semantics.MaxPatterns/1024-len(many)/1024-1; s++ {
		var in []string
		for i := 0; i < 1024; i++ {
			in = append(in, fmt.Sprintf("*+%d", i))
		}
		consumers = append(consumers, v1alpha1.Step{Name: fmt.Sprintf("c%d", s), Inputs: in})
	}
	specs["inputs"] = v1alpha1.WorkflowSpec{Steps: consumers}

	// Aliases of 1,024 long files each, used as the inputs of every step.
	var aliases []v1alpha1.Alias
	for a := 0; a < 4; a++ {
		var files []string
		for i := 0; i < 1024; i++ {
			files = append(files, fmt.Sprintf("al%d/%s/%d", a, strings.Repeat("f", 200), i))
		}
		aliases = append(aliases, v1alpha1.Alias{Name: fmt.Sprintf("g%d", a), Files: files})
	}
	var readers []v1alpha1.Step
	for s := 0; s < 128; s++ {
		var in []string
		for i := 0; i < 1024; i++ {
			in = append(in, fmt.Sprintf("g%d", i%4))
		}
		readers = append(readers, v1alpha1.Step{Name: fmt.Sprintf("s%d", s), Inputs: in})
	}
	specs["aliases"] = v1alpha1.WorkflowSpec{Aliases: aliases, Steps: readers}

	// OnFile dependencies, each resolved against every rule before the last one matches.
	var deps []v1alpha1.Output
	for i := 0; i < 60; i++ {
		var files []string
		for j := 0; j < 1000; j++ {
			files = append(files, fmt.Sprintf("dep/a%d/%d.z", i, j))
		}
		deps = append(deps, v1alpha1.Output{Path: fmt.Sprintf("o%d", i), Commit: v1alpha1.CommitSpec{Rule: v1alpha1.CommitOnFile, Files: files}})
	}
	for i := 0; len(deps) < semantics.MaxOutputPatterns-1; i++ {
		deps = append(deps, v1alpha1.Output{Path: fmt.Sprintf("d%d/*/x.y", i), Commit: rule(i)})
	}
	deps = append(deps, v1alpha1.Output{Path: "dep/*/*.z", Commit: rule(0)}) // every dependency's rule, the last one
	specs["dependencies"] = v1alpha1.WorkflowSpec{Steps: steps("a", deps)}

	// Permanent entries through aliases, each compared with every output (is anything
	// in it declared?) until the last one, the only one related.
	var permAliases []v1alpha1.Alias
	var permanent []string
	for a := 0; a < 30; a++ {
		var files []string
		for i := 0; i < 1000; i++ {
			files = append(files, fmt.Sprintf("q%d/%d/x", semantics.MaxOutputPatterns-1, a*1000+i))
		}
		permAliases = append(permAliases, v1alpha1.Alias{Name: fmt.Sprintf("keep%d", a), Files: files})
		permanent = append(permanent, fmt.Sprintf("keep%d", a))
	}
	var unrelated []v1alpha1.Output
	for i := 0; i < semantics.MaxOutputPatterns; i++ {
		unrelated = append(unrelated, v1alpha1.Output{Path: fmt.Sprintf("q%d/*/x", i), Commit: rule(i)})
	}
	specs["permanent"] = v1alpha1.WorkflowSpec{Aliases: permAliases, Permanent: permanent, Steps: steps("a", unrelated)}

	// 128 steps each waiting on every other (OnTermination, Update): the wait graph is
	// complete and its cycles are countless.
	var waiting []v1alpha1.Step
	for s := 0; s < 128; s++ {
		var in []string
		for o := 0; o < 128; o++ {
			if o != s {
				in = append(in, fmt.Sprintf("o%d", o))
			}
		}
		waiting = append(waiting, v1alpha1.Step{Name: fmt.Sprintf("s%d", s), Replicas: ptr.To[int32](1), Inputs: in,
			Outputs: []v1alpha1.Output{{Path: fmt.Sprintf("o%d", s)}}})
	}
	specs["cycles"] = v1alpha1.WorkflowSpec{Steps: waiting}
	return specs
}

// admitted checks that the CRD's schema and CEL rules admit spec, as the API server
// would, and that etcd would store it.
func admitted(t testing.TB, spec v1alpha1.WorkflowSpec) {
	t.Helper()
	wf := v1alpha1.Workflow{Spec: spec}
	wf.SetGroupVersionKind(schema.GroupVersionKind{Group: v1alpha1.GroupVersion.Group, Version: v1alpha1.GroupVersion.Version, Kind: "Workflow"})
	wf.Name = "worst"
	data, err := json.Marshal(&wf)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) > maxStoredBytes {
		t.Fatalf("the spec is %d bytes, more than etcd stores (%d)", len(data), maxStoredBytes)
	}
	var obj map[string]any
	if err := json.Unmarshal(data, &obj); err != nil {
		t.Fatal(err)
	}
	delete(obj["metadata"].(map[string]any), "creationTimestamp")
	delete(obj, "status")
	s, err := workflowSchema()
	if err != nil {
		t.Fatal(err)
	}
	if errs := s.Validate(context.Background(), obj); len(errs) > 0 {
		t.Fatalf("the CRD refuses the spec: %v", errs.ToAggregate())
	}
}

// Admission cost is bounded: each of the costliest specs the CRD admits compiles (or is
// refused, "too costly" naming a field) allocating at most 200 MB; before the overlap
// check kept one row and Compile had a work budget, the long-glob spec allocated an L²
// table per pair (the 60 class-headed outputs: 8.15 s of CPU). The time is
// BenchmarkCompileWorstAdmitted's.
func TestWorstAdmittedSpecIsBounded(t *testing.T) {
	for name, spec := range worstSpecs() {
		t.Run(name, func(t *testing.T) {
			admitted(t, spec)
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			_, errs, _ := semantics.Compile(context.Background(), &spec)
			runtime.ReadMemStats(&after)
			alloc := after.TotalAlloc - before.TotalAlloc
			t.Logf("%d errors, %.1f MB allocated; first: %v", len(errs), float64(alloc)/1e6, first(errs.ToAggregate()))
			if alloc > 200e6 {
				t.Errorf("Compile allocated %.0f MB, want at most 200 MB", float64(alloc)/1e6)
			}
		})
	}
}

func first(err error) string {
	if err == nil {
		return "none"
	}
	s := err.Error()
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}

// BenchmarkCompileWorstAdmitted times Compile on each of worstSpecs: each must take at
// most a second (docs/security.md quotes the figures).
func BenchmarkCompileWorstAdmitted(b *testing.B) {
	for name, spec := range worstSpecs() {
		b.Run(strings.ReplaceAll(name, " ", "-"), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				semantics.Compile(context.Background(), &spec)
			}
		})
	}
}
