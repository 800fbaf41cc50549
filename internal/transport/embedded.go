package transport

import (
	"fmt"
	"net"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Embedded is a nats-server running in this process with JetStream on disk, listening on
// a free loopback port: what `sluice run` uses when no --nats URL is given.
type Embedded struct {
	srv *server.Server
}

// StartEmbedded starts an in-process nats-server storing JetStream data under dir.
func StartEmbedded(dir string) (*Embedded, error) {
	srv, err := server.NewServer(&server.Options{
		Host:      "127.0.0.1",
		Port:      server.RANDOM_PORT,
		JetStream: true,
		StoreDir:  dir,
		NoSigs:    true,
		// Data chunks are up to 1 MiB plus headers.
		MaxPayload: MaxChunk + 64<<10,
	})
	if err != nil {
		return nil, fmt.Errorf("embedded nats-server: %w", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(30 * time.Second) {
		srv.Shutdown()
		return nil, fmt.Errorf("embedded nats-server not ready after 30s")
	}
	return &Embedded{srv: srv}, nil
}

// InProcessConn returns a new client connection to the server within this process, with
// no socket between them (nats.InProcessServer; ConnOptions.InProcess): the bytes of a
// message go from the client's buffer to the server's in one copy, with no system call.
func (e *Embedded) InProcessConn() (net.Conn, error) {
	c, err := e.srv.InProcessConn()
	if err != nil {
		return nil, fmt.Errorf("embedded nats-server: an in-process connection: %w", err)
	}
	return c, nil
}

// URL is the client URL of the server.
func (e *Embedded) URL() string { return e.srv.ClientURL() }

// Shutdown stops the server.
func (e *Embedded) Shutdown() {
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
}
