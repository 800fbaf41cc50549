package transport

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sys/unix"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/byterange"
	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

// The data plane. The stream carries where bytes were written (extent events, without
// payloads); the bytes stay in the store of the host that wrote them until a host whose
// readers need them asks for them. Every peer follows where the bytes of each file are
// (fetcher.track, in stream order, before its engine lets a reader at them). A host's
// materialiser is its fetcher: it asks the holder's peers for the missing ranges over core
// NATS request/reply (wfmeta.Names.Serve, never stored), writes the answers into its node store
// and remembers what it holds, so a file read by several readers of the host is fetched
// once. The other peers of the host ask their materialiser (wfmeta.Names.Ensure) and read the
// store once it answers.

// Data-plane bounds.
const (
	// fetchAhead is how many bytes of known remote extents beyond a read are fetched
	// before anyone reads them (readahead), in bytes.
	fetchAhead = 8 * MaxChunk
	// fetchSlots bounds the requests in flight to one holder host.
	fetchSlots = 8
	// serveSlots bounds the requests one peer serves at once.
	serveSlots = 16
	// fetchTimeout is how long a fetch of one range may go unanswered (requests lost
	// while the NATS connection was down, "no responders" while the holder's peers
	// restart) before its holder is taken for lost (Config.FetchTimeout).
	fetchTimeout = 60 * time.Second
	// consumerHeartbeat is the idle heartbeat of the stream's consumers: a consumer that
	// misses two takes itself for lost and is recreated (nats.go's ordered consumer),
	// which is how it resumes when a NATS server restart left it waiting on a pull the
	// new server never received. At 5 s (nats.go's default) the reader of
	// TestNATSServerKilledMidStream stalled 10 s in 1 run of 10; at 1 s, about 2 s.
	consumerHeartbeat = time.Second
	// attemptTimeout bounds one request; a request unanswered is sent again.
	attemptTimeout = 10 * time.Second
	// lossLookAfter is how long a request to a holder may go unanswered before the fetch
	// looks up whether the controller recorded the file lost with that holder
	// (fetcher.ask): a request answered sooner costs no look-up, and one to a holder
	// recorded lost ends then, not when the attempt times out.
	lossLookAfter = 200 * time.Millisecond
	// serveWait bounds how long a holder waits for its host to apply the namespace
	// changes a request's fetcher has applied (Sluice-Seq); a holder still behind then
	// answers Sluice-Retry, and the fetcher asks again (within its FetchTimeout). It is
	// Config.ServeWait's default.
	serveWait = 8 * time.Second
)

// Data-plane header names.
const (
	hdrSeq   = "Sluice-Seq"
	hdrError = "Sluice-Error"
	hdrEnd   = "Sluice-End"
	hdrRetry = "Sluice-Retry"
	hdrHeld  = "Sluice-Held"
)

// errBehind is a holder's answer while its host has not yet applied the stream as far
// as the request's fetcher has (its materialiser's consumer resuming after a NATS
// server restart): not a fault of the bytes, so the fetcher asks again.
var errBehind = errors.New("the holder's host has not applied the stream that far yet")

// ErrHolderLost is wrapped by a fetch whose holder host does not answer: every peer of
// the node that wrote the bytes is gone (or the node is), so the bytes cannot be read.
var ErrHolderLost = errors.New("no peer of the node holding the bytes answers")

// FetchError is a fetch of bytes written on another host that failed.
type FetchError struct {
	// Path is the file, Host the node holding the bytes [Off, End).
	Path, Host string
	Off, End   int64
	// Err is why.
	Err error
}

func (e *FetchError) Error() string {
	return fmt.Sprintf("bytes %d to %d of %q are on node %q: %v", e.Off, e.End, e.Path, e.Host, e.Err)
}

func (e *FetchError) Unwrap() error { return e.Err }

// holding is what a host's fetcher knows of one file's bytes: the ranges other hosts
// wrote (and serve), and which of them are in this host's store already.
type holding struct {
	remote   holders
	local    byterange.Set      // written on this host, or fetched
	size     int64              // the end of the furthest write, or the last truncation
	last     string             // the last other host that wrote to the file ("" if none)
	inflight map[int64]*fetchOp // by chunk index (offset / MaxChunk)
	// wroteHere says bytes of the file were written on this host.
	wroteHere bool
	// readTo is the end of the furthest range a reader of this host had fetched (0:
	// none read): the host's fetcher fetches the extents that arrive within fetchAhead
	// of it as they arrive (track), not at the reader's next read.
	readTo int64
}

