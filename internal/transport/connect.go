package transport

import (
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
)

// ConnOptions are what differs between the NATS connections of a workflow's peers.
type ConnOptions struct {
	// Name names the connection in the server's monitoring ("sluice-sidecar ns/pod").
	Name string
	// ReconnectWait is the pause between two attempts to reconnect; a peer's connection
	// tries again forever.
	ReconnectWait time.Duration
	// CredsFile is the file of the workflow's NATS credentials (natsauth); empty: none.
	CredsFile string
	// Inbox is the workflow's inbox prefix, the only one its credentials may subscribe
	// to; empty: nats.go's default.
	Inbox string
}

// Connect connects a workflow's peer (`sluice run`, a sidecar, a store server) to the NATS
// server at url. The connection never gives up reconnecting: a peer outlives a restart of
// the server. The error names the URL.
func Connect(url string, o ConnOptions) (*nats.Conn, error) {
	opts := []nats.Option{nats.Name(o.Name), nats.MaxReconnects(-1), nats.ReconnectWait(o.ReconnectWait)}
	if o.CredsFile != "" {
		opts = append(opts, nats.UserCredentials(o.CredsFile))
	}
	if o.Inbox != "" {
		opts = append(opts, nats.CustomInboxPrefix(o.Inbox))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, fmt.Errorf("connecting to NATS at %s: %w", url, err)
	}
	return nc, nil
}
