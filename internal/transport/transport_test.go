package transport

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"sigs.k8s.io/yaml"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/byterange"
	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/store"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

type cluster struct {
	t     *testing.T
	url   string
	names wfmeta.Names
	spec  v1alpha1.WorkflowSpec
	limit int64
	nodes map[string]*Node
	// replicate, fetchTimeout and serveWait are the Config of the peers started from now on.
	replicate    bool
	fetchTimeout time.Duration
	serveWait    time.Duration
	journalDir   string
}

// newCluster starts an embedded server (or uses url) and one peer per name, each alone on
// its host with its own store and engine over the same rules.
func newCluster(t *testing.T, url string, spec string, names []string, limit int64) *cluster {
	t.Helper()
	testenv.Integration(t, "an embedded nats-server")
	if url == "" {
		srv, err := StartEmbedded(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Shutdown)
		url = srv.URL()
	}
	c := &cluster{t: t, url: url, names: wfmeta.NamesFor("test", "wf-"+filepath.Base(t.Name())), limit: limit, nodes: map[string]*Node{}}
	if err := yaml.UnmarshalStrict([]byte(spec), &c.spec); err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		c.peer(name, "", "", filepath.Join(t.TempDir(), name))
	}
	return c
}

// peer starts peer name on host (empty: its own) with its state in stateDir (empty: none,
// the peer is alone on its host) over the node store in storeDir.
func (c *cluster) peer(name, host, stateDir, storeDir string) *Node {
	c.t.Helper()
	rs, errs, _ := semantics.Compile(&c.spec)
	if len(errs) > 0 {
		c.t.Fatal(errs.ToAggregate())
	}
	st, err := store.New(storeDir, store.Options{Limit: c.limit, SpaceWait: 100 * time.Millisecond})
	if err != nil {
		c.t.Fatal(err)
	}
	nc, err := nats.Connect(c.url, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(nc.Close)
	n, err := Start(context.Background(), Config{Conn: nc, Names: c.names, Node: name, Host: host, StateDir: stateDir, Engine: semantics.NewEngine(rs), Store: st,
		Replicate: c.replicate, FetchTimeout: c.fetchTimeout, ServeWait: c.serveWait, JournalDir: c.journalDir})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(n.Stop)
	c.nodes[name] = n
	return n
}

// write writes data at off of p on node n as a view would: store first, then events.
func (c *cluster) write(n *Node, p string, off int64, data []byte) {
	c.t.Helper()
	sp, _ := n.store.Path(p)
	f, err := os.OpenFile(sp, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		c.t.Fatal(err)
	}
	defer f.Close()
	if err := n.store.Reserve(context.Background(), p, off+int64(len(data))); err != nil {
		c.t.Fatal(err)
	}
	if _, err := f.WriteAt(data, off); err != nil {
		c.t.Fatal(err)
	}
	n.Write(p, off, int64(len(data)))
	n.Wrote(p, off, data)
}

// readAll reads p on node n as a reader would: waiting per the rules, then from the store.
func readAll(ctx context.Context, n *Node, p string) ([]byte, error) {
	if _, err := n.WaitOpen(ctx, p); err != nil {
		return nil, err
	}
	var out []byte
	for {
		k, eof, err := n.WaitRead(ctx, p, 0, int64(len(out)))
		if err != nil {
			return out, err
		}
		if eof {
			return out, nil
		}
		if err := n.Fetch(ctx, p, int64(len(out)), int64(len(out))+k); err != nil {
			return out, err
		}
		sp, _ := n.store.Path(p)
		f, err := os.Open(sp)
		if err != nil {
			return out, err
		}
		buf := make([]byte, k)
		m, err := f.ReadAt(buf, int64(len(out)))
		f.Close()
		if int64(m) != k {
			return out, errors.New("store short of what the engine said was readable: " + err.Error())
		}
		out = append(out, buf...)
	}
}

// readStore reads k bytes at off of p from n's node store, fetching them first as a
// view does.
func readStore(t *testing.T, n *Node, p string, off, k int64) []byte {
	t.Helper()
	if err := n.Fetch(context.Background(), p, off, off+k); err != nil {
		t.Fatal(err)
	}
	sp, _ := n.store.Path(p)
	buf := make([]byte, k)
	f, err := os.Open(sp)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.ReadAt(buf, off); err != nil {
		t.Fatal(err)
	}
	return buf
}

const oneToOne = `
steps:
- name: p
  outputs: [{path: f, commit: {rule: OnClose}, fire: NoUpdate}]
- name: c
  inputs: [f]`

func randomBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

func TestStreamBetweenNodes(t *testing.T) {
	c := newCluster(t, "", oneToOne, []string{"a", "b"}, 0)
	a, b := c.nodes["a"], c.nodes["b"]
	data := randomBytes(5<<20 + 123)
	got := make(chan []byte, 1)
	go func() {
		out, err := readAll(context.Background(), b, "f")
		if err != nil {
			t.Error(err)
		}
		got <- out
	}()
	a.Create("f", false)
	for off := 0; off < len(data); off += 300000 {
		end := min(off+300000, len(data))
		c.write(a, "f", int64(off), data[off:end])
	}
	a.Close("f")
	select {
	case out := <-got:
		if !bytes.Equal(out, data) {
			t.Fatalf("node b read %d bytes, differing from the %d written on node a", len(out), len(data))
		}
	case <-time.After(30 * time.Second):
		t.Fatal("reader on node b never reached EOF")
	}
	if err := a.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	ca, cb := a.Counters(), b.Counters()
	if ca.BytesPublished != int64(len(data)) || cb.BytesReceived != int64(len(data)) || ca.BytesServed != int64(len(data)) {
		t.Errorf("announced %d, served %d, received %d; want %d each", ca.BytesPublished, ca.BytesServed, cb.BytesReceived, len(data))
	}
	if ca.BytesReceived != 0 {
		t.Errorf("the producer's node pulled %d bytes over NATS", ca.BytesReceived)
	}
	for _, n := range []*Node{a, b} {
		if got := n.Holders("f"); !slices.Equal(got, []string{"a"}) {
			t.Errorf("node %s says f's bytes are on %v, want [a]", n.Name(), got)
		}
	}
}

// Bytes go only where they are read: a node that knows of the file but never reads it
// receives nothing, and its store holds the file's size in a sparse file.
func TestBytesGoOnlyWhereRead(t *testing.T) {
	c := newCluster(t, "", oneToOne, []string{"a", "b", "idle"}, 0)
	a, b, idle := c.nodes["a"], c.nodes["b"], c.nodes["idle"]
	data := randomBytes(4<<20 + 5)
	a.Create("f", false)
	c.write(a, "f", 0, data)
	a.Close("f")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := readAll(ctx, b, "f"); err != nil || !bytes.Equal(out, data) {
		t.Fatalf("reader node: %d bytes (%v)", len(out), err)
	}
	if _, err := idle.WaitOpen(ctx, "f"); err != nil {
		t.Fatal(err)
	}
	if got := idle.Counters().BytesReceived; got != 0 {
		t.Errorf("a node without readers received %d bytes", got)
	}
	sp, _ := idle.store.Path("f")
	var st syscall.Stat_t
	if err := syscall.Stat(sp, &st); err != nil || st.Size != int64(len(data)) || st.Blocks != 0 {
		t.Errorf("idle node's store file: size %d, %d blocks (%v); want %d bytes, none allocated", st.Size, st.Blocks, err, len(data))
	}
}

// With Replicate, every byte travels in the stream and every node stores it, read or not.
func TestReplicateStoresEverywhere(t *testing.T) {
	c := newCluster(t, "", oneToOne, nil, 0)
	c.replicate = true
	a, idle := c.peer("a", "", "", t.TempDir()), c.peer("idle", "", "", t.TempDir())
	data := randomBytes(2 << 20)
	a.Create("f", false)
	c.write(a, "f", 0, data)
	a.Close("f")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, _, err := idle.WaitRead(ctx, "f", 0, int64(len(data))); err != nil {
		t.Fatal(err)
	}
	sp, _ := idle.store.Path("f")
	if got, err := os.ReadFile(sp); err != nil || !bytes.Equal(got, data) {
		t.Errorf("replicated copy: %d bytes (%v), want the %d written", len(got), err, len(data))
	}
	if got := a.Counters().BytesServed; got != 0 {
		t.Errorf("the writer served %d bytes; replicated bytes travel in the stream", got)
	}
}

// An output declared `replicate: Stream` travels in the stream to every node; the others
// of the same workflow stay where they were written until read.
func TestReplicateStreamPerOutput(t *testing.T) {
	c := newCluster(t, "", `
steps:
- name: p
  outputs:
  - {path: kept, commit: {rule: OnClose}, replicate: Stream}
  - {path: fetched, commit: {rule: OnClose}}
- name: c
  inputs: [kept, fetched]`, []string{"a", "idle"}, 0)
	a, idle := c.nodes["a"], c.nodes["idle"]
	data := randomBytes(1 << 20)
	for _, p := range []string{"kept", "fetched"} {
		a.Create(p, false)
		c.write(a, p, 0, data)
		a.Close(p)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, p := range []string{"kept", "fetched"} {
		if _, _, err := idle.WaitRead(ctx, p, 0, int64(len(data))); err != nil {
			t.Fatal(err)
		}
	}
	sp, _ := idle.store.Path("kept")
	if got, err := os.ReadFile(sp); err != nil || !bytes.Equal(got, data) {
		t.Errorf("the Stream output on the idle node: %d bytes (%v), want its %d bytes", len(got), err, len(data))
	}
	if got := idle.Counters().BytesReceived; got != int64(len(data)) {
		t.Errorf("the idle node received %d bytes, want %d (the Stream output only)", got, len(data))
	}
	if idle.Remote("kept", 0, int64(len(data))) || !idle.Remote("fetched", 0, int64(len(data))) {
		t.Error("the idle node takes the Stream output for remote, or the Fetch output for local")
	}
}

// A reader whose bytes are on a node that is gone gets an error naming the file and the
// node, within the fetch timeout: never a hang, never a hole.
func TestHolderLostFailsTheRead(t *testing.T) {
	c := newCluster(t, "", oneToOne, nil, 0)
	c.fetchTimeout = time.Second
	a, b := c.peer("a", "", "", t.TempDir()), c.peer("b", "", "", t.TempDir())
	data := randomBytes(1 << 20)
	a.Create("f", false)
	c.write(a, "f", 0, data)
	a.Close("f")
	if err := a.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := b.WaitOpen(ctx, "f"); err != nil {
		t.Fatal(err)
	}
	a.Stop()
	_, err := readAll(ctx, b, "f")
	var fe *FetchError
	if !errors.Is(err, ErrHolderLost) || !errors.As(err, &fe) || fe.Host != "a" || fe.Path != "f" {
		t.Fatalf("read with the holder gone: %v; want a FetchError naming f and node a", err)
	}
}

// A holder whose host has not applied the stream as far as the reader's (its
// materialiser's consumer resuming after a NATS server restart, which nats.go retries
// with a backoff of up to 10 s) answers "ask again", and the reader's fetch asks again
// until the holder catches up: the read succeeds late, it does not fail.
func TestFetchFromAHolderThatIsBehindAsksAgain(t *testing.T) {
	c := newCluster(t, "", twoFiles, nil, 0)
	c.serveWait = 50 * time.Millisecond
	a, b, other := c.peer("a", "", "", t.TempDir()), c.peer("b", "", "", t.TempDir()), c.peer("c", "", "", t.TempDir())
	data := randomBytes(1 << 20)
	a.Create("f", false)
	c.write(a, "f", 0, data)
	a.Close("f")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := a.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	stream, err := a.js.Stream(ctx, c.names.Stream)
	if err != nil {
		t.Fatal(err)
	}
	ahead := stream.CachedInfo().State.LastSeq + 1 // a sequence a's host has not applied

	// Every answer to b's requests, seen from a connection of the test's own.
	watch, err := nats.Connect(c.url)
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	deferred := make(chan struct{}, 64)
	sub, err := watch.Subscribe("_INBOX.>", func(m *nats.Msg) {
		if m.Header.Get(hdrRetry) != "" {
			deferred <- struct{}{}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}
	go func() {
		// Once a has answered "ask again", the stream reaches the sequence b asks at.
		select {
		case <-deferred:
			other.Create("g", false)
		case <-ctx.Done():
		}
	}()
	got, err := b.fetcher.request("f", held{Range: byterange.Range{Off: 0, End: int64(len(data))}, host: "a"}, ahead)
	if err != nil {
		t.Fatalf("fetch from a holder behind the reader: %v", err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("fetched %d bytes differing from the %d written", len(got), len(data))
	}
}

const twoFiles = `
steps:
- name: p
  outputs:
  - {path: f, commit: {rule: OnClose}, fire: NoUpdate}
  - {path: g, commit: {rule: OnClose}, fire: NoUpdate}
- name: c
  inputs: [f, g]`

// A file read on two other nodes is published once.
func TestFanOutPublishesOnce(t *testing.T) {
	c := newCluster(t, "", oneToOne, []string{"a", "b", "c"}, 0)
	a := c.nodes["a"]
	data := randomBytes(3 << 20)
	a.Create("f", false)
	c.write(a, "f", 0, data)
	a.Close("f")
	for _, name := range []string{"b", "c"} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		out, err := readAll(ctx, c.nodes[name], "f")
		cancel()
		if err != nil || !bytes.Equal(out, data) {
			t.Fatalf("node %s: %d bytes, %v", name, len(out), err)
		}
	}
	a.Sync(context.Background())
	if pub := a.Counters().BytesPublished; pub != int64(len(data)) {
		t.Errorf("published %d bytes for 2 readers, want %d (once)", pub, len(data))
	}
}

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
	for _, n := range []*Node{a, b} {
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

// Hostile messages on the wire are refused and logged, never written outside the store
// or into a committed file.
func TestHostileMessagesAreRejected(t *testing.T) {
	c := newCluster(t, "", oneToOne, []string{"a", "b"}, 0)
	b := c.nodes["b"]
	nc, err := nats.Connect(c.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	send := func(m *nats.Msg) {
		t.Helper()
		if _, err := js.PublishMsg(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	raw := func(kind Kind, path string, off string, data []byte) *nats.Msg {
		m := nats.NewMsg(c.names.Data("a", "a"))
		m.Header.Set(hdrNode, "a")
		m.Header.Set(hdrKind, string(kind))
		m.Header.Set(hdrPath, path)
		m.Header.Set(hdrOffset, off)
		m.Header.Set(hdrLength, strconv.Itoa(len(data)))
		m.Data = data
		return m
	}
	send(raw(KindData, "../escape", "0", []byte("x")))
	send(raw(KindData, "/etc/passwd", "0", []byte("x")))
	send(raw(KindData, "f\x00g", "0", []byte("x")))
	send(raw(KindData, "f", "1099511627776", []byte("x")))
	send(raw(KindData, "plain-file", "0", []byte("x")))
	send(raw(KindData, "f", "-1", []byte("x")))
	lying := raw(KindData, "f", "0", []byte("x"))
	lying.Header.Set(hdrLength, "5") // says 5 bytes, carries 1
	send(lying)
	// a valid file, committed, then a duplicate and a late chunk
	send(Encode(c.names.Events("a"), &Message{Node: "a", Kind: KindCreate, Path: "f"}))
	send(Encode(c.names.Data("a", "a"), &Message{Node: "a", Kind: KindData, Path: "f", Offset: 0, Data: []byte("hello")}))
	send(Encode(c.names.Data("a", "a"), &Message{Node: "a", Kind: KindData, Path: "f", Offset: 0, Data: []byte("hello")}))
	send(Encode(c.names.Events("a"), &Message{Node: "a", Kind: KindClose, Path: "f"}))
	send(Encode(c.names.Data("a", "a"), &Message{Node: "a", Kind: KindData, Path: "f", Offset: 0, Data: []byte("EVIL!")}))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.CaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	out, err := readAll(ctx, b, "f")
	if err != nil || string(out) != "hello" {
		t.Errorf("f on node b = %q, %v; want hello", out, err)
	}
	if got := b.Counters().Rejected; got != 8 {
		t.Errorf("rejected %d messages, want 8 (7 invalid, 1 into a committed file)", got)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(b.store.Dir()), "escape")); err == nil {
		t.Error("a chunk escaped the store")
	}
}

// When the reader's node store is full, the reader gets a clear error at once, not a hang,
// and nothing is corrupt.
func TestReaderNodeStoreFull(t *testing.T) {
	c := newCluster(t, "", oneToOne, []string{"a", "b"}, 1<<20)
	a, b := c.nodes["a"], c.nodes["b"]
	a.store = mustStore(t, 0) // the producer's node has room
	a.Create("f", false)
	c.write(a, "f", 0, randomBytes(2<<20))
	a.Close("f")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := readAll(ctx, b, "f")
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("reader on the full node: err = %v, want ErrUnavailable", err)
	}
	if used := b.store.Used(); used > 1<<20 {
		t.Errorf("node b's store holds %d bytes beyond its limit", used)
	}
}

func mustStore(t *testing.T, limit int64) *store.Store {
	st, err := store.New(t.TempDir(), store.Options{Limit: limit})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// A reader killed mid-file and started again resumes from its offset on the bytes its
// node already holds: nothing is transferred twice.
func TestRestartedReaderResumesWithoutRetransfer(t *testing.T) {
	c := newCluster(t, "", oneToOne, []string{"a", "b"}, 0)
	a, b := c.nodes["a"], c.nodes["b"]
	data := randomBytes(4 << 20)
	a.Create("f", false)
	c.write(a, "f", 0, data[:2<<20])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// the first reader gets the first half, then dies
	var first []byte
	for int64(len(first)) < 2<<20 {
		k, _, err := b.WaitRead(ctx, "f", 0, int64(len(first)))
		if err != nil {
			t.Fatal(err)
		}
		first = append(first, readStore(t, b, "f", int64(len(first)), k)...)
	}
	c.write(a, "f", 2<<20, data[2<<20:])
	a.Close("f")
	// the restarted reader asks from its offset on; the node serves it from its store
	off := int64(len(first))
	rest := []byte{}
	for {
		k, eof, err := b.WaitRead(ctx, "f", 0, off+int64(len(rest)))
		if err != nil {
			t.Fatal(err)
		}
		if eof {
			break
		}
		rest = append(rest, readStore(t, b, "f", off+int64(len(rest)), k)...)
	}
	if !bytes.Equal(append(first, rest...), data) {
		t.Fatal("resumed read differs from what was written")
	}
	if got := b.Counters().BytesReceived; got != int64(len(data)) {
		t.Errorf("node b received %d bytes for a %d-byte file read twice in part", got, len(data))
	}
}

// sharedHost starts two peers on host "h" sharing one node store and state directory, as
// the sidecars of two pods of the workflow on one Kubernetes node do.
func (c *cluster) sharedHost(names ...string) []*Node {
	c.t.Helper()
	dir := c.t.TempDir()
	var peers []*Node
	for _, name := range names {
		peers = append(peers, c.peer(name, "h", filepath.Join(dir, "state"), filepath.Join(dir, "store")))
	}
	return peers
}

// Two pods on one node stream through the node store they share: the consumer's peer
// reads every byte the producer's peer wrote, and no byte travels back from NATS to that
// node, whichever peer is its materialiser. A third peer on another node gets the bytes
// over NATS.
func TestColocatedPeersShareTheNodeStore(t *testing.T) {
	c := newCluster(t, "", oneToOne, nil, 0)
	peers := c.sharedHost("prod", "cons")
	prod, cons := peers[0], peers[1]
	remote := c.peer("remote", "", "", filepath.Join(t.TempDir(), "remote"))
	data := randomBytes(6<<20 + 17)
	prod.Create("f", false)
	for off := 0; off < len(data); off += 1 << 20 {
		c.write(prod, "f", int64(off), data[off:min(off+1<<20, len(data))])
	}
	prod.Close("f")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, n := range []*Node{cons, remote} {
		out, err := readAll(ctx, n, "f")
		if err != nil || !bytes.Equal(out, data) {
			t.Fatalf("peer %s read %d bytes (%v), want the %d written", n.Name(), len(out), err, len(data))
		}
	}
	if got := prod.Counters().BytesReceived + cons.Counters().BytesReceived; got != 0 {
		t.Errorf("the producer's node fetched %d bytes of its own file from NATS", got)
	}
	if got := remote.Counters().BytesReceived; got != int64(len(data)) {
		t.Errorf("the remote node received %d bytes, want %d", got, len(data))
	}
}

// A file written on another node is fetched once per node, however many pods read it
// there: only the node's materialiser receives the bytes.
func TestRemoteFileFetchedOncePerNode(t *testing.T) {
	c := newCluster(t, "", oneToOne, []string{"prod"}, 0)
	prod := c.nodes["prod"]
	readers := c.sharedHost("r1", "r2", "r3")
	data := randomBytes(3 << 20)
	prod.Create("f", false)
	c.write(prod, "f", 0, data)
	prod.Close("f")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var received int64
	for _, r := range readers {
		out, err := readAll(ctx, r, "f")
		if err != nil || !bytes.Equal(out, data) {
			t.Fatalf("peer %s read %d bytes (%v)", r.Name(), len(out), err)
		}
		received += r.Counters().BytesReceived
	}
	if received != int64(len(data)) {
		t.Errorf("the node's peers received %d bytes in all for a %d-byte file", received, len(data))
	}
}

// A peer that is not its host's fetcher asks the materialiser for the bytes it reads. The
// materialiser answers how far the committed file is held now (its readahead has fetched
// ahead), so the peer's next reads of those bytes need no request: reading a committed
// file in 128 KiB pieces takes at most one request per MiB, not one per read.
func TestPeerReadsWhatItsMaterialiserFetchedAheadWithoutAsking(t *testing.T) {
	c := newCluster(t, "", oneToOne, []string{"prod"}, 0)
	prod := c.nodes["prod"]
	readers := c.sharedHost("r1", "r2")
	data := randomBytes(8 << 20)
	prod.Create("f", false)
	c.write(prod, "f", 0, data)
	prod.Close("f")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, r := range readers { // both have applied the commit: the end is EOF
		if _, eof, err := r.WaitRead(ctx, "f", 0, int64(len(data))); err != nil || !eof {
			t.Fatalf("peer %s at the end of the committed file: eof %v (%v)", r.Name(), eof, err)
		}
	}
	// Once a fetch returned, the host has a materialiser: the other peer is not it.
	if err := readers[0].Fetch(ctx, "f", 0, 1); err != nil {
		t.Fatal(err)
	}
	peer := readers[0]
	if peer.fetching.Load() {
		peer = readers[1]
	}
	nc, err := nats.Connect(c.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	asked, err := nc.SubscribeSync(c.names.Ensure("h"))
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	sp, _ := peer.store.Path("f")
	const piece = 128 << 10
	for off := 0; off < len(data); off += piece {
		if err := peer.Fetch(ctx, "f", int64(off), int64(off+piece)); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(sp)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, piece)
		_, err = f.ReadAt(buf, int64(off))
		f.Close()
		if err != nil || !bytes.Equal(buf, data[off:off+piece]) {
			t.Fatalf("bytes %d to %d in the store after Fetch differ from those written (%v)", off, off+piece, err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if n, _, _ := asked.Pending(); n > len(data)/MaxChunk {
		t.Errorf("the peer asked its materialiser %d times for %d reads of a %d-byte committed file, want at most one per MiB", n, len(data)/piece, len(data))
	}
	if got := readers[0].Counters().BytesReceived + readers[1].Counters().BytesReceived; got != int64(len(data)) {
		t.Errorf("the host received %d bytes for a %d-byte file", got, len(data))
	}
}

// The same holds for a NoUpdate file still being written: its bytes are final once
// written, so the materialiser says how far it holds them and the peer reads on without
// asking. A program reading such a file 4 KiB at a time (sort) otherwise cost a request
// per read, and crawled on a busy connection until the wait timeout ended it.
func TestPeerReadsANoUpdateFileItsMaterialiserFetchedAheadWithoutAsking(t *testing.T) {
	c := newCluster(t, "", oneToOne, []string{"prod"}, 0)
	prod := c.nodes["prod"]
	readers := c.sharedHost("r1", "r2")
	data := randomBytes(4 << 20)
	prod.Create("f", false)
	c.write(prod, "f", 0, data) // not closed: the file is not committed
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, r := range readers { // both have applied the write: every byte is readable
		if n, _, err := r.WaitRead(ctx, "f", 0, int64(len(data))-1); err != nil || n != 1 {
			t.Fatalf("peer %s at the last byte written: %d readable (%v)", r.Name(), n, err)
		}
	}
	if err := readers[0].Fetch(ctx, "f", 0, 1); err != nil {
		t.Fatal(err)
	}
	peer := readers[0]
	if peer.fetching.Load() {
		peer = readers[1]
	}
	nc, err := nats.Connect(c.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	asked, err := nc.SubscribeSync(c.names.Ensure("h"))
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	const piece = 4 << 10
	for off := 0; off < len(data); off += piece {
		if got := readStore(t, peer, "f", int64(off), piece); !bytes.Equal(got, data[off:off+piece]) {
			t.Fatalf("bytes %d to %d in the store after Fetch differ from those written", off, off+piece)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if n, _, _ := asked.Pending(); n > len(data)/MaxChunk {
		t.Errorf("the peer asked its materialiser %d times for %d reads of a %d-byte NoUpdate file, want at most one per MiB", n, len(data)/piece, len(data))
	}
}

// The node's materialiser stops mid-file (its pod ended): another peer of the node takes
// the role over where it stopped, and the reader gets every byte, in order.
func TestMaterialiserFailover(t *testing.T) {
	c := newCluster(t, "", oneToOne, []string{"prod"}, 0)
	prod := c.nodes["prod"]
	readers := c.sharedHost("r1", "r2")
	data := randomBytes(8 << 20)
	prod.Create("f", false)
	c.write(prod, "f", 0, data[:4<<20])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Both peers see the first half, and the node's materialiser fetches it.
	for _, r := range readers {
		if _, _, err := r.WaitRead(ctx, "f", 0, 4<<20-1); err != nil {
			t.Fatal(err)
		}
	}
	if err := readers[0].Fetch(ctx, "f", 0, 4<<20); err != nil {
		t.Fatal(err)
	}
	holder, survivor := readers[0], readers[1]
	if holder.Counters().BytesReceived == 0 {
		holder, survivor = survivor, holder
	}
	holder.Stop()
	c.write(prod, "f", 4<<20, data[4<<20:])
	prod.Close("f")
	out, err := readAll(ctx, survivor, "f")
	if err != nil || !bytes.Equal(out, data) {
		t.Fatalf("after failover the survivor read %d bytes (%v), want %d", len(out), err, len(data))
	}
	if got := holder.Counters().BytesReceived + survivor.Counters().BytesReceived; got > int64(len(data))+MaxChunk {
		t.Errorf("the node received %d bytes for a %d-byte file: the new materialiser fetched again what was stored", got, len(data))
	}
}

// A peer that restarts (a sidecar killed and started again, same name, new process)
// replays its previous life from the stream: the files it created are known again, and a
// close it makes now commits them everywhere. Its new messages are not taken for
// duplicates of the old ones.
func TestRestartedPeerReplaysItsPreviousLife(t *testing.T) {
	c := newCluster(t, "", oneToOne, []string{"reader"}, 0)
	dir := t.TempDir()
	store := filepath.Join(dir, "store")
	first := c.peer("prod", "", "", store)
	data := randomBytes(2 << 20)
	first.Create("f", false)
	c.write(first, "f", 0, data[:1<<20])
	if err := first.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	first.Stop()
	again := c.peer("prod", "", "", store)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, _, err := again.WaitRead(ctx, "f", 0, 1<<20-1); err != nil {
		t.Fatalf("the restarted peer does not know the bytes it wrote before: %v", err)
	}
	c.write(again, "f", 1<<20, data[1<<20:])
	again.Close("f")
	out, err := readAll(ctx, c.nodes["reader"], "f")
	if err != nil || !bytes.Equal(out, data) {
		t.Fatalf("reader got %d bytes (%v), want %d", len(out), err, len(data))
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

// A withdrawal and a hard link cross the wire with what a peer needs to apply them: the
// reason, and a new name that is a clean volume path.
func TestWithdrawAndLinkMessagesAreChecked(t *testing.T) {
	if _, err := Decode(Encode("x", &Message{Node: "evil", Kind: KindWithdraw, Path: "f"})); !errors.Is(err, ErrInvalid) {
		t.Errorf("a withdrawal without a reason decoded: %v", err)
	}
	m, err := Decode(Encode("x", &Message{Node: "a", Kind: KindWithdraw, Path: "f", Reason: "attempt 1 failed"}))
	if err != nil || m.Reason != "attempt 1 failed" {
		t.Errorf("a valid withdrawal: %+v, %v", m, err)
	}
	for _, bad := range []string{"/etc/passwd", "../x", ""} {
		if _, err := Decode(Encode("x", &Message{Node: "evil", Kind: KindLink, Path: "d/a", NewPath: bad, Size: 1})); !errors.Is(err, ErrInvalid) {
			t.Errorf("a link to %q decoded: %v", bad, err)
		}
	}
	m, err = Decode(Encode("x", &Message{Node: "a", Kind: KindLink, Path: "d/a", NewPath: "d/b", Size: 5}))
	if err != nil || m.NewPath != "d/b" || m.Size != 5 {
		t.Errorf("a valid link: %+v, %v", m, err)
	}
}

// A symlink message needs a target the kernel could store: empty, NUL-bearing or
// PATH_MAX-long targets from the wire are refused.
func TestSymlinkMessagesAreChecked(t *testing.T) {
	for _, target := range []string{"", "a\x00b", strings.Repeat("x", 4096)} {
		m := Encode("x", &Message{Node: "evil", Kind: KindSymlink, Path: "d/l", Target: target})
		if _, err := Decode(m); !errors.Is(err, ErrInvalid) {
			t.Errorf("a symlink to %.20q decoded: %v", target, err)
		}
	}
	m := Encode("x", &Message{Node: "a", Kind: KindSymlink, Path: "d/l", Target: "../x"})
	if got, err := Decode(m); err != nil || got.Target != "../x" {
		t.Errorf("a valid symlink message: %+v, %v", got, err)
	}
}

// Requests for bytes are untrusted like every message: a path outside the volume or no
// rule governs, a range past the file's end or beyond MaxChunk, a request without the
// sequence, all get an error answer and no byte; a good one gets exactly its bytes.
func TestHostileFetchRequestsAreRefused(t *testing.T) {
	c := newCluster(t, "", oneToOne, []string{"a"}, 0)
	a := c.nodes["a"]
	data := randomBytes(100)
	a.Create("f", false)
	c.write(a, "f", 0, data)
	a.Close("f")
	sp, _ := a.store.Path("plain")
	if err := os.WriteFile(sp, []byte("not governed"), 0o644); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(c.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ask := func(path, off, length, seq string) *nats.Msg {
		t.Helper()
		req := nats.NewMsg(c.names.Serve("a"))
		for k, v := range map[string]string{hdrPath: path, hdrOffset: off, hdrLength: length, hdrSeq: seq} {
			if v != "" {
				req.Header.Set(k, v)
			}
		}
		resp, err := nc.RequestMsg(req, 5*time.Second)
		if err != nil {
			t.Fatalf("request %q %s+%s: %v", path, off, length, err)
		}
		return resp
	}
	for _, bad := range []struct{ what, path, off, length, seq string }{
		{"dot-dot", "../f", "0", "10", "1"},
		{"absolute", "/etc/passwd", "0", "10", "1"},
		{"not governed", "plain", "0", "10", "1"},
		{"past the end", "f", "90", "20", "1"},
		{"over MaxChunk", "f", "0", strconv.Itoa(MaxChunk + 1), "1"},
		{"no sequence", "f", "0", "10", ""},
		{"negative offset", "f", "-1", "10", "1"},
	} {
		resp := ask(bad.path, bad.off, bad.length, bad.seq)
		if resp.Header.Get(hdrError) == "" || len(resp.Data) != 0 {
			t.Errorf("%s: answered %d bytes, error %q; want an error and no byte", bad.what, len(resp.Data), resp.Header.Get(hdrError))
		}
	}
	if got := a.Counters().BytesServed; got != 0 {
		t.Errorf("served %d bytes to hostile requests", got)
	}
	if resp := ask("f", "10", "20", "1"); resp.Header.Get(hdrError) != "" || !bytes.Equal(resp.Data, data[10:30]) {
		t.Errorf("a good request: %d bytes, error %q", len(resp.Data), resp.Header.Get(hdrError))
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
