package transport

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-io/sluice/internal/pathpattern"
)

// publisher publishes a node's messages to JetStream asynchronously, in order, and never
// loses one: it keeps every message until the server acknowledged it, and when an
// acknowledgement fails (the server went away) it publishes again, in the original order,
// every message not yet acknowledged. Each message carries a Nats-Msg-Id, so a message
// the server had stored before the failure is not stored twice.
//
// A message ID is the peer's incarnation and a sequence, so that a restarted peer's
// messages are never taken for duplicates of its previous life's.
//
// Memory is bounded: at most window bytes of unacknowledged messages are held; Publish
// blocks beyond that, which is the producer's backpressure.
//
// At most maxInFlight messages are sent and not yet acknowledged; later ones wait, in
// order, and are sent as acknowledgements come (as Nagle's algorithm does for TCP). A
// waiting extent that continues the one before it (same file, the next bytes, at most
// MaxChunk in all) is merged into it: a program that writes a file in many small writes
// (a shell loop of echo) publishes a few large extents instead of one per write, and a
// single write is sent at once. Every message is journaled as published, merged or not:
// an earlier life's journal published again (Peer.Recover) announces the same bytes.
type publisher struct {
	js     jetstream.JetStream
	id     string // the peer's incarnation: message IDs never repeat across restarts
	window int64
	log    logr.Logger

	mu      sync.Mutex
	changed chan struct{} // closed and replaced when pending shrinks or fails
	pending []*pendingMsg
	bytes   int64
	seq     uint64
	closed  bool
	// held is set when a message could not be sent: later messages are kept, not sent,
	// until the ack loop resends everything pending in order. Sending them would let the
	// stream store a later message (a close) before an earlier one (its data).
	held bool
	// sent is how many messages at the head of pending have been sent (their futures
	// set); the rest wait (maxInFlight, behindData) or are held.
	sent int
	// dataSent counts the data messages among the sent ones (see behindData).
	dataSent int
	// merged counts the messages merged into the one before them (counters).
	merged int64

	published int64 // bytes of data acknowledged (counters)
	retries   int64

	// journal, when set, holds every message not yet acknowledged (see journal).
	journal *journal

	// stream names the workflow's stream in errors and logs.
	stream string
	// failed is set once the server refused a message for a limit (refusal): nothing
	// after it is published, since a later message stored without it would let other
	// peers take a file for complete without its bytes. publish and sync return it.
	failed *RefusedError
	// onRefused, when set, is called once, outside p.mu, with the refusal and the paths
	// of the messages it dropped (the refused one first).
	onRefused func(*RefusedError, []string)
}

// RefusedError says that the workflow's stream, or the installation's NATS account,
// refused a message of this peer for a limit (the stream's MaxBytes or MaxMsgs, the
// account's storage quota): the peer publishes nothing more, and the files whose
// events were not recorded never commit (Peer poisons them).
type RefusedError struct {
	// Stream is the workflow's stream.
	Stream string
	// Kind and Path are the refused message's (Path is empty for a termination).
	Kind Kind
	Path string
	// Limit is the limit the server named ("maximum bytes exceeded", "resource limits
	// exceeded for account", "insufficient storage resources available").
	Limit string
	// Err is the server's answer.
	Err error
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("stream %s refused the %s of %q: %s (%v); this peer publishes nothing more", e.Stream, e.Kind, e.Path, e.Limit, e.Err)
}

// Unwrap returns the server's answer.
func (e *RefusedError) Unwrap() error { return e.Err }

// JetStream error codes of a message refused for a limit (nats-server's
// JSStreamStoreFailedF, JSAccountResourcesExceededErr, JSStorageResourcesExceededErr).
const (
	errCodeStoreFailed      jetstream.ErrorCode = 10077
	errCodeAccountResources jetstream.ErrorCode = 10002
	errCodeStorageResources jetstream.ErrorCode = 10047
)

// refusal returns the limit for which err, a publish acknowledgement's, refuses the
// message ("" if it does not): sending it again would be refused again.
func refusal(err error) string {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return ""
	}
	d := apiErr.Description
	switch apiErr.ErrorCode {
	case errCodeAccountResources, errCodeStorageResources:
		return d
	case errCodeStoreFailed: // also a failing disk: only the limits count
		if strings.Contains(d, "maximum bytes exceeded") || strings.Contains(d, "maximum messages") || strings.Contains(d, "message too large") {
			return d
		}
	}
	return ""
}

type pendingMsg struct {
	msg *nats.Msg
	fut jetstream.PubAckFuture
	err error // why PublishMsgAsync sent nothing (fut is nil)
	n   int64
}

// errHeld is the send error of a message kept back behind one that could not be sent.
var errHeld = errors.New("held back behind an unsent message")

// maxInFlight bounds the messages sent and not yet acknowledged (see publisher).
const maxInFlight = 16

