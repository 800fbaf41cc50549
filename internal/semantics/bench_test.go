package semantics

import (
	"fmt"
	"strings"
	"testing"
)

// BenchmarkWrite measures the hot path of every write through a view: one Write event
// on a NoUpdate file.
func BenchmarkWrite(b *testing.B) {
	e := engineYAML(b, `
steps:
- name: p
  outputs: [{path: "out/*", commit: {rule: OnClose}, fire: NoUpdate}]`)
	e.Create("out/f", false)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		e.Write("out/f", int64(i)<<20, 1<<20)
	}
}

// BenchmarkResolve measures resolving a path to its rule among globs and directories.
func BenchmarkResolve(b *testing.B) {
	rs := compileYAML(b, `
steps:
- name: p
  outputs:
  - {path: chunks, type: Directory, commit: {rule: OnNFiles, count: 8}, fire: NoUpdate}
  - {path: "chunks/*", commit: {rule: OnClose}}
  - {path: "counts/part-[0-9].txt", commit: {rule: OnClose}}
  - {path: result/out.txt, commit: {rule: OnClose}}`)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		rs.Resolve("counts/part-3.txt")
	}
}

// BenchmarkCompileManyOverlapping measures admission of a hostile spec: 2,000 outputs of
// two steps, every pair across the steps overlapping with different rules.
func BenchmarkCompileManyOverlapping(b *testing.B) {
	spec := manyOverlapping(1000)
	for b.Loop() {
		compileSpec(b, spec)
	}
}

// BenchmarkCompileManyDisjoint measures admission of a large legitimate spec: 4,000
// literal and glob outputs that overlap nowhere.
func BenchmarkCompileManyDisjoint(b *testing.B) {
	var s strings.Builder
	s.WriteString("steps:\n- name: a\n  outputs:\n")
	for i := 0; i < 2000; i++ {
		fmt.Fprintf(&s, "  - {path: \"run%d/out.dat\"}\n  - {path: \"run%d/part-*\", commit: {rule: OnClose}}\n", i, i)
	}
	spec := s.String()
	for b.Loop() {
		compileSpec(b, spec)
	}
}
