package controller

import (
	"context"
	"maps"
	"strings"
	"testing"

	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

// A late consumer is placed by where its inputs' bytes are, not by who recorded them: a
// file that committed after its creator's pod ended is recorded by the store server of
// its node or by another running pod (outputs.Copier's home), whose node may hold none of
// it.
func TestInputBytesCountTheNodesHoldingTheBytes(t *testing.T) {
	wf := workflowFrom(t, "ns", strings.Replace(nodeLossYAML, "NAME", "w", 1))
	rules, errs, _ := semantics.Compile(context.Background(), &wf.Spec)
	if len(errs) > 0 {
		t.Fatal(errs.ToAggregate())
	}
	nodeOf := map[string]string{"p-0": "a", "d-0": "c"}
	files := []wfmeta.FileMeta{
		{Path: "v/adopted-by-a-bystander", Size: 1 << 20, Home: "d-0", Holders: []string{"a"}},
		{Path: "v/recorded-by-a-store-server", Size: 1 << 10, Home: "store-b", Holders: []string{"b"}},
		{Path: "v/old-record", Size: 7, Home: "p-0"}, // names no holder: its home's node
		{Path: "s/not-an-input-of-c", Size: 99, Holders: []string{"c"}},
	}
	got := inputBytes(rules, "c", files, nodeOf)
	want := map[string]int64{"a": 1<<20 + 7, "b": 1 << 10}
	if !maps.Equal(got, want) {
		t.Errorf("input bytes of c per node %v, want %v", got, want)
	}
}
