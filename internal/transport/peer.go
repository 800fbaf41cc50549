package transport

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"

	"github.com/sluice-io/sluice/internal/filestate"
	"github.com/sluice-io/sluice/internal/pathpattern"
	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/store"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

// Config configures one peer of a workflow's transport.
type Config struct {
	// Conn is the NATS connection; the peer does not close it.
	Conn *nats.Conn
	// Names are the workflow's stream, bucket and subjects (wfmeta.NamesFor).
	Names wfmeta.Names
	// Node is this peer's name, unique in the workflow: a node of `sluice run --nodes`, or
	// a pod's sidecar. Peers join and leave at any time; no list of them is needed.
	Node string
	// Host is the host whose node store this peer shares (a Kubernetes node); empty means
	// the peer is alone on its host (Host = Node).
	Host string
	// StateDir holds what the peers of one host share about its materialiser (lock,
	// progress, failures); it must be set when several peers share Host, and be the same
	// directory for all of them. Empty: the peer is its host's only peer.
	StateDir string
	// Engine is this peer's semantics engine and Store its (host's) node store.
	Engine *semantics.Engine
	Store  *store.Store
	// Window bounds the bytes published but not yet acknowledged (default 64 MiB): the
	// most memory a producer's writes can hold when the server or a consumer is slow.
	Window int64
	// Replicate publishes every byte written into the stream (data messages with
	// payloads), and every host's materialiser stores every file, whether or not anything
	// there reads it. Without it (the default) only where bytes were written travels
	// (extent messages) and a host fetches the bytes its readers read, from the host that
	// wrote them (Fetch): that host's peers must then still run when they are read.
	Replicate bool
	// JournalDir, when set, is a directory of this peer's own that outlives its process
	// (the node's state directory): every message not yet acknowledged is journaled
	// there, and the next life of the same peer publishes again what the stream lacks
	// (Recover). Empty: a killed process loses its unacknowledged messages.
	JournalDir string
	// FetchTimeout is how long a fetch of bytes written on another host may go
	// unanswered before that host is taken for lost and the read fails (default 60 s).
	FetchTimeout time.Duration
	// ServeWait is how long this peer, asked for bytes its host wrote, waits for its host
	// to apply the stream as far as the asking peer has before it answers "ask again"
	// (default 8 s); the asking peer asks again within its FetchTimeout.
	ServeWait time.Duration
	// Provisioned says the workflow's stream and KV bucket were created by someone else
	// (the controller, see wfmeta.EnsureStream and wfmeta.EnsureBucket): the peer only looks them up, so
	// its credentials need no right to create or change streams.
	Provisioned bool
	// Limits bound the stream and bucket the peer creates when not Provisioned (zero:
	// unbounded, as for the embedded server of one `sluice run`).
	Limits wfmeta.Limits
	// Log receives rejected messages and publish retries.
	Log logr.Logger
}

// Counters are a peer's transport counters.
type Counters struct {
	// BytesPublished are data bytes this peer's writers wrote and it announced
	// (acknowledged; with Config.Replicate, published with their payloads); BytesReceived
	// data bytes of other hosts it stored as its host's materialiser (fetched, or
	// replicated); BytesServed data bytes it sent to other hosts' fetchers.
	BytesPublished, BytesReceived, BytesServed int64
	// Applied counts other peers' messages applied to this peer's engine; Rejected those
	// refused (invalid or contradicting the rules) and logged.
	Applied, Rejected int64
	// Republished counts messages sent again after a failed acknowledgement.
	Republished int64
}

