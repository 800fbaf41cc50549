package natsauth

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"sigs.k8s.io/yaml"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/store"
	"github.com/sluice-io/sluice/internal/testutil"
	"github.com/sluice-io/sluice/internal/transport"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

// startServer runs nats-server in operator mode with the configuration ServerConfig
// writes for quota q, as the deployed server does, its resolver and JetStream in a
// temporary directory.
func startServer(t *testing.T, keys Keys, q Quota) string {
	t.Helper()
	dir := t.TempDir()
	return runServer(t, keys, q, filepath.Join(dir, "jwt"), filepath.Join(dir, "js"), -1).ClientURL()
}

// runServer runs nats-server as startServer does, its resolver in jwtDir and JetStream
// in jsDir, listening on port (-1: any), and shuts it down when t ends.
func runServer(t *testing.T, keys Keys, q Quota, jwtDir, jsDir string, port int) *server.Server {
	t.Helper()
	auth, err := keys.serverAuth(q, jwtDir)
	if err != nil {
		t.Fatal(err)
	}
	return testutil.NATSFromConfig(t, fmt.Sprintf("listen: 127.0.0.1:%d\nmax_payload: 2MB\njetstream: {store_dir: %q}\n%s", port, jsDir, auth))
}

// testConfig is conf, a configuration Bootstrap wrote for the NATS pod (its resolver in
// ResolverDir and JetStream in /data/jetstream, on the pod's data volume), with both in
// a temporary directory of t's instead: nats-server makes the resolver's directory as it
// reads the configuration, and a test writes only under its own directories.
func testConfig(t *testing.T, conf string) string {
	t.Helper()
	const jetstream = "store_dir: /data/jetstream"
	if !strings.Contains(conf, ResolverDir) || !strings.Contains(conf, jetstream) {
		t.Fatalf("the configuration has no resolver in %s or no %s:\n%s", ResolverDir, jetstream, conf)
	}
	dir := t.TempDir()
	return strings.NewReplacer(ResolverDir, filepath.Join(dir, "jwt"),
		jetstream, fmt.Sprintf("store_dir: %q", filepath.Join(dir, "js"))).Replace(conf)
}

