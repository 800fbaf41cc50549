package transport

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/store"
	"github.com/sluice-io/sluice/internal/streamfs"
)

// Config configures one node of a workflow.
type Config struct {
	// Conn is the NATS connection; the node does not close it.
	Conn *nats.Conn
	// Names are the workflow's stream, bucket and subjects (NamesFor).
	Names Names
	// Node is this node's name: a NATS subject token (letters, digits, - and _).
	Node string
	// Peers are every node of the workflow, this one included. A node applies what the
	// other peers publish.
	Peers []string
	// Engine is this node's semantics engine and Store its node store.
	Engine *semantics.Engine
	Store  *store.Store
	// Window bounds the bytes published but not yet acknowledged (default 64 MiB): the
	// most memory a producer's writes can hold when the server or a consumer is slow.
	Window int64
	// Log receives rejected messages and publish retries.
	Log logr.Logger
}

// Counters are a node's transport counters.
type Counters struct {
	// BytesPublished are data bytes this node published (acknowledged); BytesReceived
	// data bytes it received from other nodes and wrote to its store.
	BytesPublished, BytesReceived int64
	// Applied counts messages from other nodes applied; Rejected those refused (invalid
	// or contradicting the rules) and logged.
	Applied, Rejected int64
	// Republished counts messages sent again after a failed acknowledgement.
	Republished int64
}

// Node is one node's end of a workflow's transport. It implements streamfs.Semantics:
// the node's views report their events to it, it applies them to the local engine and
// publishes them; it applies the other nodes' events and data to the local store and
// engine. The query methods are the engine's.
type Node struct {
	*semantics.Engine
	cfg   Config
	js    jetstream.JetStream
	kv    jetstream.KeyValue
	pub   *publisher
	store *store.Store

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}

	received, applied, rejected atomic.Int64
	lastSeq                     atomic.Uint64

	creatorMu sync.Mutex
	creators  map[string]string // path -> node that created it (home node policy Create)
	seqMu     sync.Mutex
	seqCh     chan struct{}
}

var (
	_ streamfs.Semantics = (*Node)(nil)
	_ streamfs.DataSink  = (*Node)(nil)
)

// ErrUnavailable is returned by waits on a file whose bytes this node could not store
// (its node store is full).
var ErrUnavailable = errors.New("the file's bytes could not be stored on this node")

// Start joins the workflow's transport: it creates the stream on first use (file storage,
// 2 min duplicate window), starts publishing this node's events, and applies the other
// peers' messages from the beginning of the stream.
func Start(ctx context.Context, cfg Config) (*Node, error) {
	if cfg.Window <= 0 {
		cfg.Window = 64 << 20
	}
	if cfg.Log.GetSink() == nil {
		cfg.Log = logr.Discard()
	}
	cfg.Log = cfg.Log.WithValues("node", cfg.Node)
	js, err := jetstream.New(cfg.Conn, jetstream.WithPublishAsyncMaxPending(1024), jetstream.WithPublishAsyncTimeout(10*time.Second))
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	if err := EnsureStream(ctx, js, cfg.Names); err != nil {
		return nil, err
	}
	kv, err := ensureBucket(ctx, js, cfg.Names)
	if err != nil {
		return nil, err
	}
	nctx, cancel := context.WithCancel(context.Background())
	n := &Node{
		Engine: cfg.Engine, cfg: cfg, js: js, kv: kv, store: cfg.Store,
		pub: newPublisher(js, cfg.Node, cfg.Window, cfg.Log),
		ctx: nctx, cancel: cancel, done: make(chan struct{}), seqCh: make(chan struct{}),
		creators: map[string]string{},
	}
	var filters []string
	for _, p := range cfg.Peers {
		if p != cfg.Node {
			filters = append(filters, cfg.Names.Events(p), cfg.Names.Data(p))
		}
	}
	go n.pub.run(nctx)
	if len(filters) == 0 {
		close(n.done)
		return n, nil
	}
	cons, err := js.OrderedConsumer(ctx, cfg.Names.Stream, jetstream.OrderedConsumerConfig{FilterSubjects: filters})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("consumer of %s: %w", cfg.Names.Stream, err)
	}
	go n.consume(cons)
	return n, nil
}