// wanted returns the ranges of [off, end) to fetch, with their holders. Before the file
// commits, those another host wrote and that are not here. Once it is committed
// (complete), every byte of it not here and not a hole this host wrote: a range of which
// no extent arrived (a server that lost acknowledged messages when it was killed) is
// asked of the last host that wrote to the file, so a committed file is never read with
// holes where another host wrote bytes.
func (h *holding) wanted(off, end int64, committed bool) []held {
	var out []held
	if !committed || h.last == "" {
		for _, r := range h.remote.within(off, end) {
			for _, g := range h.local.Gaps(r.Off, r.End) {
				out = append(out, held{g, r.host})
			}
		}
		return out
	}
	for _, g := range h.local.Gaps(off, min(end, h.size)) {
		at := g.Off
		for _, r := range h.remote.within(g.Off, g.End) {
			if r.Off > at {
				out = append(out, held{rng(at, r.Off), h.last})
			}
			out = append(out, r)
			at = r.End
		}
		if at < g.End {
			out = append(out, held{rng(at, g.End), h.last})
		}
	}
	return out
}

// fetchOp fetches the missing remote ranges of one chunk of a file.
type fetchOp struct {
	parts []held
	stale bool // a range of it was written again meanwhile: what it got is not recorded
	done  chan struct{}
	err   error
}

// fetcher knows where the bytes of the files written on other hosts are, and which of
// them this host's store holds; the materialiser's fetches them, and the host's other
// peers ask the materialiser for them (ensureVia).
type fetcher struct {
	fetcherDeps
	mu    sync.Mutex
	files map[string]*holding
	slots map[string]chan struct{} // per holder host, fetchSlots each
	// wmu serialises the writes of fetched bytes into the store (fetcher.store).
	wmu sync.Mutex
	// attempt bounds one request to a holder (attemptTimeout; a test sets it before
	// the peer's first fetch).
	attempt time.Duration
}

// fetcherDeps are what a fetcher uses of its peer (Start builds them): nothing else of
// the peer is within its reach.
type fetcherDeps struct {
	ctx      context.Context // the peer's life: fetches end with it
	conn     *nats.Conn      // the peer's NATS connection (Config.Conn)
	lives    *connLives      // the lives of conn: a request lost with one is asked again
	names    wfmeta.Names    // the workflow's subjects (Serve, Ensure)
	host     string          // this peer's host (Config.Host)
	timeout  time.Duration   // Config.FetchTimeout
	engine   fileStates      // the peer's engine
	node     byteStore       // the host's node store
	state    fetchState      // the host's state: the materialiser's progress, failures
	followed *progressSignal // how far the peer's engine has applied the stream
	received *atomic.Int64   // bytes of other hosts stored here (Counters.BytesReceived)
	// active says this peer is its host's materialiser, hence its fetcher
	// (Peer.fetching): only then does track fetch arriving extents ahead of a reader.
	active *atomic.Bool
	log    logr.Logger
	// kv is the workflow's KV bucket, where the controller records the files lost with
	// their node (wfmeta.LostFile); nil: nothing is looked up.
	kv jetstream.KeyValue
}

// fileStates is what the fetcher asks of the peer's engine: whether a file is governed,
// committed or NoUpdate, and to fail a file whose bytes cannot be stored here.
type fileStates interface {
	Status(p string) semantics.FileStatus
	Fail(p string, err error) bool
}

// byteStore is what the fetcher uses of the host's node store (store.Store): opening a
// file beneath it, and reserving the bytes it writes there.
type byteStore interface {
	Open(p string, flags int, mode uint32) (int, error)
	ReserveAt(ctx context.Context, p string, off, end int64) error
}

// fetchState is what the fetcher uses of the host's state (hostState).
type fetchState interface {
	Progress() uint64
	MarkFailed(p, reason string) error
}

func newFetcher(d fetcherDeps) *fetcher {
	return &fetcher{fetcherDeps: d, files: map[string]*holding{}, slots: map[string]chan struct{}{}, attempt: attemptTimeout}
}

