package transport

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluice-io/sluice/internal/servers"
	"github.com/sluice-io/sluice/internal/testenv"
)

// nats-server killed with SIGKILL mid-stream and restarted (JetStream on disk): the
// producer's node republishes what was not acknowledged, the reader's node resumes its
// consumer, and the reader gets every byte, in order, with nothing lost or doubled.
// A producer killed while the server is away (its last events never acknowledged) loses
// nothing: its next life publishes again, from its journal, what the stream lacks, and a
// reader on another node gets the whole file, committed.
func TestKilledProducerRecoversUnacknowledgedEvents(t *testing.T) {
	testenv.Integration(t, "nats-server")
	srv, err := servers.StartNATS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	c := newCluster(t, srv.URL, oneToOne, []string{"b"}, 0)
	b := c.nodes["b"]
	journal, storeDir := t.TempDir(), t.TempDir()
	c.journalDir = journal
	a := c.peer("a", "", "", storeDir)
	data := randomBytes(3 << 20)
	a.Create("f", false)
	c.write(a, "f", 0, data[:1<<20])
	if err := a.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	srv.Stop() // gracefully: what it acknowledged is on its disk
	c.write(a, "f", 1<<20, data[1<<20:])
	a.Close("f")
	a.Stop() // killed: the last extents and the close were never acknowledged
	// and its connection dies with it: left open, nats.go would publish what it buffered
	// while the server was away as soon as it reconnects, which a killed process cannot.
	a.cfg.Conn.Close()
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	again := c.peer("a", "", "", storeDir)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n, err := again.Recover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatal("the next life published nothing again")
	}
	out, err := readAll(ctx, b, "f")
	if err != nil || !bytes.Equal(out, data) {
		t.Fatalf("reader: %d bytes (%v), want the %d written", len(out), err, len(data))
	}
	if n, err := again.Recover(ctx); err != nil || n != 0 {
		t.Errorf("a second Recover published %d (%v), want nothing", n, err)
	}
	if left, _ := os.ReadDir(journal); len(left) != 1 {
		t.Errorf("journal directory holds %d files, want the current life's only", len(left))
	}
}

// A peer's requests are bound to the life of its NATS connection: when the server is
// killed, the context they wait under ends (so they are asked again at once, not after
// their 10 s attempt timeout), and the next life's context is live.
func TestConnectionLivesEndWithTheConnection(t *testing.T) {
	testenv.Integration(t, "nats-server")
	srv, err := servers.StartNATS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	nc, err := nats.Connect(srv.URL, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	lives := watchConn(ctx, nc, &wg)
	first := lives.current()
	if first.Err() != nil {
		t.Fatal("the first life ended before the connection dropped")
	}
	srv.Kill()
	select {
	case <-first.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("the connection dropped, and the context of its life did not end")
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	if lives.current().Err() != nil {
		t.Error("the next life's context is done already")
	}
	cancel()
	if lives.current().Err() == nil {
		t.Error("the peer stopped, and its connection life goes on")
	}
}

func TestNATSServerKilledMidStream(t *testing.T) {
	testenv.Integration(t, "nats-server")
	srv, err := servers.StartNATS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	c := newCluster(t, srv.URL, oneToOne, []string{"a", "b"}, 0)
	a, b := c.nodes["a"], c.nodes["b"]
	data := randomBytes(24 << 20)
	got := make(chan []byte, 1)
	errc := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		out, err := readAll(ctx, b, "f")
		got <- out
		errc <- err
	}()
	a.Create("f", false)
	const chunk = 512 << 10
	for off := 0; off < len(data); off += chunk {
		if off == len(data)/2 {
			srv.Kill()
			if err := srv.Start(); err != nil {
				t.Fatal(err)
			}
		}
		c.write(a, "f", int64(off), data[off:off+chunk])
	}
	a.Close("f")
	out := <-got
	if err := <-errc; err != nil {
		t.Fatalf("reader: %v (after %d bytes)", err, len(out))
	}
	if !bytes.Equal(out, data) {
		i := 0
		for i < len(out) && i < len(data) && out[i] == data[i] {
			i++
		}
		t.Fatalf("reader got %d bytes differing from the %d written, from offset %d", len(out), len(data), i)
	}
	t.Logf("republished %d messages after the crash", a.Counters().Republished)
}

// A peer that restarts (a sidecar killed and started again, same name, new process)
// replays its previous life from the stream: the files it created are known again, and a
// close it makes now commits them everywhere. Its new messages are not taken for
// duplicates of the old ones.
func TestRestartedPeerReplaysItsPreviousLife(t *testing.T) {
	c := newCluster(t, "", oneToOne, []string{"reader"}, 0)
	dir := t.TempDir()
	store := filepath.Join(dir, "store")
	first := c.peer("prod", "", "", store)
	data := randomBytes(2 << 20)
	first.Create("f", false)
	c.write(first, "f", 0, data[:1<<20])
	if err := first.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	first.Stop()
	again := c.peer("prod", "", "", store)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, _, err := again.WaitRead(ctx, "f", 0, 1<<20-1); err != nil {
		t.Fatalf("the restarted peer does not know the bytes it wrote before: %v", err)
	}
	c.write(again, "f", 1<<20, data[1<<20:])
	again.Close("f")
	out, err := readAll(ctx, c.nodes["reader"], "f")
	if err != nil || !bytes.Equal(out, data) {
		t.Fatalf("reader got %d bytes (%v), want %d", len(out), err, len(data))
	}
}
