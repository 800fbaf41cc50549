package sidecar

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

// What the controller needs to find results built from withdrawn bytes: each sidecar
// records the inputs its app opened when it drains, and a withdrawal is recorded after
// the pods that read the file before it. A consumer still running when an input it had
// opened is withdrawn counts its attempt as failed although its app exited 0: no
// termination is recorded, and its reads name the withdrawn input.
func TestSidecarsRecordReadsAndWithdrawals(t *testing.T) {
	ctx := context.Background()
	nsrv, _, cfgDir := backends(t, workflowYAML)
	js := jetStreamOf(t, nsrv)
	names := wfmeta.NamesForWorkflow("ns1", "wf", testWorkflowUID)
	node := newTestNode(t, "node-a")
	awaitOutcome := func(o *Options) { o.OutcomeWait = time.Minute }
	early := node.podMode(t, "consume-1", "consume", 1, cfgDir, v1alpha1.ModeFUSE, awaitOutcome)
	late := node.podMode(t, "consume-0", "consume", 0, cfgDir, v1alpha1.ModeFUSE, awaitOutcome)
	earlyRead, lateRead := early.readAll("stream.bin"), late.readAll("stream.bin")

	prod := node.podMode(t, "produce-0", "produce", 0, cfgDir, v1alpha1.ModeFUSE, awaitOutcome)
	want := []byte("bytes of the attempt that will fail\n")
	if err := os.WriteFile(filepath.Join(prod.app, "stream.bin"), want, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, ch := range []<-chan []byte{earlyRead, lateRead} {
		if got := receive(t, "a consumer", ch); !bytes.Equal(got, want) {
			t.Fatalf("a consumer read %q, want %q", got, want)
		}
	}
	// consume-1 ends before the producer's attempt fails.
	if err := wfmeta.RecordOutcome(ctx, js, names, "uid-consume-1", wfmeta.Outcome{Succeeded: true}); err != nil {
		t.Fatal(err)
	}
	if err := early.sc.Drain(); err != nil {
		t.Fatalf("draining consume-1: %v", err)
	}
	if err := wfmeta.RecordOutcome(ctx, js, names, "uid-produce-0", wfmeta.Outcome{Reason: "container main exited with code 1"}); err != nil {
		t.Fatal(err)
	}
	if err := prod.sc.Drain(); err != nil {
		t.Fatalf("draining the failed producer: %v", err)
	}
	// The withdrawal reaches consume-0's engine over NATS; its observer notes the taint
	// after the engine's change (Quiesce waits for it).
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	engine := late.sc.node.Engine
	for {
		changed := engine.AnyChange()
		if err := engine.Quiesce(wctx); err != nil {
			t.Fatal(err)
		}
		if len(late.sc.taints()) > 0 {
			break
		}
		select {
		case <-changed:
		case <-wctx.Done():
			t.Fatal("consume-0's sidecar never heard that stream.bin, which its app had opened, was withdrawn")
		}
	}
	// consume-0's app exits 0 after the withdrawal.
	if err := wfmeta.RecordOutcome(ctx, js, names, "uid-consume-0", wfmeta.Outcome{Succeeded: true}); err != nil {
		t.Fatal(err)
	}
	if err := late.sc.Drain(); err != nil {
		t.Fatalf("draining consume-0: %v", err)
	}

	md, err := wfmeta.Metadata(ctx, js, names)
	if err != nil {
		t.Fatal(err)
	}
	reads := map[string]wfmeta.Reads{}
	for _, r := range md.Reads {
		reads[r.Pod] = r
	}
	var withdrawn *wfmeta.Withdrawal
	for i, w := range md.Withdrawals {
		if w.Path == "stream.bin" {
			withdrawn = &md.Withdrawals[i]
		}
	}
	if withdrawn == nil {
		t.Fatalf("no withdrawal of stream.bin recorded: %+v", md.Withdrawals)
	}
	e, l := reads["consume-1"], reads["consume-0"]
	if !slices.Equal(e.Inputs, []string{"stream.bin"}) || len(e.Withdrawn) != 0 || e.Revision == 0 || e.Revision >= withdrawn.Revision {
		t.Errorf("consume-1's reads %+v (revision %d), want stream.bin, nothing withdrawn, recorded before the withdrawal (revision %d)", e, e.Revision, withdrawn.Revision)
	}
	if !slices.Equal(l.Inputs, []string{"stream.bin"}) || len(l.Withdrawn) != 1 || l.Withdrawn[0].Path != "stream.bin" {
		t.Errorf("consume-0's reads %+v, want stream.bin opened and withdrawn while it ran", l)
	}
	for _, term := range md.Terminations {
		if term.Step == "consume" && term.Instance == 0 {
			t.Errorf("consume-0's termination recorded, though an input it read was withdrawn while it ran: %+v", term)
		}
	}
}