// Peer is one end of a workflow's transport: a pod's sidecar, a node of `sluice run
// --nodes`, or a node plugin's store server. It implements filestate.Semantics: the
// peer's views report their events to it, it applies them to the local engine and
// publishes them; it applies the other peers' events to the local engine, once the
// host's materialiser has stored their bytes. It holds the engine rather than embedding
// it: every method of filestate.Semantics is written out here, the mutators publishing
// and the queries delegating (engine.go), so that a mutator added to the engine cannot
// reach the views without publishing.
type Peer struct {
	engine      *semantics.Engine
	cfg         Config
	incarnation string
	js          jetstream.JetStream
	kv          jetstream.KeyValue
	pub         *publisher
	store       *store.Store
	host        hostState

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	conn   *connLives // lives of cfg.Conn: a request lost with one is asked again at once

	received, served, applied, rejected atomic.Int64
	fetcher                             *fetcher    // where the bytes of files written elsewhere are
	fetching                            atomic.Bool // this peer is its host's materialiser, hence its fetcher
	serving                             *nats.Subscription
	statsMu                             sync.Mutex
	lastStats                           []byte          // the wfmeta.PodStats RecordStats wrote last
	followed                            *progressSignal // last stream sequence the engine follower handled

	leftover *leftover // what earlier lives journaled (Config.JournalDir)
	seenMu   sync.Mutex
	seen     map[string]bool // message IDs of earlier lives found in the stream

	creatorMu sync.Mutex
	creators  map[string]creator // path -> the peer that created it (home node policy Create)
	departed  map[string]bool    // peers that published a termination
}

var (
	_ filestate.Semantics = (*Peer)(nil)
	_ filestate.DataSink  = (*Peer)(nil)
	_ filestate.Fetcher   = (*Peer)(nil)
)

// ErrUnavailable is returned by waits on a file whose bytes this host could not store
// (its node store is full).
var ErrUnavailable = errors.New("the file's bytes could not be stored on this node")

// Start joins the workflow's transport: it creates the stream and bucket on first use
// (file storage, 2 min duplicate window), starts publishing this peer's events, follows
// the whole stream from its beginning with the peer's engine, and competes to be its
// host's materialiser.
func Start(ctx context.Context, cfg Config) (*Peer, error) {
	if cfg.Window <= 0 {
		cfg.Window = 64 << 20
	}
	if cfg.FetchTimeout <= 0 {
		cfg.FetchTimeout = fetchTimeout
	}
	if cfg.ServeWait <= 0 {
		cfg.ServeWait = serveWait
	}
	if cfg.Host == "" {
		cfg.Host = cfg.Node
	}
	if cfg.Log.GetSink() == nil {
		cfg.Log = logr.Discard()
	}
	cfg.Log = cfg.Log.WithValues("peer", cfg.Node, "host", cfg.Host)
	js, err := jetstream.New(cfg.Conn, jetstream.WithPublishAsyncMaxPending(1024), jetstream.WithPublishAsyncTimeout(10*time.Second))
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	var kv jetstream.KeyValue
	if cfg.Provisioned {
		if _, err := js.Stream(ctx, cfg.Names.Stream); err != nil {
			return nil, fmt.Errorf("looking up stream %s: %w", cfg.Names.Stream, err)
		}
		if kv, err = js.KeyValue(ctx, cfg.Names.Bucket); err != nil {
			return nil, fmt.Errorf("looking up KV bucket %s: %w", cfg.Names.Bucket, err)
		}
	} else {
		if err := wfmeta.EnsureStream(ctx, js, cfg.Names, cfg.Limits); err != nil {
			return nil, err
		}
		if kv, err = wfmeta.EnsureBucket(ctx, js, cfg.Names, cfg.Limits); err != nil {
			return nil, err
		}
	}
	var host hostState = newMemHost()
	if cfg.StateDir != "" {
		dh, err := openDirHost(cfg.StateDir)
		if err != nil {
			return nil, err
		}
		host = dh
	}
	incarnation := nuid.Next()
	nctx, cancel := context.WithCancel(context.Background())
	n := &Peer{
		engine: cfg.Engine, cfg: cfg, incarnation: incarnation, js: js, kv: kv, store: cfg.Store, host: host,
		pub: newPublisher(js, incarnation, cfg.Window, cfg.Log),
		ctx: nctx, cancel: cancel, followed: newProgressSignal(),
		creators: map[string]creator{},
		departed: map[string]bool{},
	}
	n.pub.stream, n.pub.onRefused = cfg.Names.Stream, n.refused
	n.conn = watchConn(nctx, cfg.Conn, &n.wg)
	n.fetcher = newFetcher(fetcherDeps{
		ctx: nctx, conn: cfg.Conn, lives: n.conn, names: cfg.Names, host: cfg.Host, timeout: cfg.FetchTimeout,
		engine: cfg.Engine, node: cfg.Store, state: host, followed: n.followed, received: &n.received, active: &n.fetching, log: cfg.Log, kv: kv,
	})
	if cfg.JournalDir != "" {
		if n.leftover, err = readLeftovers(cfg.JournalDir, incarnation); err != nil {
			cancel()
			host.Close()
			return nil, err
		}
		n.seen = map[string]bool{}
		if n.pub.journal, err = openJournal(cfg.JournalDir, incarnation); err != nil {
			cancel()
			host.Close()
			return nil, err
		}
	}
	if n.serving, err = n.serve(); err != nil {
		cancel()
		host.Close()
		return nil, err
	}
	follower, err := n.consumer(ctx, 1, true)
	if err != nil {
		_ = n.serving.Unsubscribe()
		cancel()
		host.Close()
		return nil, err
	}
	n.wg.Add(3)
	go func() { defer n.wg.Done(); n.pub.run(nctx) }()
	go func() { defer n.wg.Done(); n.follow(follower) }()
	go func() { defer n.wg.Done(); n.materialise() }()
	return n, nil
}