func connect(t *testing.T, url string, creds []byte, inbox string, errs chan<- error) *nats.Conn {
	t.Helper()
	f := filepath.Join(t.TempDir(), "user.creds")
	if err := os.WriteFile(f, creds, 0o600); err != nil {
		t.Fatal(err)
	}
	opts := []nats.Option{nats.UserCredentials(f)}
	if inbox != "" {
		opts = append(opts, nats.CustomInboxPrefix(inbox))
	}
	if errs != nil {
		opts = append(opts, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case errs <- err:
			default:
			}
		}))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatalf("connecting with generated credentials: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

const spec = `
steps:
- name: p
  outputs: [{path: f, commit: {rule: OnClose}, fire: NoUpdate}]
- name: c
  inputs: [f]`

// peer starts a transport peer of workflow names alone on host with the workflow's
// credentials, on a stream the controller provisioned.
func peer(t *testing.T, nc *nats.Conn, names wfmeta.Names, host string) (*transport.Peer, *store.Store) {
	t.Helper()
	var s v1alpha1.WorkflowSpec
	if err := yaml.UnmarshalStrict([]byte(spec), &s); err != nil {
		t.Fatal(err)
	}
	n, st := testutil.Peer(t, &s, t.TempDir(), store.Options{}, transport.Config{Conn: nc, Names: names, Node: host, Provisioned: true, Log: testr.New(t)})
	t.Cleanup(n.Stop)
	return n, st
}

// A workflow's credentials run its transport end to end (publish, follow, materialise,
// KV) and reach nothing of another workflow's: not its subjects, stream or bucket, and
// they cannot create or delete streams.
func TestWorkflowCredentialsAreIsolated(t *testing.T) {
	keys, err := GenerateKeys()
	if err != nil {
		t.Fatal(err)
	}
	url := startServer(t, keys, DefaultQuota)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	admin, err := keys.Creds("sluice-controller", nil)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(connect(t, url, admin, "", nil))
	if err != nil {
		t.Fatal(err)
	}
	a := wfmeta.NamesForWorkflow("team-a", "wf", "0f1e2d3c-aaaa")
	b := wfmeta.NamesForWorkflow("team-b", "wf", "99887766-bbbb")
	for _, n := range []wfmeta.Names{a, b} {
		if err := wfmeta.EnsureStream(ctx, js, n, wfmeta.DefaultLimits); err != nil {
			t.Fatal(err)
		}
		if _, err := wfmeta.EnsureBucket(ctx, js, n, wfmeta.DefaultLimits); err != nil {
			t.Fatal(err)
		}
	}

	credsA, err := keys.Creds("wf-a", WorkflowPermissions(a))
	if err != nil {
		t.Fatal(err)
	}
	// Two peers of A on different hosts: where the file's bytes are crosses through the
	// stream, the bytes through the data plane (request/reply under A's credentials).
	p1, st1 := peer(t, connect(t, url, credsA, a.Inbox, nil), a, "node-1")
	p2, st2 := peer(t, connect(t, url, credsA, a.Inbox, nil), a, "node-2")
	data := bytes.Repeat([]byte("sluice "), 200000)
	p1.Create("f", false)
	sp, _ := st1.Path("f")
	if err := os.WriteFile(sp, data, 0o644); err != nil {
		t.Fatal(err)
	}
	p1.Write("f", 0, int64(len(data)))
	p1.Wrote("f", 0, data)
	p1.Close("f")
	if _, err := p2.WaitOpen(ctx, "f"); err != nil {
		t.Fatalf("peer on node-2 never saw f: %v", err)
	}
	if k, eof, err := p2.WaitRead(ctx, "f", 0, int64(len(data))); err != nil || !eof {
		t.Fatalf("peer on node-2: f not complete (%d, %v, %v)", k, eof, err)
	}
	if err := p2.Fetch(ctx, "f", 0, int64(len(data))); err != nil {
		t.Fatalf("fetching f's bytes on node-2: %v", err)
	}
	dp, _ := st2.Path("f")
	if got, err := os.ReadFile(dp); err != nil || !bytes.Equal(got, data) {
		i := 0
		for i < min(len(got), len(data)) && got[i] == data[i] {
			i++
		}
		t.Fatalf("node-2 store holds %d bytes of f (%v), differing from the %d written at byte %d (%q; counters %+v %+v)", len(got), err, len(data), i, got[:16], p1.Counters(), p2.Counters())
	}
	if err := p1.RecordCommit(ctx, wfmeta.FileMeta{Path: "f", Size: int64(len(data))}); err != nil {
		t.Fatalf("recording a commit in the workflow's own bucket: %v", err)
	}
	if err := p1.RecordReads(ctx, "uid-1", wfmeta.Reads{Pod: "p1", Inputs: []string{"f"}}); err != nil {
		t.Fatalf("recording a pod's reads in the workflow's own bucket: %v", err)
	}
	if _, err := p1.RecordStats(ctx, "uid-1", wfmeta.PodStats{Pod: "p1"}); err != nil {
		t.Fatalf("recording a pod's stats in the workflow's own bucket: %v", err)
	}
	// The controller's keys in the workflow's own bucket: a pod cannot write the outcome
	// its sidecar (or another pod's) waits for.
	kvA, err := jsOf(t, connect(t, url, credsA, a.Inbox, nil)).KeyValue(ctx, a.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	shortCtx, cancelShort := context.WithTimeout(ctx, 2*time.Second)
	_, err = kvA.Put(shortCtx, wfmeta.OutcomeKey("uid-1"), []byte(`{"succeeded":true}`))
	cancelShort()
	if err == nil {
		t.Error("workflow A's credentials wrote the controller's outcome key")
	}
	// Nor record a file lost with its node, which ends every fetch of it at once.
	shortCtx, cancelShort = context.WithTimeout(ctx, 2*time.Second)
	_, err = kvA.Put(shortCtx, wfmeta.LostKey("f"), []byte(`{"path":"f","node":"node-1"}`))
	cancelShort()
	if err == nil {
		t.Error("workflow A's credentials wrote the controller's record of a lost file")
	}

	// Now A's credentials against B's names.
	jsA, err := jetstream.New(connect(t, url, credsA, a.Inbox, nil))
	if err != nil {
		t.Fatal(err)
	}
	isDenied := func(what string, err error) {
		t.Helper()
		if err == nil {
			t.Errorf("%s: allowed with workflow A's credentials", what)
		}
	}
	// A request the server refuses gets no reply: each attempt is bounded, and an answer
	// of any kind other than an error would mean it got through.
	short := func() context.Context {
		c, cancel := context.WithTimeout(ctx, 2*time.Second)
		t.Cleanup(cancel)
		return c
	}
	_, err = jsA.Stream(short(), b.Stream)
	isDenied("looking up B's stream", err)
	_, err = jsA.KeyValue(short(), b.Bucket)
	isDenied("opening B's KV bucket", err)
	_, err = jsA.OrderedConsumer(short(), b.Stream, jetstream.OrderedConsumerConfig{})
	isDenied("following B's stream", err)
	_, err = jsA.Publish(short(), b.Events("intruder"), []byte("x"))
	isDenied("publishing on B's subjects", err)
	err = jsA.DeleteStream(short(), a.Stream)
	isDenied("deleting its own stream", err)
	// B's data plane: a node of B answers B's own requests for bytes, never A's.
	credsB, err := keys.Creds("wf-b", WorkflowPermissions(b))
	if err != nil {
		t.Fatal(err)
	}
	ncB := connect(t, url, credsB, b.Inbox, nil)
	if _, err := ncB.Subscribe(b.Serve("node-1"), func(m *nats.Msg) { _ = m.Respond([]byte("bytes")) }); err != nil {
		t.Fatal(err)
	}
	if err := ncB.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := connect(t, url, credsB, b.Inbox, nil).RequestWithContext(short(), b.Serve("node-1"), nil); err != nil {
		t.Fatalf("B asking its own node for bytes: %v", err)
	}
	_, err = connect(t, url, credsA, a.Inbox, nil).RequestWithContext(short(), b.Serve("node-1"), nil)
	isDenied("asking B's node for bytes", err)
	_, err = jsA.CreateStream(short(), jetstream.StreamConfig{Name: "ROGUE", Subjects: []string{"rogue.>"}})
	isDenied("creating a stream", err)

	// A plain subscription to B's subjects is refused by the server (asynchronously).
	errs := make(chan error, 1)
	nc := connect(t, url, credsA, a.Inbox, errs)
	if _, err := nc.SubscribeSync(b.All()); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errs:
		if !errors.Is(err, nats.ErrPermissionViolation) && !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
			t.Errorf("subscribing to B's subjects: %v, want a permissions violation", err)
		}
	case <-ctx.Done():
		t.Error("subscribing to B's subjects was never refused")
	}
	info, err := js.Stream(ctx, b.Stream)
	if err != nil {
		t.Fatal(err)
	}
	if got := info.CachedInfo().State.Msgs; got != 0 {
		t.Errorf("B's stream holds %d messages after A's attempts, want 0", got)
	}
}

func TestValidateNamesTheBadSeed(t *testing.T) {
	keys, err := GenerateKeys()
	if err != nil {
		t.Fatal(err)
	}
	if err := keys.Validate(); err != nil {
		t.Fatal(err)
	}
	bad := keys
	bad.System = keys.Operator
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "system") {
		t.Errorf("an operator seed as the system account: %v, want an error naming system", err)
	}
	bad = keys
	bad.Account = ""
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "account") {
		t.Errorf("an empty account seed: %v, want an error naming account", err)
	}
}

func jsOf(t *testing.T, nc *nats.Conn) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}
