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
	"github.com/sluice-io/sluice/internal/published"
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
	if err := published.Record(recordOf(nodeA), string(wf.UID)); err != nil {
		t.Fatal(err)
	}
	prod.Stop() // the pod ended

	reader, rst := peer(t, url, wf, "c-0", "node-b", t.TempDir())
	t.Cleanup(reader.Stop)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, eof, err := reader.WaitRead(ctx, "f", 0, int64(len(data))); err != nil || !eof {
		t.Fatalf("f not complete on node-b: %v", err)
	}
	err := reader.Fetch(ctx, "f", 0, int64(len(data)))
	var fe *transport.FetchError
	if !errors.Is(err, transport.ErrHolderLost) || !errors.As(err, &fe) || fe.Host != "node-a" {
		t.Fatalf("fetch with no peer on node-a: %v; want ErrHolderLost naming node-a", err)
	}

	servers := New(options(t, "node-a", url, wf))
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

// A directory the plugin recorded no publication of has no store server; nor has one
// whose workflow's agent Secret the controller has not made yet (a failure, which the
// plugin's loop tries again after the failures' wait).
func TestNoRecordOrNoAgentSecretNoServer(t *testing.T) {
	wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "wf", UID: "0f1e2d3c-4b5a"}}
	if err := yaml.UnmarshalStrict([]byte(spec), &wf.Spec); err != nil {
		t.Fatal(err)
	}
	url := testutil.NATS(t)
	opts := options(t, "node-a", url, wf)
	servers := New(opts)
	t.Cleanup(servers.StopAll)
	dir := workflowDir(t, wf)
	if err := os.MkdirAll(filepath.Join(dir, "state"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := servers.Ensure(context.Background(), dir); err != nil || len(servers.Running()) != 0 {
		t.Fatalf("Ensure without a record: %v, %d servers", err, len(servers.Running()))
	}
	if err := published.Record(recordOf(dir), string(wf.UID)); err != nil {
		t.Fatal(err)
	}
	// Nor before the first pod's sidecar on the node has joined: that sidecar is the
	// host's materialiser, whose fetches its pod's stats count.
	if err := servers.Ensure(context.Background(), dir); err != nil || len(servers.Running()) != 0 {
		t.Fatalf("Ensure before a sidecar joined: %v, %d servers", err, len(servers.Running()))
	}
	dir = joinedDir(t, wf)
	if err := published.Record(recordOf(dir), string(wf.UID)); err != nil {
		t.Fatal(err)
	}
	withConn := opts.Connection
	opts.Connection = func(context.Context, *v1alpha1.Workflow) (*podconfig.Connection, error) { return nil, nil }
	noSecret := New(opts)
	t.Cleanup(noSecret.StopAll)
	if err := noSecret.Ensure(context.Background(), dir); err == nil || len(noSecret.Running()) != 0 {
		t.Fatalf("Ensure without an agent Secret: %v, %d servers; want none, and an error to wait after", err, len(noSecret.Running()))
	}
	opts.Connection = withConn
	if err := servers.Ensure(context.Background(), dir); err != nil || len(servers.Running()) != 1 {
		t.Fatalf("Ensure with a record and an agent Secret: %v, %d servers; want one", err, len(servers.Running()))
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

// joinedDir is workflowDir where a pod's sidecar has joined the transport: the host's
// materialiser lock in state/, as the first peer of a host makes it
// (transport.HostJoined).
func joinedDir(t *testing.T, wf *v1alpha1.Workflow) string {
	dir := workflowDir(t, wf)
	if err := os.MkdirAll(filepath.Join(dir, "state"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "state", "materialiser.lock"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// recordOf is the plugin's record directory of the node directory dir: beside the
// store, out of the pods' reach.
func recordOf(dir string) string {
	return filepath.Join(filepath.Dir(filepath.Dir(filepath.Dir(dir))), "published", filepath.Base(filepath.Dir(dir)), filepath.Base(dir))
}

// options are store server options whose API server holds the workflows given, each
// with an agent Secret naming the NATS server at url.
func options(t *testing.T, node, url string, wfs ...*v1alpha1.Workflow) Options {
	find := func(ns, name string) *v1alpha1.Workflow {
		for _, w := range wfs {
			if w.Namespace == ns && w.Name == name {
				return w
			}
		}
		return nil
	}
	return Options{
		Node: node, Log: testr.New(t),
		DiskOf:   func(dir string) string { return filepath.Join(dir, "disk") },
		RecordOf: recordOf,
		Workflow: func(_ context.Context, ns, name string) (*v1alpha1.Workflow, error) {
			if w := find(ns, name); w != nil {
				return w.DeepCopy(), nil
			}
			return nil, nil
		},
		Connection: func(_ context.Context, wf *v1alpha1.Workflow) (*podconfig.Connection, error) {
			if w := find(wf.Namespace, wf.Name); w != nil && w.UID == wf.UID {
				return &podconfig.Connection{URL: url}, nil
			}
			return nil, nil
		},
	}
}

// Attacks on the root-run store server (issue 32, finding 1; issue 42): a record in one
// workflow's directory bound to another workflow's UID, or a workflow the API server
// does not have (or has under another UID), never starts a store server. (Records are
// kept where no pod can write: Options.RecordOf, csidriver.Driver.RecordDirOf.)
func TestStoreServerTrustsNoPodWrittenRecord(t *testing.T) {
	url := testutil.NATS(t)
	mine := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-a", Name: "wf", UID: "aaaa"}}
	theirs := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-b", Name: "wf", UID: "bbbb"}}
	for _, w := range []*v1alpha1.Workflow{mine, theirs} {
		if err := yaml.UnmarshalStrict([]byte(spec), &w.Spec); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()

	dir := joinedDir(t, mine)
	servers := New(options(t, "node-a", url, mine, theirs))
	t.Cleanup(servers.StopAll)

	// A record in tenant-a's directory bound to another workflow's UID: refused.
	if err := published.Record(recordOf(dir), string(theirs.UID)); err != nil {
		t.Fatal(err)
	}
	if err := servers.Ensure(ctx, dir); err == nil || len(servers.Running()) != 0 {
		t.Fatalf("a record bound to tenant-b/wf's UID in tenant-a's directory: Ensure %v, %d servers", err, len(servers.Running()))
	}

	// A workflow the API does not have (or has with another UID).
	gone := New(options(t, "node-a", url))
	t.Cleanup(gone.StopAll)
	if err := published.Record(recordOf(dir), string(mine.UID)); err != nil {
		t.Fatal(err)
	}
	if err := gone.Ensure(ctx, dir); err == nil || len(gone.Running()) != 0 {
		t.Fatalf("no Workflow in the API: Ensure %v, %d servers", err, len(gone.Running()))
	}
	other := mine.DeepCopy()
	other.UID = "cccc"
	recreated := New(options(t, "node-a", url, other))
	t.Cleanup(recreated.StopAll)
	if err := recreated.Ensure(ctx, dir); err == nil || len(recreated.Running()) != 0 {
		t.Fatalf("a Workflow with another UID: Ensure %v, %d servers", err, len(recreated.Running()))
	}

	// The plugin's own record starts the server.
	if err := servers.Ensure(ctx, dir); err != nil || len(servers.Running()) != 1 {
		t.Fatalf("the workflow's own record: Ensure %v, %d servers", err, len(servers.Running()))
	}
}

// With TLS on, the agent Secret carries the installation's CA certificate (bounded in
// size like every key of it) and the store server connects to the TLS-only NATS with
// it; without it the server could not connect.
func TestStoreServerConnectsOverTLSWithTheAgentSecretsCA(t *testing.T) {
	tlsFiles := testutil.IssueServerTLS(t)
	url := testutil.NATSTLS(t, tlsFiles)
	wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "wf", UID: "0f1e2d3c-4b5a"}}
	if err := yaml.UnmarshalStrict([]byte(spec), &wf.Spec); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	dir := joinedDir(t, wf)
	if err := published.Record(recordOf(dir), string(wf.UID)); err != nil {
		t.Fatal(err)
	}
	withSecret := func(data map[string][]byte) Options {
		opts := options(t, "node-a", url, wf)
		opts.Connection = func(context.Context, *v1alpha1.Workflow) (*podconfig.Connection, error) {
			return podconfig.ParseConnection(data)
		}
		return opts
	}

	noCA := (&podconfig.Connection{URL: url}).Data()
	untrusting := New(withSecret(noCA))
	t.Cleanup(untrusting.StopAll)
	if err := untrusting.Ensure(ctx, dir); err == nil || len(untrusting.Running()) != 0 {
		t.Fatalf("an agent Secret without the CA: Ensure %v, %d servers; want the TLS server's certificate refused", err, len(untrusting.Running()))
	}

	huge := (&podconfig.Connection{URL: url, CA: bytes.Repeat(tlsFiles.CA, 1+trust.MaxCA/len(tlsFiles.CA))}).Data()
	if _, err := podconfig.ParseConnection(huge); err == nil {
		t.Errorf("ParseConnection took a CA of %d bytes", len(huge[v1alpha1.SecretKeyInstallationCA]))
	}

	servers := New(withSecret((&podconfig.Connection{URL: url, CA: tlsFiles.CA}).Data()))
	t.Cleanup(servers.StopAll)
	if err := servers.Ensure(ctx, dir); err != nil || len(servers.Running()) != 1 {
		t.Fatalf("an agent Secret with the CA: Ensure %v, %d servers", err, len(servers.Running()))
	}
}