// consumer creates an ordered consumer of the whole workflow stream from sequence start,
// headers-only or with payloads: an ephemeral consumer, which the server removes once
// unused for wfmeta.OrderedInactive.
func (n *Peer) consumer(ctx context.Context, start uint64, headersOnly bool) (jetstream.Consumer, error) {
	// An inactivity threshold within the stream's (wfmeta.ConsumerInactive): the server
	// removes the consumer of a peer that is gone, and refuses nats.go's default of 5 min.
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{n.cfg.Names.All()}, HeadersOnly: headersOnly, InactiveThreshold: wfmeta.OrderedInactive}
	if start > 1 {
		cfg.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
		cfg.OptStartSeq = start
	}
	cons, err := n.js.OrderedConsumer(ctx, n.cfg.Names.Stream, cfg)
	if err != nil {
		return nil, fmt.Errorf("consumer of %s from %d: %w", n.cfg.Names.Stream, start, err)
	}
	return cons, nil
}

// Stop stops applying and publishing, and gives up the materialiser role. Call Sync
// first to be sure everything published is stored.
func (n *Peer) Stop() {
	n.pub.close()
	_ = n.serving.Unsubscribe()
	n.cancel()
	n.wg.Wait()
	n.host.Close()
	if j := n.pub.journal; j != nil {
		j.close() // what it holds stays for the next life (Recover)
		if j.off == 0 {
			_ = os.Remove(j.f.Name())
		}
	}
}

// Recover publishes again, in their order, the messages this peer's earlier lives
// journaled (Config.JournalDir) that the stream lacks: their process was killed before
// the server acknowledged them. It waits until the peer has applied the stream as it is
// (CaughtUp), so a message is published again only if it is not there, whatever the
// server's duplicate window; then it removes those journals. Call it once, before the
// peer's views serve. It returns how many messages it published again.
func (n *Peer) Recover(ctx context.Context) (int, error) {
	lo := n.leftover
	if lo == nil || len(lo.files) == 0 {
		return 0, nil
	}
	if err := n.CaughtUp(ctx); err != nil {
		return 0, err
	}
	n.seenMu.Lock()
	var missing []*nats.Msg
	for _, m := range lo.msgs {
		if !n.seen[msgID(m.Header)] {
			missing = append(missing, m)
		}
	}
	n.seenMu.Unlock()
	for _, m := range missing {
		if err := n.pub.publishMsg(ctx, m, true); err != nil {
			return 0, err
		}
	}
	if err := n.pub.sync(ctx); err != nil {
		return 0, err
	}
	for _, f := range lo.files {
		if err := os.Remove(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			return len(missing), fmt.Errorf("removing an earlier life's journal: %w", err)
		}
	}
	if len(missing) > 0 {
		n.cfg.Log.Info("published again what an earlier life of this peer had not had acknowledged", "messages", len(missing))
	}
	return len(missing), nil
}

