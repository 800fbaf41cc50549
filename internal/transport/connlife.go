package transport

import (
	"context"
	"sync"

	"github.com/nats-io/nats.go"
)

// connLives hands out one context per life of the peer's NATS connection, each cancelled
// when the connection drops (nats.go reports RECONNECTING or DISCONNECTED). nats.go keeps
// a request's reply subscription across a reconnect, so a request whose question or
// answer was lost with the connection would otherwise wait out its whole attempt timeout
// (10 s) before it is asked again; bound to the connection's life, it ends when the
// connection does and is asked again at once (nats.go's own legacy pull request ends on
// the same events).
type connLives struct {
	parent context.Context
	mu     sync.Mutex
	ctx    context.Context
	cancel context.CancelFunc
}

// watchConn starts following nc's status until parent ends. The listener stays
// registered with nc afterwards (nats.go's RemoveStatusListener removes every listener of
// the connection, the jetstream consumers' too); nc drops events nobody receives.
func watchConn(parent context.Context, nc *nats.Conn, wg *sync.WaitGroup) *connLives {
	l := &connLives{parent: parent}
	l.ctx, l.cancel = context.WithCancel(parent)
	events := nc.StatusChanged(nats.RECONNECTING, nats.DISCONNECTED, nats.CLOSED)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-parent.Done():
				return
			case <-events:
				l.next()
			}
		}
	}()
	return l
}

// current returns the context of the connection's current life: it is done when the
// connection drops, or when the peer stops.
func (l *connLives) current() context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ctx
}

// next ends the current life and begins the next.
func (l *connLives) next() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cancel()
	l.ctx, l.cancel = context.WithCancel(l.parent)
}
