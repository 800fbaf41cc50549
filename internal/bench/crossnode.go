package bench

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"sigs.k8s.io/yaml"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/store"
	"github.com/sluice-io/sluice/internal/transport"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

// CrossNode measures streaming one file between two nodes through an embedded NATS
// server, fetched on demand and replicated through the stream (transport.Config.Replicate),
// against a raw TCP copy on loopback, and commit-to-open across the nodes.
func CrossNode(ctx context.Context, cfg Config) ([]Micro, error) {
	dir, err := os.MkdirTemp(cfg.Dir, "xnode-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	srv, err := transport.StartEmbedded(filepath.Join(dir, "js"))
	if err != nil {
		return nil, err
	}
	defer srv.Shutdown()
	size := int64(cfg.Profile.ThroughputMiB) << 20
	tcpMBs, err := tcpCopy(size)
	if err != nil {
		return nil, err
	}
	rawMBs, err := requestReply(ctx, srv.URL(), size)
	if err != nil {
		return nil, err
	}
	pubsubMBs, err := pubSub(srv.URL(), size)
	if err != nil {
		return nil, err
	}
	eager, err := twoNodes(ctx, srv.URL(), filepath.Join(dir, "eager"), true)
	if err != nil {
		return nil, err
	}
	defer eager.stop()
	eagerMBs, err := streamOnce(ctx, eager.nodes["a"], eager.nodes["b"], eager.stores["a"], "f0", size)
	if err != nil {
		return nil, err
	}
	// Free the replicated run's memory (stores and stream) before the next: new tmpfs
	// pages cost this VM far more than reused ones (docs/benchmarks.md), and would be
	// charged to the fetched figure.
	eager.stop()
	pair, err := twoNodes(ctx, srv.URL(), filepath.Join(dir, "fetch"), false)
	if err != nil {
		return nil, err
	}
	defer pair.stop()
	nodes := pair.nodes
	natsMBs, err := streamOnce(ctx, nodes["a"], nodes["b"], pair.stores["a"], "f0", size)
	if err != nil {
		return nil, err
	}
	perByte := float64(nodes["b"].Counters().BytesReceived) / float64(size)
	var samples []time.Duration
	for i := 0; i < 200; i++ {
		p := fmt.Sprintf("l%d", i)
		opened := make(chan time.Time, 1)
		go func() {
			nodes["b"].WaitOpen(ctx, p)
			opened <- time.Now()
		}()
		nodes["a"].Create(p, false)
		start := time.Now()
		nodes["a"].Close(p)
		select {
		case t := <-opened:
			samples = append(samples, t.Sub(start))
		case <-time.After(10 * time.Second):
			return nil, fmt.Errorf("cross-node open did not return")
		}
	}
	sort.Slice(samples, func(i, j int) bool { return samples[i] < samples[j] })
	return []Micro{
		{Name: "streaming one file between two nodes, fetched on demand over NATS (vs a raw TCP copy on loopback)", Unit: "MB/s", Volume: natsMBs, Tmpfs: tcpMBs},
		{Name: "streaming one file between two nodes, replicated through the JetStream stream (vs a raw TCP copy)", Unit: "MB/s", Volume: eagerMBs, Tmpfs: tcpMBs},
		{Name: "streaming one file between two nodes, fetched on demand (vs bare core NATS request/reply of 1 MiB, 8 in flight, through the same server)", Unit: "MB/s", Volume: natsMBs, Tmpfs: rawMBs},
		{Name: "streaming one file between two nodes, fetched on demand (vs bare core NATS publish/subscribe of 1 MiB messages, same server)", Unit: "MB/s", Volume: natsMBs, Tmpfs: pubsubMBs},
		{Name: "bytes received per byte read on the other node, fetched on demand", Unit: "ratio", Volume: perByte},
		{Name: "commit-to-open p50 across two nodes (close on one, waiting open on the other)", Unit: "us", Volume: float64(samples[len(samples)/2].Nanoseconds()) / 1000},
	}, nil
}

// nodePair is two transport peers of one workflow, each alone on its host, with their
// stores under dir.
type nodePair struct {
	nodes  map[string]*transport.Peer
	stores map[string]*store.Store
	closed bool
	conns  []*nats.Conn
	dir    string
	names  wfmeta.Names
}

// stop stops the peers, then deletes the workflow's stream and the stores, so that the
// memory they held is free for what runs next.
func (np *nodePair) stop() {
	if np.closed {
		return
	}
	np.closed = true
	for _, n := range np.nodes {
		n.Stop()
	}
	if len(np.conns) > 0 {
		if js, err := jetstream.New(np.conns[0]); err == nil {
			_ = wfmeta.DeleteStream(context.Background(), js, np.names)
		}
	}
	for _, nc := range np.conns {
		nc.Close()
	}
	for _, st := range np.stores {
		st.Close()
	}
	os.RemoveAll(np.dir)
}

// twoNodes starts peers a and b of a workflow of its own under dir.
func twoNodes(ctx context.Context, url, dir string, replicate bool) (*nodePair, error) {
	var spec v1alpha1.WorkflowSpec
	yaml.Unmarshal([]byte(`
steps:
- name: p
  outputs: [{path: "f*", commit: {rule: OnClose}, fire: NoUpdate}, {path: "l*", commit: {rule: OnClose}}]
- name: c`), &spec)
	wf := "xnode-" + filepath.Base(dir)
	np := &nodePair{nodes: map[string]*transport.Peer{}, stores: map[string]*store.Store{}, dir: dir, names: wfmeta.NamesFor("bench", wf)}
	for _, name := range []string{"a", "b"} {
		rs, errs, _ := semantics.Compile(ctx, &spec)
		if len(errs) > 0 {
			np.stop()
			return nil, errs.ToAggregate()
		}
		st, err := store.New(filepath.Join(dir, name), store.Options{})
		if err != nil {
			np.stop()
			return nil, err
		}
		np.stores[name] = st // closed by stop, whatever fails next
		nc, err := nats.Connect(url)
		if err != nil {
			np.stop()
			return nil, err
		}
		np.conns = append(np.conns, nc)
		n, err := transport.Start(ctx, transport.Config{Conn: nc, Names: np.names, Node: name,
			Engine: semantics.NewEngine(rs), Store: st, Replicate: replicate})
		if err != nil {
			np.stop()
			return nil, err
		}
		np.nodes[name] = n
	}
	return np, nil
}

// streamOnce writes size bytes into p on node a in 1 MiB chunks and returns the MB/s until
// node b has read it all.
func streamOnce(ctx context.Context, a, b *transport.Peer, st *store.Store, p string, size int64) (float64, error) {
	sp, _ := st.Path(p)
	f, err := os.Create(sp)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		var off int64
		for {
			n, eof, err := b.WaitRead(ctx, p, 0, off)
			if err == nil && !eof {
				err = b.Fetch(ctx, p, off, off+n) // as a view does before reading the store
			}
			if err != nil || eof {
				done <- err
				return
			}
			off += n
		}
	}()
	a.Create(p, false)
	buf := make([]byte, 1<<20)
	files := st.Files(a) // reserve, write, tell a's engine and stream, as a view's write
	for off := int64(0); off < size; off += int64(len(buf)) {
		_, _ = files.WriteAt(ctx, p, int(f.Fd()), buf, off)
	}
	a.Close(p)
	if err := <-done; err != nil {
		return 0, err
	}
	return float64(size) / 1e6 / time.Since(start).Seconds(), nil
}