func newPublisher(js jetstream.JetStream, id string, window int64, log logr.Logger) *publisher {
	p := &publisher{js: js, id: id, window: window, log: log, changed: make(chan struct{})}
	return p
}

func (p *publisher) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// publish queues msg under a new message ID; it blocks while window bytes are
// unacknowledged or ctx is done.
func (p *publisher) publish(ctx context.Context, msg *nats.Msg) error {
	return p.publishMsg(ctx, msg, false)
}

// publishMsg is publish; with keepID the message keeps the Nats-Msg-Id it has (one an
// earlier life of the peer journaled).
func (p *publisher) publishMsg(ctx context.Context, msg *nats.Msg, keepID bool) error {
	n := int64(len(msg.Data)) + 256
	p.mu.Lock()
	for p.bytes > 0 && p.bytes+n > p.window && !p.closed {
		ch := p.changed
		p.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("publishing: %w", ctx.Err())
		}
		p.mu.Lock()
	}
	defer p.mu.Unlock()
	if p.failed != nil {
		return p.failed
	}
	if p.closed {
		return fmt.Errorf("publishing: node transport closed")
	}
	if !keepID {
		p.seq++
		msg.Header.Set(jetstream.MsgIDHeader, p.id+"-"+strconv.FormatUint(p.seq, 10))
	}
	if p.journal != nil {
		if err := p.journal.append(msg); err != nil {
			p.log.Error(err, "journaling a message; it is published without the journal")
		}
	}
	if last := len(p.pending) - 1; last >= p.sent && mergeExtent(p.pending[last].msg, msg) {
		p.merged++
		return nil
	}
	p.pending = append(p.pending, &pendingMsg{msg: msg, n: n, err: errHeld})
	p.bytes += n
	p.pumpLocked()
	if len(p.pending) == 1 {
		p.notifyLocked() // wake the ack loop
	}
	return nil
}

// pumpLocked sends the waiting messages, in order, while fewer than maxInFlight are
// unacknowledged and none is held. p.mu is held.
func (p *publisher) pumpLocked() {
	for !p.held && p.sent < len(p.pending) && p.sent < maxInFlight {
		pm := p.pending[p.sent]
		if p.behindData(pm) {
			return
		}
		// A nil future is resent by the ack loop, with everything after it.
		if pm.fut, pm.err = p.js.PublishMsgAsync(pm.msg); pm.fut == nil {
			p.held = true
			return
		}
		p.sent++
		if isData(pm.msg) {
			p.dataSent++
		}
	}
}

// behindData reports whether pm must wait until the data messages sent before it are
// acknowledged: a message other than data is never sent behind an unacknowledged data
// message. A stream at its MaxBytes refuses a 1 MiB data message and still has room for
// a small close or termination sent after it, which would let other peers commit the
// file without those bytes; waiting, the publisher learns of the refusal first and sends
// nothing more (fail). Data messages follow one another freely: a later chunk stored
// after a refused one leaves a hole nobody reads, as nothing commits the file.
func (p *publisher) behindData(pm *pendingMsg) bool {
	return p.dataSent > 0 && !isData(pm.msg)
}

func isData(m *nats.Msg) bool { return Kind(m.Header.Get(hdrKind)) == KindData }

// mergeExtent extends the waiting extent message last by next when next is an extent of
// the same file, peer and subject that starts where last ends, and the two cover at most
// MaxChunk bytes; it reports whether it did. Both carry Nats-Msg-Ids: last keeps its own.
func mergeExtent(last, next *nats.Msg) bool {
	if last.Subject != next.Subject || Kind(last.Header.Get(hdrKind)) != KindExtent || Kind(next.Header.Get(hdrKind)) != KindExtent ||
		len(last.Data) != 0 || len(next.Data) != 0 {
		return false
	}
	for k := range next.Header {
		if k != hdrOffset && k != hdrLength && k != jetstream.MsgIDHeader && last.Header.Get(k) != next.Header.Get(k) {
			return false
		}
	}
	for k := range last.Header {
		if next.Header.Get(k) == "" && last.Header.Get(k) != "" {
			return false
		}
	}
	lo, err1 := strconv.ParseInt(last.Header.Get(hdrOffset), 10, 64)
	ll, err2 := strconv.ParseInt(last.Header.Get(hdrLength), 10, 64)
	no, err3 := strconv.ParseInt(next.Header.Get(hdrOffset), 10, 64)
	nl, err4 := strconv.ParseInt(next.Header.Get(hdrLength), 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil || no != lo+ll || ll+nl > MaxChunk {
		return false
	}
	last.Header.Set(hdrLength, strconv.FormatInt(ll+nl, 10))
	return true
}

// run acknowledges pending messages in order and republishes after failures, until ctx
// ends.
func (p *publisher) run(ctx context.Context) {
	for {
		p.mu.Lock()
		if len(p.pending) == 0 {
			ch := p.changed
			p.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return
			}
		}
		head := p.pending[0]
		if head.fut == nil && !p.held {
			p.pumpLocked() // waiting behind messages acknowledged meanwhile
			p.mu.Unlock()
			continue
		}
		p.mu.Unlock()
		var err error
		if head.fut == nil {
			err = fmt.Errorf("not sent: %w", head.err)
			// Nothing reached the server: wait before sending again, or a refusal that
			// repeats (a permissions violation) would spin.
			select {
			case <-time.After(time.Second):
			case <-ctx.Done():
				return
			}
		} else {
			select {
			case <-head.fut.Ok():
			case err = <-head.fut.Err():
			case <-ctx.Done():
				return
			}
		}
		if err == nil {
			p.mu.Lock()
			p.pending = p.pending[1:]
			p.sent--
			if isData(head.msg) {
				p.dataSent--
			}
			p.bytes -= head.n
			if len(p.pending) == 0 && p.journal != nil {
				if err := p.journal.reset(); err != nil {
					p.log.Error(err, "emptying the journal")
				}
			}
			switch Kind(head.msg.Header.Get(hdrKind)) {
			case KindData:
				p.published += int64(len(head.msg.Data))
			case KindExtent:
				k, _ := strconv.ParseInt(head.msg.Header.Get(hdrLength), 10, 64)
				p.published += k
			}
			p.pumpLocked()
			p.notifyLocked()
			p.mu.Unlock()
			continue
		}
		if limit := refusal(err); limit != "" {
			p.fail(head, limit, err)
			return
		}
		p.log.Info("publish failed; republishing what is not acknowledged, in order", "err", err.Error())
		p.republish(ctx)
	}
}

