package transport

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/internal/semantics"
)

// Commit rules count events from every node: OnClose:2 with one writer on each of two
// nodes, OnTermination of instances on both.
func TestCommitCountsEventsOfAllNodes(t *testing.T) {
	c := newCluster(t, "", `
steps:
- name: w
  replicas: 2
  outputs:
  - {path: log, commit: {rule: OnClose, count: 2}}
  - {path: term, fire: NoUpdate}
- name: r`, []string{"a", "b"}, 0)
	a, b := c.nodes["a"], c.nodes["b"]
	a.Create("log", false)
	c.write(a, "log", 0, []byte("from a\n"))
	a.Close("log")
	b.Create("log", false)
	c.write(b, "log", 7, []byte("from b\n"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b.Close("log")
	for _, n := range []*Peer{a, b} {
		out, err := readAll(ctx, n, "log")
		if err != nil || string(out) != "from a\nfrom b\n" {
			t.Errorf("node %s read %q, %v", n.cfg.Node, out, err)
		}
	}
	a.Create("term", false)
	c.write(a, "term", 0, []byte("x"))
	a.Terminate("w", 0)
	if _, err := b.WaitOpen(ctx, "term"); err != nil {
		t.Fatal(err)
	}
	b.Terminate("w", 1)
	// WaitDir on a file waits for its commit like any commit wait.
	if _, err := a.WaitDir(ctx, "term"); err != nil {
		t.Fatalf("waiting for term's commit on node a: %v", err)
	}
	out, err := readAll(ctx, a, "term")
	if err != nil || string(out) != "x" {
		t.Errorf("term on node a: %q %v", out, err)
	}
}

// A file poisoned on its writer's node (a write failed there) is poisoned on every node: a
// reader elsewhere that already read part of it gets the reason instead of EOF, the
// writer's later close does not commit it anywhere, and an invalid poison from the wire
// (no reason) is refused.
func TestPoisonCrossesNodes(t *testing.T) {
	c := newCluster(t, "", oneToOne, []string{"a", "b"}, 0)
	a, b := c.nodes["a"], c.nodes["b"]
	a.Create("f", false)
	c.write(a, "f", 0, []byte("first part"))
	read := make(chan error, 1)
	go func() {
		_, err := readAll(context.Background(), b, "f")
		read <- err
	}()
	if err := a.Poison("f", "a write of 4096 bytes at offset 10 failed: node store is full"); err != nil {
		t.Fatal(err)
	}
	a.Close("f")
	select {
	case err := <-read:
		if !errors.Is(err, semantics.ErrPoisoned) || !strings.Contains(err.Error(), "node store is full") {
			t.Fatalf("the reader on node b got %v, want the poison with its reason", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the reader on node b never heard of the poison")
	}
	if a.Status("f").Committed || b.Status("f").Committed {
		t.Error("a poisoned file committed")
	}
	m := Encode("x", &Message{Node: "evil", Kind: KindPoison, Path: "f"})
	if _, err := Decode(m); !errors.Is(err, ErrInvalid) {
		t.Errorf("a poison without a reason decoded: %v", err)
	}
}

// A failed termination (no retries left) crosses the wire with how the instance failed:
// another node's waits on the instance's outputs end, naming it, and its OnTermination
// directory does not commit there.
func TestFailedTerminationEndsWaitsOnEveryNode(t *testing.T) {
	c := newCluster(t, "", `
steps:
- name: p
  outputs: [{path: tree, type: Directory, commit: {rule: OnTermination}}]
- name: c
  inputs: [tree]`, []string{"a", "b"}, 0)
	a, b := c.nodes["a"], c.nodes["b"]
	a.Create("tree", true)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := b.WaitExists(ctx, "tree"); err != nil {
		t.Fatal(err)
	}
	listing := make(chan error, 1)
	go func() { _, err := b.WaitDir(ctx, "tree"); listing <- err }()
	a.TerminateFailed("p", 0, "exit code 2, in attempt 1")
	err := <-listing
	var pf *semantics.ProducerFailedError
	if !errors.As(err, &pf) || pf.Step != "p" || pf.Instance != 0 || pf.Reason != "exit code 2, in attempt 1" {
		t.Fatalf("the listing on node b ended with %v; want the failure of p[0] with its reason", err)
	}
	if a.Status("tree").Committed || b.Status("tree").Committed {
		t.Error("the failed producer's exit committed its directory")
	}
	m, err := Decode(Encode("x", &Message{Node: "a", Kind: KindTerminate, Step: "p", Instance: 1}))
	if err != nil || m.Reason != "" {
		t.Errorf("a successful termination decoded as %+v, %v", m, err)
	}
	long := strings.Repeat("x", MaxReason+1)
	if _, err := Decode(Encode("x", &Message{Node: "a", Kind: KindTerminate, Step: "p", Reason: long})); err != nil {
		t.Errorf("a failed termination with a long reason (cut by Encode): %v", err)
	}
}