// requestReply moves size bytes as 1 MiB replies to requests, 8 in flight, between two
// connections of the NATS server at url, and returns the MB/s: the ceiling of the data
// plane's transfers without any file.
func requestReply(ctx context.Context, url string, size int64) (float64, error) {
	srvConn, err := nats.Connect(url)
	if err != nil {
		return 0, err
	}
	defer srvConn.Close()
	cliConn, err := nats.Connect(url)
	if err != nil {
		return 0, err
	}
	defer cliConn.Close()
	chunk := make([]byte, 1<<20)
	subj := nats.NewInbox()
	if _, err := srvConn.Subscribe(subj, func(m *nats.Msg) { _ = m.Respond(chunk) }); err != nil {
		return 0, err
	}
	if err := srvConn.Flush(); err != nil {
		return 0, err
	}
	n := int(size / int64(len(chunk)))
	slots := make(chan struct{}, 8)
	errs := make(chan error, n)
	start := time.Now()
	for i := 0; i < n; i++ {
		slots <- struct{}{}
		go func() {
			defer func() { <-slots }()
			m, err := cliConn.RequestWithContext(ctx, subj, nil)
			if err == nil && len(m.Data) != len(chunk) {
				err = fmt.Errorf("reply of %d bytes, want %d", len(m.Data), len(chunk))
			}
			errs <- err
		}()
	}
	for i := 0; i < n; i++ {
		if err := <-errs; err != nil {
			return 0, fmt.Errorf("NATS request/reply: %w", err)
		}
	}
	return float64(n*len(chunk)) / 1e6 / time.Since(start).Seconds(), nil
}

