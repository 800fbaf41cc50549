package wfnode

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/objstore"
	"github.com/sluice-io/sluice/internal/outputs"
	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/internal/transport"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

const spec = `
steps:
- name: p
  outputs: [{path: out, commit: {rule: OnClose}}]
- name: c
  inputs: [out]
permanent: [out]`

// newNode builds a node of spec over a temporary directory.
func newNode(t *testing.T) *Node {
	t.Helper()
	wf := &v1alpha1.Workflow{}
	if err := yaml.UnmarshalStrict([]byte(spec), &wf.Spec); err != nil {
		t.Fatal(err)
	}
	wf.Name = "wf"
	rules, errs, _ := semantics.Compile(context.Background(), &wf.Spec)
	if len(errs) > 0 {
		t.Fatal(errs.ToAggregate())
	}
	dir := t.TempDir()
	n, err := New(Config{Workflow: wf, Rules: rules, StoreDir: filepath.Join(dir, "data"), DiskDir: filepath.Join(dir, "disk")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Stop)
	return n
}

// A node that never joins reports to its engine, and its copier, registered by Output,
// stores the permanent file it commits.
func TestNodeWithoutPeerStoresItsOutputs(t *testing.T) {
	n := newNode(t)
	if n.Peer != nil || n.Semantics() != n.Engine {
		t.Fatalf("before Join: peer %v, semantics %T; want no peer and the engine", n.Peer, n.Semantics())
	}
	obj, err := objstore.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	n.Output(ctx, outputs.Config{Objects: obj, Log: logr.Discard(), Home: func(string) bool { return true }})
	f, err := n.Store.OpenFile("out", os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("bytes")
	f.Close()
	sem := n.Semantics()
	if err := sem.Create("out", false); err != nil {
		t.Fatal(err)
	}
	if err := sem.Write("out", 0, 5); err != nil {
		t.Fatal(err)
	}
	if err := sem.Close("out"); err != nil {
		t.Fatal(err)
	}
	if err := n.Copier.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	if got := n.Copier.Results(); len(got) != 1 || got[0].Path != "out" || got[0].Size != 5 {
		t.Fatalf("stored %+v, want out (5 bytes)", got)
	}
}

// A node that joined reports to its peer, which Stop stops.
func TestJoinedNodeReportsToItsPeer(t *testing.T) {
	testenv.Integration(t, "an embedded nats-server")
	srv, err := transport.StartEmbedded(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := transport.Connect(srv.URL(), transport.ConnOptions{Name: "wfnode-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	n := newNode(t)
	if err := n.Join(context.Background(), transport.Config{
		Conn: nc, Names: wfmeta.NamesForWorkflow("default", "wf", "run-1"), Node: "node-0", Log: logr.Discard(),
	}); err != nil {
		t.Fatal(err)
	}
	if n.Peer == nil || n.Semantics() != n.Peer {
		t.Fatalf("after Join: peer %v, semantics %T; want the peer", n.Peer, n.Semantics())
	}
}

// The node's bounds (the CSI plugin's, of the workflow's tmpfs and the installation's
// disk maximum) bound the store's tiers when the spec sets none or a larger limit, so
// that the store waits and spills before the kernel refuses a write; a smaller spec
// limit stays.
func TestNodeBoundsTheTiers(t *testing.T) {
	q := func(s string) *resource.Quantity { v := resource.MustParse(s); return &v }
	for _, c := range []struct {
		name                 string
		spec, disk           *resource.Quantity
		node, nodeDisk       int64
		wantLimit, wantDiskL int64
	}{
		{name: "unsized", node: 7 << 20, nodeDisk: 9 << 20, wantLimit: 7 << 20, wantDiskL: 9 << 20},
		{name: "spec above the node's", spec: q("64Mi"), disk: q("1Gi"), node: 7 << 20, nodeDisk: 9 << 20, wantLimit: 7 << 20, wantDiskL: 9 << 20},
		{name: "spec below the node's", spec: q("1Mi"), disk: q("2Mi"), node: 7 << 20, nodeDisk: 9 << 20, wantLimit: 1 << 20, wantDiskL: 2 << 20},
		{name: "no node bounds", spec: q("1Mi"), wantLimit: 1 << 20},
	} {
		t.Run(c.name, func(t *testing.T) {
			wf := &v1alpha1.Workflow{}
			if err := yaml.UnmarshalStrict([]byte(spec), &wf.Spec); err != nil {
				t.Fatal(err)
			}
			wf.Spec.Volume.SizeLimit = c.spec
			wf.Spec.Volume.Disk = &v1alpha1.DiskSpec{SizeLimit: c.disk}
			rules, errs, _ := semantics.Compile(context.Background(), &wf.Spec)
			if len(errs) > 0 {
				t.Fatal(errs.ToAggregate())
			}
			dir := t.TempDir()
			n, err := New(Config{Workflow: wf, Rules: rules, StoreDir: filepath.Join(dir, "data"), DiskDir: filepath.Join(dir, "disk"),
				MemoryLimit: c.node, DiskLimit: c.nodeDisk})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(n.Stop)
			if n.Store.Limit() != c.wantLimit || n.Store.DiskLimit() != c.wantDiskL {
				t.Errorf("memory tier %d, disk tier %d; want %d, %d", n.Store.Limit(), n.Store.DiskLimit(), c.wantLimit, c.wantDiskL)
			}
		})
	}
}
