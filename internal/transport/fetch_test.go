package transport

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"golang.org/x/sys/unix"

	"github.com/sluice-io/sluice/internal/byterange"
	"github.com/sluice-io/sluice/internal/store"
	"github.com/sluice-io/sluice/internal/wfmeta"
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

// A reader whose bytes are on a node that is gone gets an error naming the file and the
// node, within the fetch timeout: never a hang, never a hole.
func TestHolderLostFailsTheRead(t *testing.T) {
	c := newCluster(t, "", oneToOne, nil, 0)
	c.fetchTimeout = time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b := holderGone(ctx, t, c)
	_, err := readAll(ctx, b, "f")
	var fe *FetchError
	if !errors.Is(err, ErrHolderLost) || !errors.As(err, &fe) || fe.Host != "a" || fe.Path != "f" {
		t.Fatalf("read with the holder gone: %v; want a FetchError naming f and node a", err)
	}
}

// A reader whose bytes are on a node the controller recorded lost (wfmeta.LostFile) gets
// the error naming the file, the node and why at once, not after a request times out.
// The holder here is gone but still subscribed (its connection not yet dropped by the
// server): requests to it go unanswered, and each request and the fetch may wait an hour,
// so only a fetch that reads the record while its request waits ends before the read's
// context does; no bound on how fast it does so, which a loaded machine can miss.
func TestRecordedLossEndsTheFetchAtOnce(t *testing.T) {
	c := newCluster(t, "", oneToOne, nil, 0)
	c.fetchTimeout = time.Hour
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b := holderGone(ctx, t, c)
	b.fetcher.attempt = time.Hour // set before b's first fetch
	silent, err := nats.Connect(c.url)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	asked := make(chan struct{}, 64)
	sub, err := silent.Subscribe(c.names.Serve("a"), func(*nats.Msg) { asked <- struct{}{} })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := silent.Flush(); err != nil {
		t.Fatal(err)
	}
	rec, _ := json.Marshal(wfmeta.LostFile{Path: "f", Node: "a", Reason: "its Ready condition has been Unknown"})
	if _, err := b.kv.Put(ctx, wfmeta.LostKey("f"), rec); err != nil {
		t.Fatal(err)
	}
	_, err = readAll(ctx, b, "f")
	if ctx.Err() != nil {
		t.Fatalf("the read ended with its context (%v): the fetch waited for its request to time out and never read the record of the loss", err)
	}
	var fe *FetchError
	if !errors.Is(err, ErrHolderLost) || !errors.As(err, &fe) || fe.Host != "a" || fe.Path != "f" ||
		!strings.Contains(err.Error(), "node a was lost (its Ready condition has been Unknown)") {
		t.Fatalf("read from a node recorded lost: %v; want a FetchError naming f, node a and why", err)
	}
	select {
	case <-asked: // a request waited for an answer while the record was read
	case <-ctx.Done():
		t.Errorf("the read failed without asking the holder: no request waited for an answer")
	}
}

// holderGone has peer a of c write and commit file f, waits until peer b sees it, stops a
// and returns b, whose reads of f must then fetch from a node that is gone.
func holderGone(ctx context.Context, t *testing.T, c *cluster) *Peer {
	t.Helper()
	a, b := c.peer("a", "", "", t.TempDir()), c.peer("b", "", "", t.TempDir())
	a.Create("f", false)
	c.write(a, "f", 0, randomBytes(1<<20))
	a.Close("f")
	if err := a.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := b.WaitOpen(ctx, "f"); err != nil {
		t.Fatal(err)
	}
	a.Stop()
	return b
}

const twoFiles = `
steps:
- name: p
  outputs:
  - {path: f, commit: {rule: OnClose}, fire: NoUpdate}
  - {path: g, commit: {rule: OnClose}, fire: NoUpdate}
- name: c
  inputs: [f, g]`

