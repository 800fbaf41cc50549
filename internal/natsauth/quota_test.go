package natsauth

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/nats-io/nats.go/jetstream"
	"sigs.k8s.io/yaml"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/store"
	"github.com/sluice-io/sluice/internal/testutil"
	"github.com/sluice-io/sluice/internal/transport"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

// testQuota and testLimits are small enough to reach in a test: two workflows of 3 MiB
// of stream and 1 MiB of bucket fill the account's 8 MiB.
var (
	testQuota  = Quota{Storage: 8 << 20, Streams: 16}
	testLimits = wfmeta.Limits{StreamBytes: 3 << 20, BucketBytes: 1 << 20, MaxAge: time.Hour}
)

// quotaServer starts a server of new keys bounded by testQuota and returns the keys, its
// URL, a JetStream context of the controller's user and the test's context.
func quotaServer(t *testing.T) (Keys, string, jetstream.JetStream, context.Context) {
	t.Helper()
	keys, err := GenerateKeys()
	if err != nil {
		t.Fatal(err)
	}
	url := startServer(t, keys, testQuota)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	creds, err := keys.Creds("sluice-controller", nil)
	if err != nil {
		t.Fatal(err)
	}
	return keys, url, jsOf(t, connect(t, url, creds, "", nil)), ctx
}

// provision creates the stream and bucket of workflow wf in namespace ns as the
// controller does.
func provision(ctx context.Context, js jetstream.JetStream, ns, wf string) (wfmeta.Names, error) {
	n := wfmeta.NamesForWorkflow(ns, wf, wf+"-uid")
	if err := wfmeta.EnsureStream(ctx, js, n, testLimits); err != nil {
		return n, err
	}
	_, err := wfmeta.EnsureBucket(ctx, js, n, testLimits)
	return n, err
}

