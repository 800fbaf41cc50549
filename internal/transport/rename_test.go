package transport

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"
)

// A file written under a name no rule governs and renamed onto a governed one (rsync's
// ".name.XXXXXX", install's temporary) reaches the other nodes whole: the temporary's
// writes never left its node, so the rename is published as the new file written there,
// its bytes served on demand, or carried in the stream when the output is replicated.
func TestRenameFromAnUngovernedTemporaryCrossesNodes(t *testing.T) {
	for _, replicate := range []bool{false, true} {
		t.Run(map[bool]string{false: "fetched", true: "replicated"}[replicate], func(t *testing.T) {
			c := newCluster(t, "", oneToOne, nil, 0)
			c.replicate = replicate
			a, b := c.peer("a", "", "", t.TempDir()), c.peer("b", "", "", t.TempDir())
			data := randomBytes(2<<20 + 77)
			// The temporary: written in a's store only, as a view does for a path no rule
			// governs (no events).
			tmp, _ := a.store.Path(".f.Xy12Ab")
			if err := os.WriteFile(tmp, data, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := a.store.Files(nil).Rename(".f.Xy12Ab", "f", 0); err != nil {
				t.Fatal(err)
			}
			if err := a.Rename(".f.Xy12Ab", "f", int64(len(data))); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			out, err := readAll(ctx, b, "f")
			if err != nil || !bytes.Equal(out, data) {
				t.Fatalf("node b read %d bytes of f (%v), want the %d renamed into place on node a", len(out), err, len(data))
			}
			if st := b.engine.Status("f"); !st.Committed || st.Size != int64(len(data)) {
				t.Errorf("node b: f committed %v, size %d; want committed at %d (OnClose, one close)", st.Committed, st.Size, len(data))
			}
		})
	}
}