// A holder whose host has not applied the stream as far as the reader's (its
// materialiser's consumer resuming after a NATS server restart, which nats.go retries
// with a backoff of up to 10 s) answers "ask again", and the reader's fetch asks again
// until the holder catches up: the read succeeds late, it does not fail.
func TestFetchFromAHolderThatIsBehindAsksAgain(t *testing.T) {
	c := newCluster(t, "", twoFiles, nil, 0)
	c.serveWait = 50 * time.Millisecond
	a, b, other := c.peer("a", "", "", t.TempDir()), c.peer("b", "", "", t.TempDir()), c.peer("c", "", "", t.TempDir())
	data := randomBytes(1 << 20)
	a.Create("f", false)
	c.write(a, "f", 0, data)
	a.Close("f")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := a.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	stream, err := a.js.Stream(ctx, c.names.Stream)
	if err != nil {
		t.Fatal(err)
	}
	ahead := stream.CachedInfo().State.LastSeq + 1 // a sequence a's host has not applied

	// Every answer to b's requests, seen from a connection of the test's own.
	watch, err := nats.Connect(c.url)
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	deferred := make(chan struct{}, 64)
	sub, err := watch.Subscribe("_INBOX.>", func(m *nats.Msg) {
		if m.Header.Get(hdrRetry) != "" {
			deferred <- struct{}{}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}
	go func() {
		// Once a has answered "ask again", the stream reaches the sequence b asks at.
		select {
		case <-deferred:
			other.Create("g", false)
		case <-ctx.Done():
		}
	}()
	got, err := b.fetcher.request("f", held{Range: byterange.Range{Off: 0, End: int64(len(data))}, host: "a"}, ahead)
	if err != nil {
		t.Fatalf("fetch from a holder behind the reader: %v", err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("fetched %d bytes differing from the %d written", len(got), len(data))
	}
}

// When the reader's node store is full, the reader gets a clear error at once, not a hang,
// and nothing is corrupt.
func TestReaderNodeStoreFull(t *testing.T) {
	c := newCluster(t, "", oneToOne, []string{"a", "b"}, 1<<20)
	a, b := c.nodes["a"], c.nodes["b"]
	a.store = mustStore(t, 0) // the producer's node has room
	a.Create("f", false)
	c.write(a, "f", 0, randomBytes(2<<20))
	a.Close("f")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := readAll(ctx, b, "f")
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("reader on the full node: err = %v, want ErrUnavailable", err)
	}
	if used := b.store.Used(); used > 1<<20 {
		t.Errorf("node b's store holds %d bytes beyond its limit", used)
	}
}

func mustStore(t *testing.T, limit int64) *store.Store {
	st, err := store.New(t.TempDir(), store.Options{Limit: limit})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// A reader killed mid-file and started again resumes from its offset on the bytes its
// node already holds: nothing is transferred twice.
func TestRestartedReaderResumesWithoutRetransfer(t *testing.T) {
	c := newCluster(t, "", oneToOne, []string{"a", "b"}, 0)
	a, b := c.nodes["a"], c.nodes["b"]
	data := randomBytes(4 << 20)
	a.Create("f", false)
	c.write(a, "f", 0, data[:2<<20])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// the first reader gets the first half, then dies
	var first []byte
	for int64(len(first)) < 2<<20 {
		k, _, err := b.WaitRead(ctx, "f", 0, int64(len(first)))
		if err != nil {
			t.Fatal(err)
		}
		first = append(first, readStore(t, b, "f", int64(len(first)), k)...)
	}
	c.write(a, "f", 2<<20, data[2<<20:])
	a.Close("f")
	// the restarted reader asks from its offset on; the node serves it from its store
	off := int64(len(first))
	rest := []byte{}
	for {
		k, eof, err := b.WaitRead(ctx, "f", 0, off+int64(len(rest)))
		if err != nil {
			t.Fatal(err)
		}
		if eof {
			break
		}
		rest = append(rest, readStore(t, b, "f", off+int64(len(rest)), k)...)
	}
	if !bytes.Equal(append(first, rest...), data) {
		t.Fatal("resumed read differs from what was written")
	}
	if got := b.Counters().BytesReceived; got != int64(len(data)) {
		t.Errorf("node b received %d bytes for a %d-byte file read twice in part", got, len(data))
	}
}

// The bytes a writer on another node adds to a file being read here are fetched as their
// extents arrive (within fetchAhead of the reader), while the writer goes on: the
// reader's next read finds them in its store and asks nothing. Before, they were asked
// for at that read, one round trip per read at the writer's heels.
func TestExtentsOfAFileBeingReadAreFetchedAsTheyArrive(t *testing.T) {
	c := newCluster(t, "", oneToOne, []string{"a", "b"}, 0)
	a, b := c.nodes["a"], c.nodes["b"]
	first, second := randomBytes(MaxChunk), randomBytes(MaxChunk)
	a.Create("f", false)
	c.write(a, "f", 0, first)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := b.WaitOpen(ctx, "f"); err != nil {
		t.Fatal(err)
	}
	if k, _, err := b.WaitRead(ctx, "f", 0, 0); err != nil || k != MaxChunk {
		t.Fatalf("b's first read: %d bytes readable (%v)", k, err)
	}
	if err := b.Fetch(ctx, "f", 0, MaxChunk); err != nil {
		t.Fatal(err)
	}
	c.write(a, "f", MaxChunk, second)
	if k, _, err := b.WaitRead(ctx, "f", 0, MaxChunk); err != nil || k != MaxChunk {
		t.Fatalf("b's second read: %d bytes readable (%v)", k, err)
	}
	for b.Remote("f", MaxChunk, 2*MaxChunk) {
		select {
		case <-ctx.Done():
			t.Fatal("the bytes written after the reader's first read were not fetched before its next read")
		case <-time.After(5 * time.Millisecond):
		}
	}
	sp, _ := b.store.Path("f")
	got, err := os.ReadFile(sp)
	if err != nil || !bytes.Equal(got, append(append([]byte(nil), first...), second...)) {
		t.Errorf("b's store holds %d bytes (%v), want the %d written", len(got), err, 2*MaxChunk)
	}
}