// EnsureStream creates the workflow's stream if it does not exist.
func EnsureStream(ctx context.Context, js jetstream.JetStream, names Names) error {
	_, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:       names.Stream,
		Subjects:   []string{names.All()},
		Storage:    jetstream.FileStorage,
		Retention:  jetstream.LimitsPolicy,
		Duplicates: 2 * time.Minute,
		MaxMsgSize: MaxChunk + 64<<10,
	})
	if err != nil {
		return fmt.Errorf("creating stream %s: %w", names.Stream, err)
	}
	return nil
}

// DeleteStream removes the workflow's stream and KV bucket (when the workflow is cleaned
// up).
func DeleteStream(ctx context.Context, js jetstream.JetStream, names Names) error {
	if err := js.DeleteStream(ctx, names.Stream); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("deleting stream %s: %w", names.Stream, err)
	}
	if err := js.DeleteKeyValue(ctx, names.Bucket); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
		return fmt.Errorf("deleting KV bucket %s: %w", names.Bucket, err)
	}
	return nil
}

// Stop stops applying and publishing. Call Sync first to be sure everything published
// is stored.
func (n *Node) Stop() {
	n.pub.close()
	n.cancel()
	<-n.done
}

// Sync blocks until every message this node published is acknowledged by the server.
func (n *Node) Sync(ctx context.Context) error { return n.pub.sync(ctx) }

// Counters returns the node's transport counters.
func (n *Node) Counters() Counters {
	n.pub.mu.Lock()
	pub, retries := n.pub.published, n.pub.retries
	n.pub.mu.Unlock()
	return Counters{BytesPublished: pub, BytesReceived: n.received.Load(), Applied: n.applied.Load(), Rejected: n.rejected.Load(), Republished: retries}
}

// CaughtUp blocks until this node has applied every message the other peers published up
// to now (after they synced): the last stream sequence of their subjects.
func (n *Node) CaughtUp(ctx context.Context) error {
	stream, err := n.js.Stream(ctx, n.cfg.Names.Stream)
	if err != nil {
		return fmt.Errorf("stream %s: %w", n.cfg.Names.Stream, err)
	}
	var target uint64
	for _, p := range n.cfg.Peers {
		if p == n.cfg.Node {
			continue
		}
		for _, subj := range []string{n.cfg.Names.Events(p), n.cfg.Names.Data(p)} {
			m, err := stream.GetLastMsgForSubject(ctx, subj)
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				continue
			}
			if err != nil {
				return fmt.Errorf("last message of %s: %w", subj, err)
			}
			if m.Sequence > target {
				target = m.Sequence
			}
		}
	}
	for {
		n.seqMu.Lock()
		ch := n.seqCh
		n.seqMu.Unlock()
		if n.lastSeq.Load() >= target {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("node %s applied up to %d of %d: %w", n.cfg.Node, n.lastSeq.Load(), target, ctx.Err())
		}
	}
}

func (n *Node) send(m *Message) {
	subj := n.cfg.Names.Events(n.cfg.Node)
	if m.Kind == KindData {
		subj = n.cfg.Names.Data(n.cfg.Node)
	}
	m.Node = n.cfg.Node
	if err := n.pub.publish(n.ctx, Encode(subj, m)); err != nil {
		n.cfg.Log.Error(err, "event not published", "kind", m.Kind, "path", m.Path)
	}
}

// The event methods apply to the local engine first (local readers never wait on NATS),
// then publish. Paths no rule governs are plain node-local files and are not published.

// Create records and publishes a creation.
func (n *Node) Create(p string, dir bool) error {
	err := n.Engine.Create(p, dir)
	if err != semantics.ErrNotGoverned {
		n.setCreator(p, n.cfg.Node)
		n.send(&Message{Kind: KindCreate, Path: p, Dir: dir})
	}
	return err
}

// Creator returns the node that created p first, as far as this node knows ("" if none).
func (n *Node) Creator(p string) string {
	n.creatorMu.Lock()
	defer n.creatorMu.Unlock()
	return n.creators[p]
}

