package semantics_test

import (
	"context"
	"fmt"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/semantics"
)

// Compile turns a Workflow's spec into the rules every path resolves against.
func ExampleCompile() {
	var spec v1alpha1.WorkflowSpec
	_ = yaml.Unmarshal([]byte(`
steps:
- name: split
  outputs:
  - {path: "chunks/*.txt", commit: {rule: OnClose}, fire: NoUpdate}
- name: count
  inputs: ["chunks/*.txt"]
`), &spec)
	rules, errs, _ := semantics.Compile(context.Background(), &spec)
	if len(errs) > 0 {
		fmt.Println(errs.ToAggregate())
		return
	}
	for _, p := range []string{"chunks/0.txt", "notes.md"} {
		r := rules.Resolve(p)
		fmt.Println(p, r.Governed(), r.Commit, r.Fire)
	}
	// Output:
	// chunks/0.txt true OnClose NoUpdate
	// notes.md false
}

// An Engine is one node's file state: events go in (created, written, closed), and waits
// return when the rules allow. Under OnClose and Update a reader's open waits for the
// commit; a read then sees every byte.
func ExampleEngine() {
	var spec v1alpha1.WorkflowSpec
	_ = yaml.Unmarshal([]byte(`
steps:
- name: p
  outputs: [{path: out.txt, commit: {rule: OnClose}}]
- name: c
  inputs: [out.txt]
`), &spec)
	rules, _, _ := semantics.Compile(context.Background(), &spec)
	e := semantics.NewEngine(rules)

	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	opened := make(chan semantics.FileStatus)
	go func() {
		st, _ := e.WaitOpen(ctx, "out.txt") // the consumer's open(2) waits here
		opened <- st
	}()

	_ = e.Create("out.txt", false)
	_ = e.Write("out.txt", 0, 12)
	fmt.Println("may open before close:", e.CanOpen("out.txt"))
	_ = e.Close("out.txt") // the one close OnClose counts: the file commits

	st := <-opened
	fmt.Println("opened, committed:", st.Committed, "size:", st.Size)
	n, eof, _ := e.WaitRead(ctx, "out.txt", st.Generation, 0)
	fmt.Println("readable from 0:", n, "eof:", eof)
	// Output:
	// may open before close: false
	// opened, committed: true size: 12
	// readable from 0: 12 eof: false
}
