package transport

import (
	"testing"
	"time"
)

// A connection to a server of this process (sluice run's embedded one) needs no socket:
// with ConnOptions.InProcess it connects and carries messages although nothing listens
// at its URL.
func TestConnectInProcessNeedsNoSocket(t *testing.T) {
	srv, err := StartEmbedded(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := Connect("nats://127.0.0.1:1", ConnOptions{Name: "in-process", ReconnectWait: 100 * time.Millisecond, InProcess: srv})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	sub, err := nc.SubscribeSync("x")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish("x", []byte("hello")); err != nil {
		t.Fatal(err)
	}
	m, err := sub.NextMsg(5 * time.Second)
	if err != nil || string(m.Data) != "hello" {
		t.Fatalf("a message through the in-process connection: %v (%v)", m, err)
	}
}
