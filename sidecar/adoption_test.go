package sidecar

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/sluice-io/sluice/internal/storeserver"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

// A file that commits after its creator's pod ended and is not permanent is recorded
// (its size and SHA-256, outputs.Copier) by the store server of the node its bytes are
// on, not by a pod still running on another node: that pod would fetch the whole file to
// hash it, and its node would receive bytes no one there reads.
func TestFilesOfExitedPodsAreRecordedWhereTheirBytesAre(t *testing.T) {
	ctx := context.Background()
	nsrv, _, cfgDir := backends(t, strings.Replace(adoptionYAML, `  permanent: ["sums/*"]`+"\n", "", 1))
	nodeA, nodeB := newTestNode(t, "node-a"), newTestNode(t, "node-b")
	first := nodeA.pod(t, "sum-0", "sum", 0, cfgDir)
	last := nodeB.pod(t, "sum-1", "sum", 1, cfgDir)
	big := make([]byte, 1<<20)
	for i := range big {
		big[i] = byte(i % 251)
	}
	for _, p := range []*testPod{first, last} {
		if err := os.MkdirAll(filepath.Join(p.app, "sums"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(first.app, "sums/0.txt"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := first.sc.Drain(); err != nil {
		t.Fatalf("draining the first pod: %v", err)
	}
	nodeA.serveStore(t, "ns1", "wf", cfgDir)
	if err := os.WriteFile(filepath.Join(last.app, "sums/1.txt"), []byte("42\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := last.sc.Drain(); err != nil {
		t.Fatalf("draining the last pod: %v", err)
	}

	js := jetStreamOf(t, nsrv)
	names := wfmeta.NamesForWorkflow("ns1", "wf", testWorkflowUID)
	homes := map[string]string{}
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		md, err := wfmeta.Metadata(ctx, js, names)
		if err != nil {
			return false, err
		}
		clear(homes)
		for _, f := range md.Files {
			homes[f.Path] = f.Home
		}
		return len(homes) == 2, nil
	})
	if err != nil {
		t.Fatalf("commit records %v: %v", homes, err)
	}
	if want := (map[string]string{"sums/0.txt": storeserver.PeerName("node-a"), "sums/1.txt": "sum-1"}); homes["sums/0.txt"] != want["sums/0.txt"] || homes["sums/1.txt"] != want["sums/1.txt"] {
		t.Errorf("commits recorded with homes %v, want %v", homes, want)
	}
	if n := storedBytes(t, nodeB.d.WorkflowDir("ns1", "wf"), "sums/0.txt"); n != 0 {
		t.Errorf("node-b, where no one reads sums/0.txt, stores %d bytes of it, want none", n)
	}
}

// storedBytes returns the bytes allocated to the files named rel under dir, in any tier.
func storedBytes(t *testing.T, dir, rel string) int64 {
	t.Helper()
	var n int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, "/"+rel) {
			return err
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			return err
		}
		n += st.Blocks * 512
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}