// Sync blocks until every message this peer published is acknowledged by the server.
func (n *Peer) Sync(ctx context.Context) error { return n.pub.sync(ctx) }

// Counters returns the peer's transport counters.
func (n *Peer) Counters() Counters {
	n.pub.mu.Lock()
	pub, retries := n.pub.published, n.pub.retries
	n.pub.mu.Unlock()
	return Counters{BytesPublished: pub, BytesReceived: n.received.Load(), BytesServed: n.served.Load(), Applied: n.applied.Load(), Rejected: n.rejected.Load(), Republished: retries}
}

// CaughtUp blocks until this peer's engine has applied every message in the stream at
// the time of the call (call it after the other peers synced).
func (n *Peer) CaughtUp(ctx context.Context) error {
	stream, err := n.js.Stream(ctx, n.cfg.Names.Stream)
	if err != nil {
		return fmt.Errorf("stream %s: %w", n.cfg.Names.Stream, err)
	}
	target := stream.CachedInfo().State.LastSeq
	if err := n.followed.wait(ctx, target); err != nil {
		return fmt.Errorf("peer %s: %w", n.cfg.Node, err)
	}
	return nil
}

// Name returns the peer's name.
func (n *Peer) Name() string { return n.cfg.Node }

// Host returns the host whose node store the peer shares.
func (n *Peer) Host() string { return n.cfg.Host }

// follow applies the other peers' messages to this peer's engine, in stream order, from
// a headers-only consumer: bytes never travel to a peer that is not its host's
// materialiser. A message of another host is applied only once the materialiser has
// stored everything up to it, so that whatever the engine lets a reader read is in the
// node store.
func (n *Peer) follow(cons jetstream.Consumer) {
	n.consume(cons, "following the workflow stream", []jetstream.PullMessagesOpt{jetstream.PullMaxMessages(4096)},
		func(msg jetstream.Msg, seq uint64) bool {
			if err := n.applyEvent(msg, seq); err != nil {
				if n.ctx.Err() != nil {
					return false
				}
				n.rejected.Add(1)
				n.cfg.Log.Info("message rejected", "subject", msg.Subject(), "seq", seq, "err", err.Error())
			}
			n.followed.advance(seq)
			return true
		})
}

// consume hands every message of cons, with its stream sequence, to handle until the
// peer stops or handle returns false; consumer errors are logged as what and skipped
// (the ordered consumer repairs itself).
func (n *Peer) consume(cons jetstream.Consumer, what string, opts []jetstream.PullMessagesOpt, handle func(jetstream.Msg, uint64) bool) {
	it, err := cons.Messages(append(opts, jetstream.PullHeartbeat(consumerHeartbeat))...)
	if err != nil {
		n.cfg.Log.Error(err, what)
		return
	}
	go func() { <-n.ctx.Done(); it.Stop() }()
	for {
		msg, err := it.Next()
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) || n.ctx.Err() != nil {
				return
			}
			n.cfg.Log.Info("consumer error; continuing", "consumer", what, "err", err.Error())
			continue
		}
		md, err := msg.Metadata()
		if err != nil {
			continue
		}
		if !handle(msg, md.Sequence.Stream) {
			return
		}
	}
}