// The installation's quota is in the server's configuration and the server enforces it:
// each workflow's stream and bucket carry their MaxBytes (reserved from the account's
// storage), MaxAge, and refuse new messages when full rather than drop recorded ones;
// once the reservations fill the account's storage the next workflow's stream is refused.
func TestAccountQuotaBoundsWorkflowStreams(t *testing.T) {
	_, _, js, ctx := quotaServer(t)

	a, err := provision(ctx, js, "team-a", "wf")
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, a.Stream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	if cfg.MaxBytes != testLimits.StreamBytes || cfg.MaxAge != testLimits.MaxAge || cfg.Discard != jetstream.DiscardNew {
		t.Errorf("workflow stream: max bytes %d, max age %s, discard %s; want %d, %s, DiscardNew",
			cfg.MaxBytes, cfg.MaxAge, cfg.Discard, testLimits.StreamBytes, testLimits.MaxAge)
	}
	kv, err := js.KeyValue(ctx, a.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if bc := st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config; bc.MaxBytes != testLimits.BucketBytes || bc.MaxAge != testLimits.MaxAge || bc.Discard != jetstream.DiscardNew {
		t.Errorf("workflow bucket: max bytes %d, max age %s, discard %s; want %d, %s, DiscardNew",
			bc.MaxBytes, bc.MaxAge, bc.Discard, testLimits.BucketBytes, testLimits.MaxAge)
	}

	if _, err := provision(ctx, js, "team-b", "wf"); err != nil {
		t.Fatalf("a second workflow within the quota: %v", err)
	}
	if _, err := provision(ctx, js, "team-c", "wf"); err == nil {
		t.Error("a third workflow's stream was created beyond the account's 8 MiB")
	} else if !strings.Contains(err.Error(), "insufficient storage") {
		t.Errorf("a third workflow beyond the quota: %v, want the server's insufficient storage", err)
	}
}

const replicatedSpec = `
steps:
- name: p
  outputs: [{path: "*", commit: {rule: OnClose}, replicate: Stream}]
- name: c
  inputs: ["*"]`

// quotaPeer starts a transport peer of workflow names on host, with the workflow's
// credentials, on the stream the controller provisioned.
func quotaPeer(t *testing.T, keys Keys, url string, names wfmeta.Names, host string) *transport.Peer {
	t.Helper()
	var s v1alpha1.WorkflowSpec
	if err := yaml.UnmarshalStrict([]byte(replicatedSpec), &s); err != nil {
		t.Fatal(err)
	}
	creds, err := keys.Creds(host, WorkflowPermissions(names))
	if err != nil {
		t.Fatal(err)
	}
	nc := connect(t, url, creds, names.Inbox, nil)
	n, _ := testutil.Peer(t, &s, t.TempDir(), store.Options{}, transport.Config{Conn: nc, Names: names, Node: host, Provisioned: true, Log: testr.New(t)})
	t.Cleanup(n.Stop)
	return n
}

// write has peer n write data into its file p (its store and its events), without
// closing it.
func write(t *testing.T, n *transport.Peer, p string, data []byte) {
	t.Helper()
	if err := n.Create(p, false); err != nil {
		t.Fatalf("creating %s: %v", p, err)
	}
	for off := 0; off < len(data); off += transport.MaxChunk {
		chunk := data[off:min(off+transport.MaxChunk, len(data))]
		if err := n.Write(p, int64(off), int64(len(chunk))); err != nil {
			t.Fatal(err)
		}
		n.Wrote(p, int64(off), chunk)
	}
}

// A workflow that writes beyond its stream's MaxBytes does not get its file committed:
// the writer's peer learns that the stream refused it (a RefusedError naming the stream,
// the file and the limit, from Sync, which a sidecar's drain reports); the other host
// never takes the file for complete without its bytes, even though the writer closed it
// at once (its close is not sent behind refused bytes; the file ends poisoned there);
// a file still open when the refusal comes is poisoned where it was written (its close
// does not commit it); the writer's next file is poisoned at once, and its instance's termination
// reaches the other host as a failure; and nothing is silently dropped from the stream.
// Another workflow on the same server is unaffected.
func TestWriteBeyondStreamQuotaFailsTheFile(t *testing.T) {
	keys, url, js, ctx := quotaServer(t)
	a, err := provision(ctx, js, "team-a", "wf")
	if err != nil {
		t.Fatal(err)
	}
	b, err := provision(ctx, js, "team-b", "wf")
	if err != nil {
		t.Fatal(err)
	}
	a1, a2, a3 := quotaPeer(t, keys, url, a, "node-1"), quotaPeer(t, keys, url, a, "node-2"), quotaPeer(t, keys, url, a, "node-3")
	b1, b2 := quotaPeer(t, keys, url, b, "node-1"), quotaPeer(t, keys, url, b, "node-2")

	big := bytes.Repeat([]byte("sluice\n"), (5<<20)/7) // 5 MiB through a 3 MiB stream
	write(t, a1, "big", big)
	_ = a1.Close("big") // at once: before the refusal is known
	err = a1.Sync(ctx)
	var re *transport.RefusedError
	if !errors.As(err, &re) {
		t.Fatalf("syncing a writer beyond its stream's quota: %v, want a RefusedError", err)
	}
	if re.Stream != a.Stream || re.Path != "big" || re.Limit != "maximum bytes exceeded" {
		t.Errorf("the refusal names stream %q, file %q, limit %q; want %q, big, maximum bytes exceeded", re.Stream, re.Path, re.Limit, a.Stream)
	}
	// On the other host the file never commits: its wait ends poisoned, not at EOF.
	k, eof, err := a2.WaitRead(ctx, "big", 0, int64(len(big)))
	if eof || !errors.Is(err, semantics.ErrPoisoned) {
		t.Errorf("node-2 reading the refused file: %d bytes, eof %v, %v; want it poisoned", k, eof, err)
	}
	if a2.Status("big").Committed {
		t.Error("node-2 took the refused file for committed")
	}
	if err := a1.Create("next", false); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a1.WaitRead(ctx, "next", 0, 0); !errors.Is(err, semantics.ErrPoisoned) {
		t.Errorf("reading a file created after the refusal, where it was written: %v, want it poisoned", err)
	}

	// A writer whose file is still open when the stream refuses it: no commit anywhere.
	write(t, a3, "open", big[:2<<20])
	if err := a3.Sync(ctx); !errors.As(err, &re) || re.Path != "open" {
		t.Fatalf("syncing a writer with an open file beyond the quota: %v, want a RefusedError naming it", err)
	}
	_ = a3.Close("open")
	if a3.Status("open").Committed {
		t.Error("the open file whose bytes the stream refused committed at its close, where it was written")
	}
	if _, _, err := a3.WaitRead(ctx, "open", 0, 0); !errors.Is(err, semantics.ErrPoisoned) {
		t.Errorf("reading the refused file where it was written: %v, want it poisoned", err)
	}
	if _, _, err := a2.WaitRead(ctx, "open", 0, 0); !errors.Is(err, semantics.ErrPoisoned) {
		t.Errorf("reading the refused open file on node-2: %v, want it poisoned", err)
	}

	// The writer's instance ends: the other host learns it failed, for the refusal, and
	// stops waiting on what it would have made.
	a1.Terminate("p", 0)
	var pf *semantics.ProducerFailedError
	if _, err := a2.WaitOpen(ctx, "never"); !errors.As(err, &pf) || !strings.Contains(pf.Reason, "maximum bytes exceeded") {
		t.Errorf("node-2 waiting on a file of the refused writer's step: %v, want its producer failed for the refusal", err)
	}

	// The stream kept what it had: nothing recorded was dropped to make room.
	s, err := js.Stream(ctx, a.Stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.FirstSeq != 1 || info.State.Bytes > uint64(testLimits.StreamBytes) {
		t.Errorf("workflow A's stream starts at %d and holds %d bytes; want 1 (nothing dropped) and at most %d", info.State.FirstSeq, info.State.Bytes, testLimits.StreamBytes)
	}

	// Workflow B, same server, same account: its file goes through.
	small := bytes.Repeat([]byte("b"), 1<<20)
	write(t, b1, "small", small)
	_ = b1.Close("small")
	if err := b1.Sync(ctx); err != nil {
		t.Fatalf("workflow B publishing within its quota: %v", err)
	}
	if k, eof, err := b2.WaitRead(ctx, "small", 0, int64(len(small))); err != nil || !eof || k != 0 {
		t.Fatalf("workflow B's file on node-2: %d, eof %v, %v; want it complete", k, eof, err)
	}
	if !b2.Status("small").Committed {
		t.Error("workflow B's file did not commit on node-2")
	}
}
