package transport

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"syscall"

	"github.com/nats-io/nats.go"
	"golang.org/x/sys/unix"
)

// The holder's side of the data plane: every peer answers the other hosts' fetchers'
// requests for the bytes written on its host (wfmeta.Names.Serve), from the host's node store.

// serve answers the requests for byte ranges of files written on this peer's host, with
// at most serveSlots at once. Every peer of the host answers (a queue group): they
// share the store.
func (n *Peer) serve() (*nats.Subscription, error) {
	slots := make(chan struct{}, serveSlots)
	sub, err := n.cfg.Conn.QueueSubscribe(n.cfg.Names.Serve(n.cfg.Host), "serve", func(m *nats.Msg) {
		select {
		case slots <- struct{}{}:
		case <-n.ctx.Done():
			return
		}
		go func() {
			defer func() { <-slots }()
			n.answer(m)
		}()
	})
	if err != nil {
		return nil, fmt.Errorf("serving the bytes of host %q: %w", n.cfg.Host, err)
	}
	return sub, nil
}

// answer answers one request for a byte range. Everything in it is untrusted: the path
// must be a clean volume path that a rule governs, the range at most MaxChunk, and the
// file is opened beneath the store.
func (n *Peer) answer(m *nats.Msg) {
	if m.Reply == "" {
		return
	}
	reply := nats.NewMsg(m.Reply)
	data, err := n.read(m.Header)
	if data != nil {
		// PublishMsg copies the payload into the connection's buffer: the chunk's
		// buffer serves the next request once it returns.
		defer putServeBuf(data)
	}
	switch {
	case errors.Is(err, errBehind):
		reply.Header.Set(hdrRetry, "1")
		n.cfg.Log.V(1).Info("fetch deferred: this host is behind the fetcher", "err", err.Error())
	case err != nil:
		reply.Header.Set(hdrError, fmt.Sprintf("node %q: %v", n.cfg.Host, err))
		n.cfg.Log.V(1).Info("fetch refused", "err", err.Error())
	default:
		reply.Data = data
		n.served.Add(int64(len(data)))
	}
	if err := n.cfg.Conn.PublishMsg(reply); err != nil && n.ctx.Err() == nil {
		n.cfg.Log.Info("answering a fetch failed", "err", err.Error())
	}
}

// serveBufs are the buffers of the chunks being served, MaxChunk bytes each: a holder
// answering a stream reuses a few instead of allocating (and collecting) one per MiB.
var serveBufs = sync.Pool{New: func() any { b := make([]byte, MaxChunk); return &b }}

// getServeBuf returns a buffer of length bytes (at most MaxChunk) from serveBufs.
func getServeBuf(length int64) []byte {
	return (*serveBufs.Get().(*[]byte))[:length]
}

// putServeBuf gives a buffer of getServeBuf back to serveBufs.
func putServeBuf(b []byte) {
	b = b[:cap(b)]
	serveBufs.Put(&b)
}

// read reads the range a request names from the store, into a buffer of getServeBuf
// when err is nil; the caller gives it back with putServeBuf.
func (n *Peer) read(h nats.Header) ([]byte, error) {
	p, err := wirePath(h.Get(hdrPath))
	if err != nil {
		return nil, err
	}
	off, err := wireInt(h.Get(hdrOffset), "offset")
	if err != nil {
		return nil, err
	}
	length, err := wireInt(h.Get(hdrLength), "length")
	if err != nil {
		return nil, err
	}
	seq, err := strconv.ParseUint(h.Get(hdrSeq), 10, 64)
	if err != nil {
		return nil, fmt.Errorf("%w: bad sequence %q", ErrInvalid, h.Get(hdrSeq))
	}
	if length == 0 || length > MaxChunk || off+length > MaxFileSize {
		return nil, fmt.Errorf("%w: a range of %d bytes at %d (1 to %d bytes)", ErrInvalid, length, off, MaxChunk)
	}
	if !n.Rules().Resolve(p).Governed() {
		return nil, fmt.Errorf("%q: no rule governs it; plain files are never served", p)
	}
	ctx, cancel := context.WithTimeout(n.ctx, n.cfg.ServeWait)
	defer cancel()
	if err := n.host.WaitProgress(ctx, seq); err != nil {
		if n.ctx.Err() == nil {
			return nil, fmt.Errorf("%w: %w", errBehind, err)
		}
		return nil, err
	}
	fd, err := n.store.Open(p, syscall.O_RDONLY, 0)
	if err != nil {
		return nil, fmt.Errorf("%q: %w", p, err)
	}
	defer syscall.Close(fd)
	buf := getServeBuf(length)
	got := 0
	for got < len(buf) {
		k, err := unix.Pread(fd, buf[got:], off+int64(got))
		if err != nil {
			putServeBuf(buf)
			return nil, fmt.Errorf("reading %q at %d: %w", p, off+int64(got), err)
		}
		if k == 0 {
			putServeBuf(buf)
			return nil, fmt.Errorf("%q holds %d bytes at %d here, not %d", p, got, off, length)
		}
		got += k
	}
	return buf, nil
}
