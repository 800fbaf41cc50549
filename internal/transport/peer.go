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

	"github.com/sluice-io/sluice/api/v1alpha1"
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
	creators  map[string]string // path -> peer that created it (home node policy Create)
	departed  map[string]bool   // peers that published a termination
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
		creators: map[string]string{},
		departed: map[string]bool{},
	}
	n.pub.stream, n.pub.onRefused = cfg.Names.Stream, n.refused
	n.conn = watchConn(nctx, cfg.Conn, &n.wg)
	n.fetcher = newFetcher(fetcherDeps{
		ctx: nctx, conn: cfg.Conn, lives: n.conn, names: cfg.Names, host: cfg.Host, timeout: cfg.FetchTimeout,
		engine: cfg.Engine, node: cfg.Store, state: host, followed: n.followed, received: &n.received, log: cfg.Log, kv: kv,
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
// headers-only or with payloads.
func (n *Peer) consumer(ctx context.Context, start uint64, headersOnly bool) (jetstream.Consumer, error) {
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{n.cfg.Names.All()}, HeadersOnly: headersOnly}
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

func (n *Peer) send(m *Message) {
	subj := n.cfg.Names.Events(n.cfg.Node)
	if m.Kind == KindData || m.Kind == KindExtent {
		subj = n.cfg.Names.Data(n.cfg.Host, n.cfg.Node)
	}
	m.Node, m.Host, m.Incarnation = n.cfg.Node, n.cfg.Host, n.incarnation
	n.fetcher.track(m) // at once, as the engine: a rename here moves what is known of the bytes
	if err := n.pub.publish(n.ctx, Encode(subj, m)); err != nil {
		var re *RefusedError
		switch {
		case errors.As(err, &re) && m.Kind == KindTerminate:
			// The instance's outputs are incomplete elsewhere: it ends failed there.
			if m.Reason == "" {
				m.Reason = refusedReason(re)
			}
			n.publishPast(m)
			return
		case errors.As(err, &re): // logged once; the files it touches fail
			if m.Path != "" && n.engine.Poisoned(m.Path) == nil {
				n.refused(re, []string{m.Path})
			}
			return
		}
		n.cfg.Log.Error(err, "event not published", "kind", m.Kind, "path", m.Path)
	}
}

// refused fails the files whose messages the stream refused, or the publisher dropped
// after a refusal (publisher.fail): poisoned here, so that they never commit and their
// readers here get the error, and on the other hosts by a poison message published past
// the publisher (publishPast). A file committed here before the refusal was known keeps
// its commit here, where all its bytes are; the other hosts never see it commit.
func (n *Peer) refused(re *RefusedError, paths []string) {
	reason := refusedReason(re)
	for _, p := range paths {
		if err := n.engine.Poison(p, reason); errors.Is(err, semantics.ErrCommitted) {
			n.cfg.Log.Error(re, "a file committed here before its events were refused: the other hosts never commit it",
				"stream", n.cfg.Names.Stream, "path", pathpattern.Printable(p))
		}
		n.publishPast(&Message{Kind: KindPoison, Path: p, Reason: reason})
	}
}

// refusedReason is the reason of the poisons and failed terminations a refusal causes.
func refusedReason(re *RefusedError) string {
	reason := fmt.Sprintf("the workflow's stream %s refused its events: %s", re.Stream, re.Limit)
	if len(reason) > MaxReason {
		reason = reason[:MaxReason]
	}
	return reason
}

// publishPast publishes m at once, after a refusal, bypassing the publisher that sends
// nothing more: a poison or a failed termination, which tell the other hosts that what
// this peer did is incomplete. It is best effort: a stream full to the last bytes refuses
// it too, which is logged.
func (n *Peer) publishPast(m *Message) {
	m.Node, m.Host, m.Incarnation = n.cfg.Node, n.cfg.Host, n.incarnation
	ctx, cancel := context.WithTimeout(n.ctx, 5*time.Second)
	defer cancel()
	if _, err := n.js.PublishMsg(ctx, Encode(n.cfg.Names.Events(n.cfg.Node), m)); err != nil {
		n.cfg.Log.Error(err, "after a refusal, the other hosts could not be told: they may wait on this peer until their timeouts",
			"stream", n.cfg.Names.Stream, "kind", m.Kind, "path", pathpattern.Printable(m.Path), "step", m.Step, "instance", m.Instance)
	}
}

// The event methods apply to the local engine first (local readers never wait on NATS),
// then publish. Paths no rule governs are plain node-local files and are not published.

// Create records and publishes a creation. A creation the engine refused (a committed
// file, ErrCommitted) or that no rule governs is not published. Once the stream refused
// a message of this peer (RefusedError) a new file is poisoned at once (send).
func (n *Peer) Create(p string, dir bool) error {
	err := n.engine.Create(p, dir)
	if err == nil {
		n.setCreator(p, n.cfg.Node)
		n.send(&Message{Kind: KindCreate, Path: p, Dir: dir})
	}
	return err
}

// Creator returns the node that created p first, as far as this node knows ("" if none).
func (n *Peer) Creator(p string) string {
	n.creatorMu.Lock()
	defer n.creatorMu.Unlock()
	return n.creators[p]
}

// Departed reports whether peer node has published the termination of a step instance.
// On a cluster every peer is one pod's sidecar serving one instance, so such a peer has
// left (or is leaving) and can no longer act as a home node; under `sluice run` a peer
// serves several instances and this says nothing about it.
func (n *Peer) Departed(node string) bool {
	n.creatorMu.Lock()
	defer n.creatorMu.Unlock()
	return n.departed[node]
}

func (n *Peer) setCreator(p, node string) {
	n.creatorMu.Lock()
	defer n.creatorMu.Unlock()
	if _, ok := n.creators[p]; !ok {
		n.creators[p] = node
	}
}

// Wrote announces the bytes a view wrote at off of p (filestate.DataSink): an extent
// message per MaxChunk, whose bytes this host serves to the fetchers of the hosts that
// read them; with Config.Replicate, or for an output declared `replicate: Stream`, data
// messages carrying a copy of the bytes.
func (n *Peer) Wrote(p string, off int64, data []byte) {
	if !n.Rules().Resolve(p).Governed() {
		return
	}
	for len(data) > 0 {
		k := min(len(data), MaxChunk)
		if n.cfg.Replicate || n.Rules().Resolve(p).Rule.Replicate == v1alpha1.ReplicateStream {
			n.send(&Message{Kind: KindData, Path: p, Offset: off, Data: append([]byte(nil), data[:k]...)})
		} else {
			n.send(&Message{Kind: KindExtent, Path: p, Offset: off, Length: int64(k)})
		}
		data, off = data[k:], off+int64(k)
	}
}

// Truncate records and publishes a truncation.
func (n *Peer) Truncate(p string, size int64) error {
	err := n.engine.Truncate(p, size)
	if err == nil {
		n.send(&Message{Kind: KindTruncate, Path: p, Size: size})
	}
	return err
}

// Close records and publishes one close.
func (n *Peer) Close(p string) error {
	err := n.engine.Close(p)
	if err == nil {
		n.send(&Message{Kind: KindClose, Path: p})
	}
	return err
}

// Rename records and publishes a rename. A rename onto a governed path from one no rule
// governs (the temporary of rsync, install and many editors, ".name.XXXXXX") is published
// as the new file written whole here (wholeFile): the other hosts never heard of the
// temporary, whose writes stay local, so a rename would name a file they do not have.
func (n *Peer) Rename(oldPath, newPath string, size int64) error {
	err := n.engine.Rename(oldPath, newPath, size)
	if err != nil {
		return err
	}
	n.setCreator(newPath, n.cfg.Node)
	if !n.Rules().Resolve(oldPath).Governed() {
		n.wholeFile(newPath, size)
		return nil
	}
	n.send(&Message{Kind: KindRename, Path: oldPath, NewPath: newPath, Size: size})
	return nil
}

// wholeFile publishes that p, of size bytes in this host's store, appeared complete here:
// its creation, its bytes (extents this host serves, or the bytes themselves when p is
// replicated) and one close, as a writer's events would have said. A replicated chunk
// that cannot be read from the store poisons p, so no host takes it for complete.
func (n *Peer) wholeFile(p string, size int64) {
	n.send(&Message{Kind: KindCreate, Path: p})
	res := n.Rules().Resolve(p)
	replicate := n.cfg.Replicate || res.Rule != nil && res.Rule.Replicate == v1alpha1.ReplicateStream
	var f *os.File
	if replicate && size > 0 {
		sp, err := n.store.Path(p)
		if err == nil {
			f, err = os.Open(sp)
		}
		if err != nil {
			_ = n.Poison(p, fmt.Sprintf("reading the renamed file from the node store: %v", err))
			return
		}
		defer f.Close()
	}
	for off := int64(0); off < size; {
		k := min(size-off, MaxChunk)
		if f == nil {
			n.send(&Message{Kind: KindExtent, Path: p, Offset: off, Length: k})
		} else {
			buf := make([]byte, k)
			if _, err := f.ReadAt(buf, off); err != nil {
				_ = n.Poison(p, fmt.Sprintf("reading the renamed file from the node store at %d: %v", off, err))
				return
			}
			n.send(&Message{Kind: KindData, Path: p, Offset: off, Data: buf})
		}
		off += k
	}
	n.send(&Message{Kind: KindClose, Path: p})
}

// Link records and publishes that newPath was made a hard link to the file oldPath of
// size bytes, committed or fixed by the link (streamfs: a step's own uncommitted output);
// on the other hosts the materialiser makes the same link to their copy of oldPath, so
// the bytes travel once.
func (n *Peer) Link(oldPath, newPath string, size int64) error {
	err := n.engine.Link(oldPath, newPath, size)
	if err == nil {
		n.setCreator(newPath, n.cfg.Node)
		n.send(&Message{Kind: KindLink, Path: oldPath, NewPath: newPath, Size: size})
	}
	return err
}

// Symlink records and publishes that p was created as a symbolic link to target; on the
// other hosts the materialiser creates the same link (never following it).
func (n *Peer) Symlink(p, target string) error {
	err := n.engine.Symlink(p, target)
	if err == nil {
		n.setCreator(p, n.cfg.Node)
		n.send(&Message{Kind: KindSymlink, Path: p, Target: target})
	}
	return err
}

// Poison records and publishes that p can never be complete (semantics.Engine.Poison),
// so that no peer commits it, stores it or lets a reader take it for complete.
func (n *Peer) Poison(p, reason string) error {
	err := n.engine.Poison(p, reason)
	if err == nil {
		n.send(&Message{Kind: KindPoison, Path: p, Reason: reason})
	}
	return err
}

// Withdraw records and publishes that p was taken back because the attempt that produced
// it failed (semantics.Engine.Withdraw): every peer forgets it, and every host's
// materialiser removes its copy, so that a retry writes it anew everywhere.
func (n *Peer) Withdraw(p, reason string) error {
	err := n.engine.Withdraw(p, reason)
	if err == nil {
		n.forgetCreator(p)
		n.send(&Message{Kind: KindWithdraw, Path: p, Reason: reason})
		n.recordWithdrawal(p, reason)
	}
	return err
}

// forgetCreator drops the creator of the withdrawn file p: whoever makes it again (the
// retry) becomes its creator, hence its home node.
func (n *Peer) forgetCreator(p string) {
	n.creatorMu.Lock()
	defer n.creatorMu.Unlock()
	delete(n.creators, p)
}

// Remove records and publishes an unlink.
func (n *Peer) Remove(p string) error {
	err := n.engine.Remove(p)
	if err == nil {
		n.send(&Message{Kind: KindRemove, Path: p})
	}
	return err
}

// Terminate records and publishes that step[instance] (running on this node) exited.
func (n *Peer) Terminate(step string, instance int) {
	n.engine.Terminate(step, instance)
	n.send(&Message{Kind: KindTerminate, Step: step, Instance: instance})
	n.recordTermination(step, instance, "")
}

// TerminateFailed records and publishes that step[instance] (running on this node)
// exited for good after a failed attempt, with no retries left, for reason
// (semantics.Engine.TerminateFailed): every node's waits on its outputs end.
func (n *Peer) TerminateFailed(step string, instance int, reason string) {
	if reason == "" {
		reason = "failed"
	}
	n.engine.TerminateFailed(step, instance, reason)
	n.send(&Message{Kind: KindTerminate, Step: step, Instance: instance, Reason: reason})
	n.recordTermination(step, instance, reason)
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
		n.setCreator(m.Path, m.Node)
	case KindRename, KindLink:
		n.setCreator(m.NewPath, m.Node)
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