// track records what a message of the stream says about where bytes are. host is the
// message's host; written here (host == this host) means the store has them.
func (f *fetcher) track(m *Message) {
	if m.Kind == KindExtent && m.Host != f.host {
		// Refused by the engine (a file no rule governs, or committed): never fetched.
		if st := f.engine.Status(m.Path); !st.Governed() || st.Committed {
			return
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	here := m.Host == f.host
	switch m.Kind {
	case KindExtent, KindData:
		end := m.Offset + m.Length
		h := f.files[m.Path]
		if h == nil {
			h = &holding{inflight: map[int64]*fetchOp{}}
			f.files[m.Path] = h
		}
		h.size = max(h.size, end)
		if here || m.Kind == KindData { // the bytes are in the store (KindData: the materialiser wrote them)
			h.remote.set(m.Offset, end, "")
			h.local.Add(m.Offset, end)
			h.wroteHere = h.wroteHere || here
			return
		}
		h.last = m.Host
		h.remote.set(m.Offset, end, m.Host)
		h.local.Remove(m.Offset, end)
		for c := m.Offset / MaxChunk; c <= (end-1)/MaxChunk; c++ {
			if op := h.inflight[c]; op != nil && overlaps(op.parts, m.Offset, end) {
				op.stale = true
			}
		}
		if h.readTo > 0 && m.Offset < h.readTo+fetchAhead && f.active != nil && f.active.Load() {
			// A reader of this host is at most fetchAhead behind these bytes: they are
			// fetched now, while the writer goes on, as the reader's next read would
			// have started them (its readahead), so that it finds them here.
			f.start(m.Path, h, m.Offset, min(end, h.readTo+fetchAhead), false)
		}
	case KindTruncate:
		if h := f.files[m.Path]; h != nil {
			h.remote.truncate(m.Size)
			h.local.Truncate(m.Size)
			if m.Size > h.size && h.last == "" {
				h.local.Add(h.size, m.Size) // a hole made here
			}
			h.size = m.Size
		}
	case KindRename:
		delete(f.files, m.NewPath)
		if h := f.files[m.Path]; h != nil {
			f.files[m.NewPath] = h
			delete(f.files, m.Path)
		}
	case KindLink:
		if h := f.files[m.Path]; h != nil {
			f.files[m.NewPath] = h // one inode, two names
		}
	case KindRemove, KindWithdraw:
		delete(f.files, m.Path)
	}
}

// overlaps reports whether any of parts overlaps [off, end).
func overlaps(parts []held, off, end int64) bool {
	for _, p := range parts {
		if p.Off < end && off < p.End {
			return true
		}
	}
	return false
}

// restore marks as held what the store holds of every file with remote ranges, when this
// peer becomes its host's fetcher: the store file's allocated ranges (SEEK_DATA) are
// exactly the bytes fetched before (by a previous materialiser, killed or exited), since
// only fetches write a remote range and growing a file allocates nothing.
func (f *fetcher) restore() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for p, h := range f.files {
		fd, err := f.node.Open(p, syscall.O_RDONLY, 0)
		if err != nil {
			continue
		}
		for _, r := range allocated(fd) {
			for _, x := range h.remote.within(r.Off, r.End) {
				h.local.Add(x.Off, x.End)
			}
		}
		syscall.Close(fd)
	}
}

// allocated returns the data ranges of the open file fd (SEEK_DATA/SEEK_HOLE).
func allocated(fd int) []byterange.Range {
	var out []byterange.Range
	off := int64(0)
	for {
		d, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if err != nil {
			return out // ENXIO: no data beyond off
		}
		h, err := unix.Seek(fd, d, unix.SEEK_HOLE)
		if err != nil {
			return out
		}
		out = append(out, rng(d, h))
		off = h
	}
}

// ensure returns once bytes [off, end) of p are in the host's store, fetching the
// missing ranges from their holders (holding.wanted), and starts fetching up to ahead
// bytes past end. Bytes never written anywhere (holes) need nothing. It fails with a
// *FetchError when a holder does not answer or refuses, or with the store's error when
// the bytes cannot be stored here.
func (f *fetcher) ensure(ctx context.Context, p string, off, end, ahead int64) error {
	for {
		committed := f.engine.Status(p).Committed
		f.mu.Lock()
		h := f.files[p]
		if h == nil {
			f.mu.Unlock()
			return nil
		}
		wait := f.start(p, h, off, end, committed)
		if ahead > 0 {
			f.start(p, h, end, end+ahead, committed)
			h.readTo = max(h.readTo, end)
		}
		f.mu.Unlock()
		if len(wait) == 0 {
			return nil
		}
		for _, op := range wait {
			select {
			case <-op.done:
				if op.err != nil {
					return op.err
				}
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		// Look again: an op that went stale, or a chunk whose newer bytes the op did not
		// cover, is fetched anew.
	}
}

// start starts a fetch of every chunk of [off, end) with remote bytes not held here, and
// returns the ops (new or in flight) that cover them. f.mu is held.
func (f *fetcher) start(p string, h *holding, off, end int64, committed bool) []*fetchOp {
	var wait []*fetchOp
	for c := off / MaxChunk; c*MaxChunk < end; c++ {
		cOff, cEnd := c*MaxChunk, (c+1)*MaxChunk
		if len(h.wanted(max(cOff, off), min(cEnd, end), committed)) == 0 {
			continue
		}
		if op := h.inflight[c]; op != nil {
			wait = append(wait, op)
			continue
		}
		// Fetch every missing remote byte of the chunk at once: fewer, larger requests.
		op := &fetchOp{parts: h.wanted(cOff, cEnd, committed), done: make(chan struct{})}
		h.inflight[c] = op
		wait = append(wait, op)
		fd, err := f.node.Open(p, syscall.O_WRONLY, 0)
		go f.run(p, h, c, op, fd, err)
	}
	return wait
}

// run fetches op's parts into the store file fd (opened when the op started, so a rename
// meanwhile does not matter) and records them as held unless they went stale.
func (f *fetcher) run(p string, h *holding, c int64, op *fetchOp, fd int, err error) {
	if err == nil {
		defer syscall.Close(fd)
		seq := f.state.Progress()
		for _, part := range op.parts {
			if err = f.fetchPart(p, part, fd, seq); err != nil {
				break
			}
		}
	} else {
		err = fmt.Errorf("opening %q in the node store to fetch its bytes: %w", p, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if h.inflight[c] == op {
		delete(h.inflight, c)
	}
	if err == nil && !op.stale {
		for _, part := range op.parts {
			h.local.Add(part.Off, part.End)
		}
	}
	op.err = err
	close(op.done)
}

// fetchPart fetches one range from its holder and writes it at its offset of fd.
func (f *fetcher) fetchPart(p string, part held, fd int, seq uint64) error {
	slot := f.slot(part.host)
	select {
	case slot <- struct{}{}:
	case <-f.ctx.Done():
		return f.ctx.Err()
	}
	defer func() { <-slot }()
	data, err := f.request(p, part, seq)
	if err != nil {
		return err
	}
	if err := f.node.ReserveAt(f.ctx, p, part.Off, part.End); err != nil {
		f.failHere(p, err)
		return fmt.Errorf("%w: storing %d bytes of %q fetched from node %q: %w", ErrUnavailable, len(data), p, part.host, err)
	}
	if k, err := f.store(fd, data, part.Off); err != nil || k != len(data) {
		if err == nil {
			err = syscall.EIO
		}
		f.failHere(p, err)
		return fmt.Errorf("writing %d bytes of %q at %d: %w", len(data), p, part.Off, err)
	}
	f.received.Add(int64(len(data)))
	return nil
}

// store writes fetched bytes at off of the store file fd and gives the file back the
// modification time it had before: bytes fetched are bytes the file already had (written
// on another node), not a change of it, and a program that compares a file's times before
// and after reading it (tar: "file changed as we read it"; htslib: "index file is older
// than the data file") must see them stable while its reads fetch. (The change time cannot
// be set; the views report a committed file's as its modification time, see
// streamfs.node.fillAttr.) Writes and restores are serialised, so that two fetches of
// one file never restore each other's time.
func (f *fetcher) store(fd int, data []byte, off int64) (int, error) {
	f.wmu.Lock()
	defer f.wmu.Unlock()
	var before unix.Stat_t
	statErr := unix.Fstat(fd, &before)
	k, err := unix.Pwrite(fd, data, off)
	if statErr == nil && k > 0 {
		ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, before.Mtim}
		// The bytes are stored whether or not the time could be given back: a failure
		// here (never seen: the peer owns its store's files) costs no reader its bytes.
		_ = unix.UtimesNanoAt(fd, "", ts, unix.AT_EMPTY_PATH)
	}
	return k, err
}

func (f *fetcher) slot(host string) chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.slots[host]
	if s == nil {
		s = make(chan struct{}, fetchSlots)
		f.slots[host] = s
	}
	return s
}

// FetchRequest returns the request for length bytes at offset off of file p (a volume
// path) written on host, asked by a peer that has applied the workflow's stream up to
// sequence seq (the host answers once it has too): the message the data plane sends on
// names.Serve(host). A reply carries the bytes, or a Sluice-Error header.
func FetchRequest(names wfmeta.Names, host, p string, off, length int64, seq uint64) *nats.Msg {
	req := nats.NewMsg(names.Serve(host))
	req.Header.Set(hdrPath, p)
	req.Header.Set(hdrOffset, strconv.FormatInt(off, 10))
	req.Header.Set(hdrLength, strconv.FormatInt(length, 10))
	req.Header.Set(hdrSeq, strconv.FormatUint(seq, 10))
	return req
}

// request asks the peers of part.host for the bytes of part; seq is the stream sequence
// this host has applied, which the holder applies first (a rename on a third host). It
// asks again while nobody answers (a request lost with a NATS connection, "no
// responders" while the holder's peers restart) and while the holder answers that its
// host is behind (Sluice-Retry: its materialiser resuming after a NATS server restart),
// for at most Config.FetchTimeout, then fails with ErrHolderLost or errBehind; at once
// with ErrHolderLost if the controller recorded p lost with part.host (lostWith), which
// it looks up when nobody answers and while a request waits for its answer (ask),
// never only once a request has timed out. A request sent on a connection that dropped
// since is asked again at once (connLives).
func (f *fetcher) request(p string, part held, seq uint64) ([]byte, error) {
	fail := func(err error) error {
		return &FetchError{Path: p, Host: part.host, Off: part.Off, End: part.End, Err: err}
	}
	lostErr := func(l wfmeta.LostFile) error {
		// The controller took the node for lost: no need to wait out the timeout.
		return fail(fmt.Errorf("%w: node %s was lost (%s)", ErrHolderLost, l.Node, l.Reason))
	}
	deadline := time.Now().Add(f.timeout)
	for {
		req := FetchRequest(f.names, part.host, p, part.Off, part.End-part.Off, seq)
		life := f.lives.current()
		resp, loss, err := f.ask(life, req, p, part.host)
		if loss != nil {
			return nil, lostErr(*loss)
		}
		lost := life.Err() != nil || errors.Is(err, nats.ErrNoResponders) || errors.Is(err, context.DeadlineExceeded) ||
			errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrDisconnected)
		switch {
		case err == nil && resp.Header.Get(hdrRetry) != "" && time.Now().Before(deadline):
			// Behind: ask again below.
		case err == nil && resp.Header.Get(hdrRetry) != "":
			return nil, fail(fmt.Errorf("%w after %s", errBehind, f.timeout))
		case err == nil:
			if e := resp.Header.Get(hdrError); e != "" {
				if len(e) > MaxReason {
					e = e[:MaxReason]
				}
				return nil, fail(errors.New(e))
			}
			if int64(len(resp.Data)) != part.End-part.Off {
				return nil, fail(fmt.Errorf("%w: %d bytes answered for %d", ErrInvalid, len(resp.Data), part.End-part.Off))
			}
			return resp.Data, nil
		case f.ctx.Err() != nil:
			return nil, f.ctx.Err()
		case lost && time.Now().Before(deadline):
			if l, ok := f.lostWith(p, part.host); ok {
				return nil, lostErr(l)
			}
			if life.Err() != nil {
				continue // the connection dropped: ask again at once, on its next life
			}
		case lost:
			return nil, fail(fmt.Errorf("%w for %s (%w)", ErrHolderLost, f.timeout, err))
		default:
			return nil, fail(err)
		}
		select {
		case <-time.After(200 * time.Millisecond):
		case <-f.ctx.Done():
			return nil, f.ctx.Err()
		}
	}
}

// failHere records that bytes of p cannot be stored on this host (its store is full):
// its readers here get ErrUnavailable naming why.
func (f *fetcher) failHere(p string, err error) {
	f.engine.Fail(p, fmt.Errorf("%w: %w", ErrUnavailable, err))
	if merr := f.state.MarkFailed(p, err.Error()); merr != nil {
		f.log.Error(merr, "recording a file that cannot be stored", "path", p)
	}
}

// Fetch returns once bytes [off, end) of p are in this peer's node store, fetching those
// written on other hosts from their holders; call it before reading bytes the engine
// says are readable (WaitRead, a committed file's size). Files written on this host, and
// paths no rule governs, return at once. A peer that is not its host's materialiser asks
// the materialiser (which fetches once for every peer of the host). It fails with a
// *FetchError (ErrHolderLost when the holder's peers are all gone), with ErrUnavailable
// when this host's store cannot hold the bytes, or with ctx's error.
func (n *Peer) Fetch(ctx context.Context, p string, off, end int64) error {
	if end <= off {
		return nil
	}
	if n.fetching.Load() {
		if !n.fetcher.remoteRead(p, off, end) {
			return nil
		}
		return n.fetcher.ensure(ctx, p, off, end, fetchAhead)
	}
	if !n.Remote(p, off, end) {
		return nil
	}
	held, err := n.fetcher.ensureVia(ctx, p, off, end)
	if err != nil {
		return err
	}
	n.fetcher.fetchedVia(p, off, end, held)
	return nil
}

// Remote reports whether [off, end) of p holds bytes written on another host that this
// peer does not know to be in its store (filestate.Fetcher); false for files written on
// this host.
func (n *Peer) Remote(p string, off, end int64) bool { return n.fetcher.remote(p, off, end) }

func (f *fetcher) remote(p string, off, end int64) bool {
	committed := f.engine.Status(p).Committed
	f.mu.Lock()
	defer f.mu.Unlock()
	h := f.files[p]
	return h != nil && len(h.wanted(off, end, committed)) > 0
}

// remoteRead is remote for a read of [off, end) by a reader of this host, which it
// notes: the extents that arrive within fetchAhead of the furthest read of a file being
// read here are fetched as they arrive (holding.readTo).
func (f *fetcher) remoteRead(p string, off, end int64) bool {
	committed := f.engine.Status(p).Committed
	f.mu.Lock()
	defer f.mu.Unlock()
	h := f.files[p]
	if h == nil {
		return false
	}
	h.readTo = max(h.readTo, end)
	return len(h.wanted(off, end, committed)) > 0
}

// Holders returns the hosts whose stores hold bytes of p as written there, sorted: this
// peer's host for the bytes written here, and the other hosts of the extents it applied.
// Empty for a file with no bytes (or unknown).
func (n *Peer) Holders(p string) []string { return n.fetcher.holders(p) }

func (f *fetcher) holders(p string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	h := f.files[p]
	if h == nil {
		return nil
	}
	set := map[string]bool{}
	for _, r := range h.remote {
		set[r.host] = true
	}
	if h.wroteHere {
		set[f.host] = true
	}
	out := make([]string, 0, len(set))
	for host := range set {
		out = append(out, host)
	}
	sort.Strings(out)
	return out
}

// fetchedVia records that the host's materialiser fetched [off, end) of p, and, when it
// said the committed file is held further (held > end: its readahead), up to held, within
// the file's size as this peer knows it.
func (f *fetcher) fetchedVia(p string, off, end, held int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if h := f.files[p]; h != nil {
		h.local.Add(off, max(end, min(held, h.size)))
	}
}

// heldFrom returns how far from off the host's store holds every byte of p, if p's bytes
// are final where written: p is committed, or NoUpdate (its producers never rewrite a
// byte they wrote); off otherwise. A materialiser tells the peer it fetched for (hdrHeld),
// so that the peer's next reads of what the readahead brought need no request: without
// it, every read(2) of a NoUpdate file still being written on another node cost a
// request to the materialiser, and a program reading 4 KiB at a time (sort) crawled for
// minutes on a busy connection.
func (f *fetcher) heldFrom(p string, off int64) int64 {
	if st := f.engine.Status(p); !st.Committed && st.Fire != v1alpha1.FireNoUpdate {
		return off
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	h := f.files[p]
	if h == nil {
		return off
	}
	return min(h.size, off+h.local.ContiguousFrom(off))
}

// ensureVia asks the host's materialiser to fetch [off, end) of p. It asks again while
// the host has no materialiser (a failover: "no responders", for at most
// Config.FetchTimeout),
// when the materialiser stopped while fetching (its answer says so), and when an answer
// does not come within attemptTimeout (a request lost with a materialiser that stopped;
// asking again joins the fetches in flight), until ctx ends. The materialiser first
// applies the stream as far as this peer has (Sluice-Seq), so it knows where the bytes are.
// It returns how far from off its host's store holds the file when the materialiser says
// so (Sluice-Held, committed files; 0 otherwise).
func (f *fetcher) ensureVia(ctx context.Context, p string, off, end int64) (int64, error) {
	deadline := time.Now().Add(f.timeout)
	for {
		req := nats.NewMsg(f.names.Ensure(f.host))
		req.Header.Set(hdrPath, p)
		req.Header.Set(hdrOffset, strconv.FormatInt(off, 10))
		req.Header.Set(hdrEnd, strconv.FormatInt(end, 10))
		req.Header.Set(hdrSeq, strconv.FormatUint(f.followed.load(), 10))
		actx, cancel := context.WithTimeout(ctx, attemptTimeout)
		stop := context.AfterFunc(f.lives.current(), cancel) // the connection dropped: ask again
		resp, err := f.conn.RequestMsgWithContext(actx, req)
		dropped := !stop()
		cancel()
		again := false
		switch {
		case err == nil && resp.Header.Get(hdrRetry) != "":
			again = true
		case err == nil:
			if e := resp.Header.Get(hdrError); e != "" {
				return 0, fmt.Errorf("fetching bytes %d to %d of %q: %s", off, end, p, e)
			}
			held, _ := strconv.ParseInt(resp.Header.Get(hdrHeld), 10, 64) // absent or bad: 0, nothing more
			return held, nil
		case ctx.Err() != nil:
			return 0, fmt.Errorf("asking the materialiser of host %q for bytes %d to %d of %q: %w", f.host, off, end, p, ctx.Err())
		case errors.Is(err, context.DeadlineExceeded), dropped && f.ctx.Err() == nil:
			continue // unanswered, or lost with the connection: ask again
		case errors.Is(err, nats.ErrNoResponders) && time.Now().Before(deadline):
			again = true
		}
		if !again {
			return 0, fmt.Errorf("asking the materialiser of host %q for bytes %d to %d of %q: %w", f.host, off, end, p, err)
		}
		select {
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// serveEnsure answers the host's other peers' Fetch calls; run by the materialiser.
func (f *fetcher) serveEnsure() (*nats.Subscription, error) {
	sub, err := f.conn.Subscribe(f.names.Ensure(f.host), func(m *nats.Msg) {
		go func() {
			reply := nats.NewMsg(m.Reply)
			p, off, err := f.ensureFor(m.Header)
			switch {
			case err != nil && f.ctx.Err() != nil:
				reply.Header.Set(hdrRetry, "1") // stopping: the next materialiser fetches
			case err != nil:
				reply.Header.Set(hdrError, err.Error())
			default:
				reply.Header.Set(hdrHeld, strconv.FormatInt(f.heldFrom(p, off), 10))
			}
			_ = f.conn.PublishMsg(reply)
		}()
	})
	if err != nil {
		return nil, fmt.Errorf("serving the fetches of host %q: %w", f.host, err)
	}
	return sub, nil
}

// ensureFor fetches what a peer of the host asks for (ensureVia's request) and returns
// the file and offset it asked for.
func (f *fetcher) ensureFor(h nats.Header) (string, int64, error) {
	p, err := wirePath(h.Get(hdrPath))
	if err != nil {
		return "", 0, err
	}
	off, err := wireInt(h.Get(hdrOffset), "offset")
	if err != nil {
		return "", 0, err
	}
	end, err := wireInt(h.Get(hdrEnd), "end")
	if err != nil {
		return "", 0, err
	}
	seq, err := strconv.ParseUint(h.Get(hdrSeq), 10, 64)
	if err != nil {
		return "", 0, fmt.Errorf("%w: bad sequence %q", ErrInvalid, h.Get(hdrSeq))
	}
	ctx, cancel := context.WithTimeout(f.ctx, 2*f.timeout)
	defer cancel()
	if err := f.followed.wait(ctx, seq); err != nil {
		return "", 0, err
	}
	return p, off, f.ensure(ctx, p, off, end, fetchAhead)
}
