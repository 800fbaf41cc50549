package transport

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"sigs.k8s.io/yaml"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/store"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

type cluster struct {
	t     *testing.T
	url   string
	names wfmeta.Names
	spec  v1alpha1.WorkflowSpec
	limit int64
	nodes map[string]*Peer
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
	if url == "" {
		srv, err := StartEmbedded(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Shutdown)
		url = srv.URL()
	}
	c := &cluster{t: t, url: url, names: wfmeta.NamesFor("test", "wf-"+filepath.Base(t.Name())), limit: limit, nodes: map[string]*Peer{}}
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
func (c *cluster) peer(name, host, stateDir, storeDir string) *Peer {
	c.t.Helper()
	rs, errs, _ := semantics.Compile(context.Background(), &c.spec)
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
func (c *cluster) write(n *Peer, p string, off int64, data []byte) {
	c.t.Helper()
	sp, _ := n.store.Path(p)
	f, err := os.OpenFile(sp, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		c.t.Fatal(err)
	}
	defer f.Close()
	if err := n.store.ReserveAt(context.Background(), p, off, off+int64(len(data))); err != nil {
		c.t.Fatal(err)
	}
	if _, err := f.WriteAt(data, off); err != nil {
		c.t.Fatal(err)
	}
	n.Write(p, off, int64(len(data)))
	n.Wrote(p, off, data)
}

// readAll reads p on node n as a reader would: waiting per the rules, then from the store.
func readAll(ctx context.Context, n *Peer, p string) ([]byte, error) {
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
func readStore(t *testing.T, n *Peer, p string, off, k int64) []byte {
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
	for _, n := range []*Peer{a, b} {
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