func (n *Node) setCreator(p, node string) {
	n.creatorMu.Lock()
	defer n.creatorMu.Unlock()
	if _, ok := n.creators[p]; !ok {
		n.creators[p] = node
	}
}

// Wrote publishes the bytes a view wrote at off of p (streamfs.DataSink); data is copied.
func (n *Node) Wrote(p string, off int64, data []byte) {
	if !n.Rules().Resolve(p).Managed() {
		return
	}
	for len(data) > 0 {
		k := len(data)
		if k > MaxChunk {
			k = MaxChunk
		}
		n.send(&Message{Kind: KindData, Path: p, Offset: off, Data: append([]byte(nil), data[:k]...)})
		data, off = data[k:], off+int64(k)
	}
}

// Truncate records and publishes a truncation.
func (n *Node) Truncate(p string, size int64) error {
	err := n.Engine.Truncate(p, size)
	if err == nil {
		n.send(&Message{Kind: KindTruncate, Path: p, Size: size})
	}
	return err
}

// Close records and publishes one close.
func (n *Node) Close(p string) error {
	err := n.Engine.Close(p)
	if err == nil {
		n.send(&Message{Kind: KindClose, Path: p})
	}
	return err
}

// Rename records and publishes a rename.
func (n *Node) Rename(oldPath, newPath string, size int64) error {
	err := n.Engine.Rename(oldPath, newPath, size)
	if err == nil {
		n.setCreator(newPath, n.cfg.Node)
		n.send(&Message{Kind: KindRename, Path: oldPath, NewPath: newPath, Size: size})
	}
	return err
}

// Remove records and publishes an unlink.
func (n *Node) Remove(p string) error {
	err := n.Engine.Remove(p)
	if err == nil {
		n.send(&Message{Kind: KindRemove, Path: p})
	}
	return err
}

// Terminate records and publishes that step[instance] (running on this node) exited.
func (n *Node) Terminate(step string, instance int) {
	n.Engine.Terminate(step, instance)
	n.send(&Message{Kind: KindTerminate, Step: step, Instance: instance})
	n.recordTermination(step, instance)
}

// Name returns the node's name.
func (n *Node) Name() string { return n.cfg.Node }

// consume applies the other peers' messages in stream order until the node closes.
func (n *Node) consume(cons jetstream.Consumer) {
	defer close(n.done)
	// Pull at most 16 MiB at a time: a nats.go subscription holds at most 64 MiB pending by
	// default, and a pull that fills it makes the client drop messages, which an ordered
	// consumer repairs only by resetting itself — measured as stalls of 2 to 40 s.
	it, err := cons.Messages(jetstream.PullMaxBytes(16<<20), jetstream.PullHeartbeat(5*time.Second))
	if err != nil {
		n.cfg.Log.Error(err, "consuming the workflow stream")
		return
	}
	go func() { <-n.ctx.Done(); it.Stop() }()
	files := newFileCache()
	defer files.closeAll()
	for {
		msg, err := it.Next()
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) || n.ctx.Err() != nil {
				return
			}
			n.cfg.Log.Info("stream consumer error; continuing", "err", err.Error())
			continue
		}
		if err := n.apply(msg, files); err != nil {
			n.rejected.Add(1)
			n.cfg.Log.Info("message rejected", "subject", msg.Subject(), "err", err.Error())
		} else {
			n.applied.Add(1)
		}
		if md, err := msg.Metadata(); err == nil {
			n.lastSeq.Store(md.Sequence.Stream)
			n.seqMu.Lock()
			close(n.seqCh)
			n.seqCh = make(chan struct{})
			n.seqMu.Unlock()
		}
	}
}

