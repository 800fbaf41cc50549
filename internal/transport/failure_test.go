package transport

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/sluice-io/sluice/internal/servers"
)

// nats-server killed with SIGKILL mid-stream and restarted (JetStream on disk): the
// producer's node republishes what was not acknowledged, the reader's node resumes its
// consumer, and the reader gets every byte, in order, with nothing lost or doubled.
func TestNATSServerKilledMidStream(t *testing.T) {
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
