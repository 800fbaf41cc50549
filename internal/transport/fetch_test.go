package transport

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"golang.org/x/sys/unix"
)

// A peer that is not its host's materialiser, on a host where no peer holds the role (no
// one answers its requests), gives up after its Config.FetchTimeout, as a fetch from a
// holder does, and not after the package's default of a minute.
func TestAskingAnAbsentMaterialiserEndsAfterFetchTimeout(t *testing.T) {
	c := newCluster(t, "", oneToOne, nil, 0)
	c.fetchTimeout = 500 * time.Millisecond
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	if err := os.MkdirAll(state, 0o755); err != nil {
		t.Fatal(err)
	}
	// Hold the host's materialiser lock: the peer never becomes the materialiser.
	lock, err := os.OpenFile(filepath.Join(state, "materialiser.lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	peer := c.peer("r", "h", state, filepath.Join(dir, "store"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	_, err = peer.fetcher.ensureVia(ctx, "f", 0, 1)
	if !errors.Is(err, nats.ErrNoResponders) || ctx.Err() != nil {
		t.Fatalf("asking a host with no materialiser: %v (after %s), want no responders within the fetch timeout", err, time.Since(start).Round(time.Millisecond))
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("asking a host with no materialiser took %s with a fetch timeout of %s", took, c.fetchTimeout)
	}
}