// apply applies one message of another node to this node's store and engine.
func (n *Node) apply(jm jetstream.Msg, files *fileCache) error {
	m, err := Decode(&nats.Msg{Subject: jm.Subject(), Header: jm.Headers(), Data: jm.Data()})
	if err != nil {
		return err
	}
	if m.Node == n.cfg.Node {
		return nil // our own, applied when it happened
	}
	if m.Kind != KindTerminate && !n.Rules().Resolve(m.Path).Managed() {
		return fmt.Errorf("%s of %q: no rule governs it; plain files are never sent", m.Kind, m.Path)
	}
	switch m.Kind {
	case KindCreate:
		sp, err := n.store.Path(m.Path)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(sp), 0o755); err != nil {
			return err
		}
		if m.Dir {
			if err := os.MkdirAll(sp, 0o755); err != nil {
				return err
			}
		} else if f, err := os.OpenFile(sp, os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
			f.Close()
		} else {
			return err
		}
		n.setCreator(m.Path, m.Node)
		if err := n.Engine.Create(m.Path, m.Dir); err != nil {
			return err
		}
	case KindData:
		if n.Engine.Failed(m.Path) != nil {
			return nil // already reported
		}
		if st := n.Engine.Status(m.Path); st.Committed {
			return fmt.Errorf("data for %q at %d: the file is committed", m.Path, m.Offset)
		}
		end := m.Offset + int64(len(m.Data))
		if err := n.store.Reserve(n.ctx, m.Path, end); err != nil {
			n.Engine.Fail(m.Path, fmt.Errorf("%w: %v", ErrUnavailable, err))
			return fmt.Errorf("storing %d bytes of %q: %w", len(m.Data), m.Path, err)
		}
		f, err := files.get(n.store, m.Path)
		if err != nil {
			return err
		}
		if _, err := f.WriteAt(m.Data, m.Offset); err != nil {
			return fmt.Errorf("writing %q at %d: %w", m.Path, m.Offset, err)
		}
		n.received.Add(int64(len(m.Data)))
		return n.Engine.Write(m.Path, m.Offset, int64(len(m.Data)))
	case KindTruncate:
		sp, err := n.store.Path(m.Path)
		if err != nil {
			return err
		}
		if err := os.Truncate(sp, m.Size); err != nil {
			return err
		}
		n.store.Resize(m.Path, m.Size)
		return n.Engine.Truncate(m.Path, m.Size)
	case KindClose:
		return n.Engine.Close(m.Path)
	case KindRename:
		if !n.Rules().Resolve(m.NewPath).Managed() {
			return fmt.Errorf("rename onto %q: no rule governs it", m.NewPath)
		}
		from, err := n.store.Path(m.Path)
		if err != nil {
			return err
		}
		to, err := n.store.Path(m.NewPath)
		if err != nil {
			return err
		}
		files.drop(m.Path)
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			return err
		}
		if err := os.Rename(from, to); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		n.store.Rename(m.Path, m.NewPath)
		n.setCreator(m.NewPath, m.Node)
		return n.Engine.Rename(m.Path, m.NewPath, m.Size)
	case KindRemove:
		sp, err := n.store.Path(m.Path)
		if err != nil {
			return err
		}
		files.drop(m.Path)
		if err := syscall.Unlink(sp); err != nil && err != syscall.ENOENT {
			return err
		}
		n.store.Forget(m.Path)
		return n.Engine.Remove(m.Path)
	case KindTerminate:
		if _, ok := n.Rules().Step(m.Step); !ok {
			return fmt.Errorf("termination of unknown step %q", m.Step)
		}
		n.Engine.Terminate(m.Step, m.Instance)
	}
	return nil
}

// fileCache keeps the store files being materialised open between chunks.
type fileCache struct {
	files map[string]*os.File
}

func newFileCache() *fileCache { return &fileCache{files: map[string]*os.File{}} }

func (c *fileCache) get(st *store.Store, p string) (*os.File, error) {
	if f, ok := c.files[p]; ok {
		return f, nil
	}
	sp, err := st.Path(p)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(sp), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(sp, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	if len(c.files) >= 256 {
		c.closeAll()
	}
	c.files[p] = f
	return f, nil
}

func (c *fileCache) drop(p string) {
	if f, ok := c.files[p]; ok {
		f.Close()
		delete(c.files, p)
	}
}

func (c *fileCache) closeAll() {
	for p, f := range c.files {
		f.Close()
		delete(c.files, p)
	}
}
