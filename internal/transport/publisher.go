package transport

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
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
	// set); the rest wait (maxInFlight) or are held.
	sent int
	// merged counts the messages merged into the one before them (counters).
	merged int64

	published int64 // bytes of data acknowledged (counters)
	retries   int64

	// journal, when set, holds every message not yet acknowledged (see journal).
	journal *journal
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
		// A nil future is resent by the ack loop, with everything after it.
		if pm.fut, pm.err = p.js.PublishMsgAsync(pm.msg); pm.fut == nil {
			p.held = true
			return
		}
		p.sent++
	}
}

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
		p.log.Info("publish failed; republishing what is not acknowledged, in order", "err", err.Error())
		p.republish(ctx)
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
	p.sent = 0
	for _, pm := range p.pending {
		if p.held || p.sent >= maxInFlight {
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
	}
	p.notifyLocked()
}

// sync blocks until every message published so far is acknowledged.
func (p *publisher) sync(ctx context.Context) error {
	for {
		p.mu.Lock()
		n, ch := len(p.pending), p.changed
		p.mu.Unlock()
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