// fail gives up publishing after the server refused head for a limit: it drops every
// pending message (none may be stored after head), logs the refusal naming the stream,
// the file and the limit, wakes the waiters of sync, and calls onRefused.
func (p *publisher) fail(head *pendingMsg, limit string, err error) {
	p.mu.Lock()
	re := &RefusedError{Stream: p.stream, Kind: Kind(head.msg.Header.Get(hdrKind)), Limit: limit, Err: err}
	var paths []string
	seen := map[string]bool{}
	for _, pm := range p.pending {
		m, derr := Decode(pm.msg)
		if derr != nil || m.Path == "" || seen[m.Path] {
			continue
		}
		if pm == head {
			re.Path = m.Path
		}
		seen[m.Path] = true
		paths = append(paths, m.Path)
	}
	p.failed = re
	dropped := len(p.pending)
	p.pending, p.sent, p.dataSent, p.bytes, p.held = nil, 0, 0, 0, false
	if p.journal != nil {
		if jerr := p.journal.reset(); jerr != nil {
			p.log.Error(jerr, "emptying the journal")
		}
	}
	p.notifyLocked()
	onRefused := p.onRefused
	p.mu.Unlock()
	p.log.Error(err, "the workflow's stream refused a message for a limit: this peer publishes nothing more, and the files concerned never commit",
		"stream", p.stream, "kind", re.Kind, "path", pathpattern.Printable(re.Path), "limit", limit, "dropped", dropped, "files", len(paths))
	if onRefused != nil {
		onRefused(re, paths)
	}
}

// republish waits until JetStream answers again, then sends every pending message anew,
// oldest first.
func (p *publisher) republish(ctx context.Context) {
	backoff := 100 * time.Millisecond
	for {
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := p.js.AccountInfo(actx)
		cancel()
		if err == nil {
			break
		}
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return
		}
		if backoff < 2*time.Second {
			backoff *= 2
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.held = false
	p.sent, p.dataSent = 0, 0
	waiting := false // a message waits behind data (behindData): so do the rest
	for _, pm := range p.pending {
		waiting = waiting || p.behindData(pm)
		if p.held || waiting || p.sent >= maxInFlight {
			pm.fut, pm.err = nil, errHeld
			continue
		}
		m := nats.NewMsg(pm.msg.Subject)
		m.Header = pm.msg.Header
		m.Data = pm.msg.Data
		if pm.fut, pm.err = p.js.PublishMsgAsync(m); pm.fut == nil {
			p.held = true
			continue
		}
		p.sent++
		p.retries++
		if isData(pm.msg) {
			p.dataSent++
		}
	}
	p.notifyLocked()
}

// sync blocks until every message published so far is acknowledged, or returns the
// *RefusedError after which nothing more is published.
func (p *publisher) sync(ctx context.Context) error {
	for {
		p.mu.Lock()
		n, ch, failed := len(p.pending), p.changed, p.failed
		p.mu.Unlock()
		if failed != nil {
			return failed
		}
		if n == 0 {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("%d messages still unacknowledged: %w", n, ctx.Err())
		}
	}
}

func (p *publisher) close() {
	p.mu.Lock()
	p.closed = true
	p.notifyLocked()
	p.mu.Unlock()
}