// pubSub publishes size bytes as 1 MiB core NATS messages from one connection to a
// subscriber on another, and returns the MB/s until the subscriber has them all.
func pubSub(url string, size int64) (float64, error) {
	pub, err := nats.Connect(url)
	if err != nil {
		return 0, err
	}
	defer pub.Close()
	sub, err := nats.Connect(url)
	if err != nil {
		return 0, err
	}
	defer sub.Close()
	chunk := make([]byte, 1<<20)
	n := int(size / int64(len(chunk)))
	subj := nats.NewInbox()
	done := make(chan struct{})
	got := 0
	s, err := sub.Subscribe(subj, func(*nats.Msg) {
		if got++; got == n {
			close(done)
		}
	})
	if err != nil {
		return 0, err
	}
	if err := s.SetPendingLimits(-1, -1); err != nil {
		return 0, err
	}
	if err := sub.Flush(); err != nil {
		return 0, err
	}
	start := time.Now()
	for i := 0; i < n; i++ {
		if err := pub.Publish(subj, chunk); err != nil {
			return 0, err
		}
	}
	if err := pub.Flush(); err != nil {
		return 0, err
	}
	select {
	case <-done:
	case <-time.After(time.Minute):
		return 0, fmt.Errorf("core NATS publish/subscribe: %d of %d messages in a minute", got, n)
	}
	return float64(n*len(chunk)) / 1e6 / time.Since(start).Seconds(), nil
}

func tcpCopy(size int64) (float64, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	got := make(chan int64, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			got <- 0
			return
		}
		n, _ := io.Copy(io.Discard, c)
		c.Close()
		got <- n
	}()
	start := time.Now()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		return 0, err
	}
	buf := make([]byte, 1<<20)
	for off := int64(0); off < size; off += int64(len(buf)) {
		if _, err := c.Write(buf); err != nil {
			return 0, err
		}
	}
	c.Close()
	if n := <-got; n != size {
		return 0, fmt.Errorf("TCP copy moved %d of %d bytes", n, size)
	}
	return float64(size) / 1e6 / time.Since(start).Seconds(), nil
}

// OverlapBound runs the producer and the consumer of a two-step pattern standalone on
// tmpfs, one after the other, and returns their median times: max(T_producer, T_consumer)
// is the makespan perfect overlap would give.
func OverlapBound(ctx context.Context, cfg Config, pat Pattern) (tp, tc time.Duration, err error) {
	var ps, cs []time.Duration
	for rep := 0; rep < cfg.Profile.Reps; rep++ {
		dir, err := os.MkdirTemp(cfg.Dir, "bound-")
		if err != nil {
			return 0, 0, err
		}
		wf := pat.Build(v1alpha1.FireNoUpdate)
		for i, s := range wf.Spec.Steps {
			one := wf.DeepCopy()
			one.Spec.Steps = []v1alpha1.Step{s}
			d, err := runBatchStep(ctx, one, dir)
			if err != nil {
				os.RemoveAll(dir)
				return 0, 0, err
			}
			if i == 0 {
				ps = append(ps, d)
			} else {
				cs = append(cs, d)
			}
		}
		os.RemoveAll(dir)
	}
	return stat(ps, 0.5), stat(cs, 0.5), nil
}