// applyEvent applies one message to this peer's engine.
func (n *Peer) applyEvent(jm jetstream.Msg, seq uint64) error {
	m, err := Decode(&nats.Msg{Subject: jm.Subject(), Header: jm.Headers()})
	if err != nil {
		return err
	}
	if m.Incarnation != "" && m.Incarnation == n.incarnation {
		return nil // our own, applied when it happened
	}
	if lo := n.leftover; lo != nil && lo.incarnations[m.Incarnation] {
		n.seenMu.Lock()
		n.seen[msgID(jm.Headers())] = true
		n.seenMu.Unlock()
	}
	if m.Host != n.cfg.Host {
		if err := n.host.WaitProgress(n.ctx, seq); err != nil {
			return err
		}
		if m.Kind == KindData || m.Kind == KindExtent {
			if reason := n.host.Failed(m.Path); reason != "" {
				n.engine.Fail(m.Path, fmt.Errorf("%w: %s", ErrUnavailable, reason))
				return nil
			}
		}
	}
	// Before the engine lets a reader at the bytes: where they are, to fetch them.
	n.fetcher.track(m)
	if m.Kind == KindTerminate {
		// Before the engine sees it: the commits it causes may need a new home.
		n.creatorMu.Lock()
		n.departed[m.Node] = true
		n.creatorMu.Unlock()
	}
	if err := applyToEngine(n.engine, n.Rules(), m); err != nil {
		return err
	}
	switch m.Kind {
	case KindCreate, KindSymlink:
		n.setCreator(m.Path, m.Node, m.Host)
	case KindRename, KindLink:
		n.setCreator(m.NewPath, m.Node, m.Host)
	case KindWithdraw:
		n.forgetCreator(m.Path)
	}
	n.applied.Add(1)
	return nil
}

// applyToEngine applies a decoded message to an engine (the rules' checks of the wire
// included); it touches no file.
func applyToEngine(e *semantics.Engine, rules *semantics.RuleSet, m *Message) error {
	if m.Kind != KindTerminate && !rules.Resolve(m.Path).Governed() {
		return fmt.Errorf("%s of %q: no rule governs it; plain files are never sent", m.Kind, m.Path)
	}
	switch m.Kind {
	case KindCreate:
		return e.Create(m.Path, m.Dir)
	case KindData, KindExtent:
		if e.Failed(m.Path) != nil {
			return nil // already reported
		}
		if st := e.Status(m.Path); st.Committed {
			return fmt.Errorf("data for %q at %d: the file is committed", m.Path, m.Offset)
		}
		return e.Write(m.Path, m.Offset, m.Length)
	case KindTruncate:
		return e.Truncate(m.Path, m.Size)
	case KindClose:
		if errors.Is(e.Poisoned(m.Path), semantics.ErrPoisoned) {
			return nil // a close after the poison (it did not count where it happened)
		}
		return e.Close(m.Path)
	case KindSymlink:
		return e.Symlink(m.Path, m.Target)
	case KindPoison:
		if err := e.Poison(m.Path, m.Reason); err != nil && !errors.Is(err, semantics.ErrCommitted) {
			return err
		}
		return nil
	case KindRename:
		if !rules.Resolve(m.NewPath).Governed() {
			return fmt.Errorf("rename onto %q: no rule governs it", m.NewPath)
		}
		return e.Rename(m.Path, m.NewPath, m.Size)
	case KindLink:
		if !rules.Resolve(m.NewPath).Governed() {
			return fmt.Errorf("link %q: no rule governs it", m.NewPath)
		}
		return e.Link(m.Path, m.NewPath, m.Size)
	case KindRemove:
		return e.Remove(m.Path)
	case KindWithdraw:
		return e.Withdraw(m.Path, m.Reason)
	case KindTerminate:
		if _, ok := rules.Step(m.Step); !ok {
			return fmt.Errorf("termination of unknown step %q", m.Step)
		}
		if m.Reason != "" {
			e.TerminateFailed(m.Step, m.Instance, m.Reason)
		} else {
			e.Terminate(m.Step, m.Instance)
		}
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
	if err := st.MkdirAll(pathpattern.Parent(p)); err != nil {
		return nil, err
	}
	f, err := st.OpenFile(p, os.O_CREATE|os.O_WRONLY, 0o644)
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
