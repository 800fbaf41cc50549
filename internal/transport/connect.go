package transport

import (
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/sluice-io/sluice/internal/trust"
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
	// Creds is the content of a NATS credentials file (user JWT and seed), for a process
	// that holds them in memory only (a store server, which has no file of them); it is
	// used when CredsFile is empty.
	Creds []byte
	// Inbox is the workflow's inbox prefix, the only one its credentials may subscribe
	// to; empty: nats.go's default.
	Inbox string
	// CA is the installation's CA certificate (PEM; the pod configuration's ca.crt):
	// over TLS (a tls:// URL, or a server that requires it) the server's certificate must
	// chain to it or to the system's roots (TLSOption). Empty: the system's roots.
	CA []byte
	// InProcess, when set, is a server in this process (an Embedded) that the connection
	// reaches without a socket, reconnections included; the URL then only names it.
	InProcess nats.InProcessConnProvider
}

// Connect connects a workflow's peer (`sluice run`, a sidecar, a store server) to the NATS
// server at url. The connection never gives up reconnecting: a peer outlives a restart of
// the server. The error names the URL.
func Connect(url string, o ConnOptions) (*nats.Conn, error) {
	// Authorisation errors do not end the retries either: a restarted server refuses the
	// workflow's user until the controller has pushed its namespace's account again.
	opts := []nats.Option{nats.Name(o.Name), nats.MaxReconnects(-1), nats.ReconnectWait(o.ReconnectWait), nats.IgnoreAuthErrorAbort()}
	switch {
	case o.CredsFile != "":
		opts = append(opts, nats.UserCredentials(o.CredsFile))
	case len(o.Creds) > 0:
		tok, err := nkeys.ParseDecoratedJWT(o.Creds)
		if err != nil {
			return nil, fmt.Errorf("NATS credentials: reading the user JWT: %w", err)
		}
		kp, err := nkeys.ParseDecoratedNKey(o.Creds)
		if err != nil {
			return nil, fmt.Errorf("NATS credentials: reading the user seed: %w", err)
		}
		seed, err := kp.Seed()
		if err != nil {
			return nil, fmt.Errorf("NATS credentials: reading the user seed: %w", err)
		}
		opts = append(opts, nats.UserJWTAndSeed(tok, string(seed)))
	}
	if o.Inbox != "" {
		opts = append(opts, nats.CustomInboxPrefix(o.Inbox))
	}
	if len(o.CA) > 0 {
		tlsOpt, err := TLSOption(o.CA)
		if err != nil {
			return nil, err
		}
		opts = append(opts, tlsOpt)
	}
	if o.InProcess != nil {
		opts = append(opts, nats.InProcessServer(o.InProcess))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, fmt.Errorf("connecting to NATS at %s: %w", url, err)
	}
	return nc, nil
}

// TLSOption is the NATS client option that verifies the server's certificate against the
// installation's CA ca and the system's roots (trust.Config) whenever the connection is
// TLS: the URL's scheme is tls://, as the installation's is with TLS on, or the server
// requires it. A nats:// URL to a plain server stays plain: the URL says which it is.
func TLSOption(ca []byte) (nats.Option, error) {
	tc, err := trust.Config(ca)
	if err != nil {
		return nil, fmt.Errorf("NATS TLS: %w", err)
	}
	return func(o *nats.Options) error {
		o.TLSConfig = tc
		return nil
	}, nil
}
