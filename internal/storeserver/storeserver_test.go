package storeserver

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/podconfig"
	"github.com/sluice-io/sluice/internal/store"
	"github.com/sluice-io/sluice/internal/testutil"
	"github.com/sluice-io/sluice/internal/transport"
	"github.com/sluice-io/sluice/internal/trust"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

const spec = `
steps:
- name: p
  outputs: [{path: f, commit: {rule: OnClose}}]
- name: c
  inputs: [f]`

// peer starts a transport peer of wf on host, over the node directory dir (data/, state/).
func peer(t *testing.T, url string, wf *v1alpha1.Workflow, name, host, dir string) (*transport.Peer, *store.Store) {
	t.Helper()
	return testutil.Peer(t, &wf.Spec, filepath.Join(dir, "data"), store.Options{}, transport.Config{
		Conn: testutil.Connect(t, url), Names: wfmeta.NamesForWorkflow(wf.Namespace, wf.Name, string(wf.UID)),
		Node: name, Host: host, StateDir: filepath.Join(dir, "state"),
		FetchTimeout: time.Second,
	})
}

// A file written by a pod that has ended is read on another node from the node's store
// server; without the server, the read fails naming the node, never hangs.
func TestStoreServerServesAfterThePodsEnded(t *testing.T) {
	url := testutil.NATS(t)
	wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "wf", UID: "0f1e2d3c-4b5a"}}
	if err := yaml.UnmarshalStrict([]byte(spec), &wf.Spec); err != nil {
		t.Fatal(err)
	}
	nodeA := workflowDir(t, wf)
	prod, st := peer(t, url, wf, "p-0", "node-a", nodeA)
	data := make([]byte, 3<<20+17)
	rand.Read(data)
	if err := prod.Create("f", false); err != nil {
		t.Fatal(err)
	}
	sp, _ := st.Path("f")
	if err := os.WriteFile(sp, data, 0o644); err != nil {
		t.Fatal(err)
	}
	prod.Write("f", 0, int64(len(data)))
	prod.Wrote("f", 0, data)
	prod.Close("f")
	if err := prod.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	dep, err := DepositData(&podconfig.Config{Workflow: wf, NATSURL: url,
		Storage: &podconfig.Storage{Endpoint: "s3.example:9000", Bucket: "b", AccessKey: "ak", SecretKey: "sk"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckDeposit(dep); err != nil {
		t.Fatal(err)
	}
	if err := Deposit(depositOf(nodeA), dep, string(wf.UID)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(depositOf(nodeA), DepositDir, v1alpha1.SecretKeyStorage)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the deposit holds the object storage's credentials (%v)", err)
	}
	prod.Stop() // the pod ended

	reader, rst := peer(t, url, wf, "c-0", "node-b", t.TempDir())
	t.Cleanup(reader.Stop)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, eof, err := reader.WaitRead(ctx, "f", 0, int64(len(data))); err != nil || !eof {
		t.Fatalf("f not complete on node-b: %v", err)
	}
	err = reader.Fetch(ctx, "f", 0, int64(len(data)))
	var fe *transport.FetchError
	if !errors.Is(err, transport.ErrHolderLost) || !errors.As(err, &fe) || fe.Host != "node-a" {
		t.Fatalf("fetch with no peer on node-a: %v; want ErrHolderLost naming node-a", err)
	}

	servers := New(options(t, "node-a", wf))
	t.Cleanup(servers.StopAll)
	if err := servers.Ensure(ctx, nodeA); err != nil {
		t.Fatal(err)
	}
	if err := servers.Ensure(ctx, nodeA); err != nil || len(servers.Running()) != 1 {
		t.Fatalf("a second Ensure: %v, %d servers; want one", err, len(servers.Running()))
	}
	if err := reader.Fetch(ctx, "f", 0, int64(len(data))); err != nil {
		t.Fatalf("fetch from the store server: %v", err)
	}
	rp, _ := rst.Path("f")
	if got, err := os.ReadFile(rp); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("node-b's copy: %d bytes (%v), want the %d written", len(got), err, len(data))
	}
	if got := reader.Counters().BytesReceived; got != int64(len(data)) {
		t.Errorf("node-b received %d bytes, want %d", got, len(data))
	}
	servers.Stop(nodeA)
	if len(servers.Running()) != 0 {
		t.Error("Stop left the server running")
	}
}

// A directory without a deposit has no store server.
func TestNoDepositNoServer(t *testing.T) {
	wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "wf", UID: "0f1e2d3c-4b5a"}}
	servers := New(options(t, "node-a", wf))
	dir := workflowDir(t, wf)
	if err := os.MkdirAll(filepath.Join(dir, "state"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := servers.Ensure(context.Background(), dir); err != nil || len(servers.Running()) != 0 {
		t.Fatalf("Ensure without a deposit: %v, %d servers", err, len(servers.Running()))
	}
}

// workflowDir returns a node directory of wf laid out as the CSI plugin's
// (<store>/<namespace>/<workflow>).
func workflowDir(t *testing.T, wf *v1alpha1.Workflow) string {
	dir := filepath.Join(t.TempDir(), "store", wf.Namespace, wf.Name)
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// depositOf is the plugin's deposit directory of the node directory dir: beside the
// store, out of the pods' reach.
func depositOf(dir string) string {
	return filepath.Join(filepath.Dir(filepath.Dir(filepath.Dir(dir))), "deposits", filepath.Base(filepath.Dir(dir)), filepath.Base(dir))
}

// options are store server options whose API server holds the workflows given.
func options(t *testing.T, node string, wfs ...*v1alpha1.Workflow) Options {
	return Options{
		Node: node, Log: testr.New(t),
		DiskOf:    func(dir string) string { return filepath.Join(dir, "disk") },
		DepositOf: depositOf,
		Workflow: func(_ context.Context, ns, name string) (*v1alpha1.Workflow, error) {
			for _, w := range wfs {
				if w.Namespace == ns && w.Name == name {
					return w.DeepCopy(), nil
				}
			}
			return nil, nil
		},
	}
}

// Attacks on the root-run store server through deposits (issue 32, finding 1): a pod
// that writes a deposit into the workflow's state directory (which it can write), a
// deposit naming another namespace's workflow, or a workflow the API server does not
// have, never starts a store server.
func TestStoreServerTrustsNoPodWrittenDeposit(t *testing.T) {
	url := testutil.NATS(t)
	mine := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-a", Name: "wf", UID: "aaaa"}}
	theirs := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-b", Name: "wf", UID: "bbbb"}}
	for _, w := range []*v1alpha1.Workflow{mine, theirs} {
		if err := yaml.UnmarshalStrict([]byte(spec), &w.Spec); err != nil {
			t.Fatal(err)
		}
	}
	deposit := func(w *v1alpha1.Workflow) map[string][]byte {
		data, err := DepositData(&podconfig.Config{Workflow: w, NATSURL: url})
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	ctx := context.Background()

	// A deposit written where the sidecars (and so any pod running as their user) write.
	dir := workflowDir(t, mine)
	state := filepath.Join(dir, "state")
	if err := os.MkdirAll(filepath.Join(state, DepositDir), 0o755); err != nil {
		t.Fatal(err)
	}
	for k, b := range deposit(theirs) {
		if err := os.WriteFile(filepath.Join(state, DepositDir, k), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	servers := New(options(t, "node-a", mine, theirs))
	t.Cleanup(servers.StopAll)
	err := servers.Ensure(ctx, dir)
	if n := len(servers.Running()); n != 0 {
		t.Fatalf("a deposit written by a pod into state/ started a store server (Ensure: %v)", err)
	}

	// A deposit kept in tenant-a's directory but bound to another workflow's UID (the
	// plugin binds it to the UID of the pod's publication): refused when read.
	if err := Deposit(depositOf(dir), deposit(theirs), string(theirs.UID)); err != nil {
		t.Fatal(err)
	}
	if err := servers.Ensure(ctx, dir); err == nil || len(servers.Running()) != 0 {
		t.Fatalf("a deposit bound to tenant-b/wf's UID in tenant-a's directory: Ensure %v, %d servers", err, len(servers.Running()))
	}

	// A workflow the API does not have (or has with another UID).
	gone := New(options(t, "node-a"))
	t.Cleanup(gone.StopAll)
	if err := Deposit(depositOf(dir), deposit(mine), string(mine.UID)); err != nil {
		t.Fatal(err)
	}
	if err := gone.Ensure(ctx, dir); err == nil || len(gone.Running()) != 0 {
		t.Fatalf("no Workflow in the API: Ensure %v, %d servers", err, len(gone.Running()))
	}
	other := mine.DeepCopy()
	other.UID = "cccc"
	recreated := New(options(t, "node-a", other))
	t.Cleanup(recreated.StopAll)
	if err := recreated.Ensure(ctx, dir); err == nil || len(recreated.Running()) != 0 {
		t.Fatalf("a Workflow with another UID: Ensure %v, %d servers", err, len(recreated.Running()))
	}

	// The legitimate deposit starts the server.
	if err := servers.Ensure(ctx, dir); err != nil || len(servers.Running()) != 1 {
		t.Fatalf("the workflow's own deposit: Ensure %v, %d servers", err, len(servers.Running()))
	}
}

// With TLS on, a sidecar's deposit carries the installation's CA certificate (bounded in
// size like every deposited file) and the store server connects to the TLS-only NATS
// with it; without it the server could not connect.
func TestStoreServerConnectsOverTLSWithTheDepositedCA(t *testing.T) {
	tlsFiles := testutil.IssueServerTLS(t)
	url := testutil.NATSTLS(t, tlsFiles)
	wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "wf", UID: "0f1e2d3c-4b5a"}}
	if err := yaml.UnmarshalStrict([]byte(spec), &wf.Spec); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	dir := workflowDir(t, wf)

	noCA, err := DepositData(&podconfig.Config{Workflow: wf, NATSURL: url})
	if err != nil {
		t.Fatal(err)
	}
	if err := Deposit(depositOf(dir), noCA, string(wf.UID)); err != nil {
		t.Fatal(err)
	}
	untrusting := New(options(t, "node-a", wf))
	t.Cleanup(untrusting.StopAll)
	if err := untrusting.Ensure(ctx, dir); err == nil || len(untrusting.Running()) != 0 {
		t.Fatalf("a deposit without the CA: Ensure %v, %d servers; want the TLS server's certificate refused", err, len(untrusting.Running()))
	}

	huge := &podconfig.Config{Workflow: wf, NATSURL: url, CA: bytes.Repeat(tlsFiles.CA, 1+trust.MaxCA/len(tlsFiles.CA))}
	dep, err := DepositData(huge)
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckDeposit(dep); err == nil {
		t.Errorf("CheckDeposit took a CA of %d bytes", len(huge.CA))
	}

	dep, err = DepositData(&podconfig.Config{Workflow: wf, NATSURL: url, CA: tlsFiles.CA})
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckDeposit(dep); err != nil {
		t.Fatal(err)
	}
	if err := Deposit(depositOf(dir), dep, string(wf.UID)); err != nil {
		t.Fatal(err)
	}
	servers := New(options(t, "node-a", wf))
	t.Cleanup(servers.StopAll)
	if err := servers.Ensure(ctx, dir); err != nil || len(servers.Running()) != 1 {
		t.Fatalf("a deposit with the CA: Ensure %v, %d servers", err, len(servers.Running()))
	}
}
