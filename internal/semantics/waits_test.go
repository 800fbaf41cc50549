package semantics

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluice-io/sluice/api/v1alpha1"
)

func TestOpenOfMissingFileBlocksUntilCreated(t *testing.T) {
	e := engineYAML(t, `
steps:
- name: p
  outputs: [{path: f, commit: {rule: OnClose}, fire: NoUpdate}]`)
	if _, err := e.WaitOpen(probe(), "f"); !blocked(err) {
		t.Fatalf("open of a file not created yet: err = %v, want it to block", err)
	}
	done := waitAsync(func() error { _, err := e.WaitOpen(context.Background(), "f"); return err })
	e.Create("f", false)
	if err := mustReturn(t, done, "open"); err != nil {
		t.Fatal(err)
	}
}

func TestWaitsEndWhenProducersExitWithoutCommit(t *testing.T) {
	e := engineYAML(t, `
steps:
- name: p
  outputs:
  - {path: f, commit: {rule: OnClose, count: 3}}
  - {path: never, commit: {rule: OnClose}}`)
	open := waitAsync(func() error { _, err := e.WaitOpen(context.Background(), "f"); return err })
	missing := waitAsync(func() error { _, err := e.WaitOpen(context.Background(), "never"); return err })
	e.Create("f", false)
	e.Close("f")
	e.Terminate("p", 0)
	err := mustReturn(t, open, "open")
	var we *WaitError
	if !errors.As(err, &we) || !errors.Is(err, ErrNeverCommitted) {
		t.Fatalf("open error = %v, want a WaitError wrapping ErrNeverCommitted", err)
	}
	if want := `waiting for commit (closes 1 of 3) of "f" (OnClose:3, Update): every producer exited before its commit rule held`; err.Error() != want {
		t.Errorf("error text = %q\nwant %q", err.Error(), want)
	}
	if err := mustReturn(t, missing, "open of never-created"); !errors.Is(err, ErrNeverCreated) {
		t.Errorf("open of a file nobody created: %v, want ErrNeverCreated", err)
	}
}

func TestWaitDeadlineNamesFileAndRule(t *testing.T) {
	e := engineYAML(t, `
steps:
- name: p
  replicas: 2
  outputs: [{path: out/r.txt}]`)
	ctx, cancel := context.WithDeadline(context.Background(), time.Now())
	defer cancel()
	_, err := e.WaitOpen(ctx, "out/r.txt")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want DeadlineExceeded", err)
	}
	want := `waiting for commit (producer instances exited 0 of 2) of "out/r.txt" (OnTermination:2, Update): context deadline exceeded`
	if err.Error() != want {
		t.Errorf("error text = %q\nwant %q", err.Error(), want)
	}
}

// The stage-in step of spec.sources is a producer like any other: until it exits, a
// consumer's listing of (or lookup in) a plain directory holding staged files waits for
// it. Before, a consumer that started before the stage-in was told at once that "in"
// did not exist.
func TestStageInKeepsListingsPending(t *testing.T) {
	e := engineYAML(t, `
sources:
- {path: in/big.bin, from: "file:///data/big.bin"}
steps:
- name: use
	inputs: [in/big.bin]
	template: {spec: {containers: [{name: c, image: x}]}}
`)
	if got := e.PendingListing("in", "use"); len(got) != 1 || got[0] != v1alpha1.StageInStep {
		t.Fatalf("PendingListing(in) before the stage-in ran = %q, want [%s]", got, v1alpha1.StageInStep)
	}
	e.Terminate(v1alpha1.StageInStep, 0)
	if got := e.PendingListing("in", "use"); len(got) != 0 {
		t.Fatalf("PendingListing(in) after the stage-in exited = %q, want none", got)
	}
}
