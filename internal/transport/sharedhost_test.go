package transport

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// sharedHost starts two peers on host "h" sharing one node store and state directory, as
// the sidecars of two pods of the workflow on one Kubernetes node do.
func (c *cluster) sharedHost(names ...string) []*Peer {
	c.t.Helper()
	dir := c.t.TempDir()
	var peers []*Peer
	for _, name := range names {
		peers = append(peers, c.peer(name, "h", filepath.Join(dir, "state"), filepath.Join(dir, "store")))
	}
	return peers
}

// Two pods on one node stream through the node store they share: the consumer's peer
// reads every byte the producer's peer wrote, and no byte travels back from NATS to that
// node, whichever peer is its materialiser. A third peer on another node gets the bytes
// over NATS.
func TestColocatedPeersShareTheNodeStore(t *testing.T) {
	c := newCluster(t, "", oneToOne, nil, 0)
	peers := c.sharedHost("prod", "cons")
	prod, cons := peers[0], peers[1]
	remote := c.peer("remote", "", "", filepath.Join(t.TempDir(), "remote"))
	data := randomBytes(6<<20 + 17)
	prod.Create("f", false)
	for off := 0; off < len(data); off += 1 << 20 {
		c.write(prod, "f", int64(off), data[off:min(off+1<<20, len(data))])
	}
	prod.Close("f")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, n := range []*Peer{cons, remote} {
		out, err := readAll(ctx, n, "f")
		if err != nil || !bytes.Equal(out, data) {
			t.Fatalf("peer %s read %d bytes (%v), want the %d written", n.Name(), len(out), err, len(data))
		}
	}
	if got := prod.Counters().BytesReceived + cons.Counters().BytesReceived; got != 0 {
		t.Errorf("the producer's node fetched %d bytes of its own file from NATS", got)
	}
	if got := remote.Counters().BytesReceived; got != int64(len(data)) {
		t.Errorf("the remote node received %d bytes, want %d", got, len(data))
	}
}

// A file written on another node is fetched once per node, however many pods read it
// there: only the node's materialiser receives the bytes.
func TestRemoteFileFetchedOncePerNode(t *testing.T) {
	c := newCluster(t, "", oneToOne, []string{"prod"}, 0)
	prod := c.nodes["prod"]
	readers := c.sharedHost("r1", "r2", "r3")
	data := randomBytes(3 << 20)
	prod.Create("f", false)
	c.write(prod, "f", 0, data)
	prod.Close("f")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var received int64
	for _, r := range readers {
		out, err := readAll(ctx, r, "f")
		if err != nil || !bytes.Equal(out, data) {
			t.Fatalf("peer %s read %d bytes (%v)", r.Name(), len(out), err)
		}
		received += r.Counters().BytesReceived
	}
	if received != int64(len(data)) {
		t.Errorf("the node's peers received %d bytes in all for a %d-byte file", received, len(data))
	}
}

// A peer that is not its host's fetcher asks the materialiser for the bytes it reads. The
// materialiser answers how far the committed file is held now (its readahead has fetched
// ahead), so the peer's next reads of those bytes need no request: reading a committed
// file in 128 KiB pieces takes at most one request per MiB, not one per read.
func TestPeerReadsWhatItsMaterialiserFetchedAheadWithoutAsking(t *testing.T) {
	c := newCluster(t, "", oneToOne, []string{"prod"}, 0)
	prod := c.nodes["prod"]
	readers := c.sharedHost("r1", "r2")
	data := randomBytes(8 << 20)
	prod.Create("f", false)
	c.write(prod, "f", 0, data)
	prod.Close("f")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, r := range readers { // both have applied the commit: the end is EOF
		if _, eof, err := r.WaitRead(ctx, "f", 0, int64(len(data))); err != nil || !eof {
			t.Fatalf("peer %s at the end of the committed file: eof %v (%v)", r.Name(), eof, err)
		}
	}
	// Once a fetch returned, the host has a materialiser: the other peer is not it.
	if err := readers[0].Fetch(ctx, "f", 0, 1); err != nil {
		t.Fatal(err)
	}
	peer := readers[0]
	if peer.fetching.Load() {
		peer = readers[1]
	}
	nc, err := nats.Connect(c.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	asked, err := nc.SubscribeSync(c.names.Ensure("h"))
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	sp, _ := peer.store.Path("f")
	const piece = 128 << 10
	for off := 0; off < len(data); off += piece {
		if err := peer.Fetch(ctx, "f", int64(off), int64(off+piece)); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(sp)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, piece)
		_, err = f.ReadAt(buf, int64(off))
		f.Close()
		if err != nil || !bytes.Equal(buf, data[off:off+piece]) {
			t.Fatalf("bytes %d to %d in the store after Fetch differ from those written (%v)", off, off+piece, err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if n, _, _ := asked.Pending(); n > len(data)/MaxChunk {
		t.Errorf("the peer asked its materialiser %d times for %d reads of a %d-byte committed file, want at most one per MiB", n, len(data)/piece, len(data))
	}
	if got := readers[0].Counters().BytesReceived + readers[1].Counters().BytesReceived; got != int64(len(data)) {
		t.Errorf("the host received %d bytes for a %d-byte file", got, len(data))
	}
}

// The same holds for a NoUpdate file still being written: its bytes are final once
// written, so the materialiser says how far it holds them and the peer reads on without
// asking. A program reading such a file 4 KiB at a time (sort) otherwise cost a request
// per read, and crawled on a busy connection until the wait timeout ended it.
func TestPeerReadsANoUpdateFileItsMaterialiserFetchedAheadWithoutAsking(t *testing.T) {
	c := newCluster(t, "", oneToOne, []string{"prod"}, 0)
	prod := c.nodes["prod"]
	readers := c.sharedHost("r1", "r2")
	data := randomBytes(4 << 20)
	prod.Create("f", false)
	c.write(prod, "f", 0, data) // not closed: the file is not committed
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, r := range readers { // both have applied the write: every byte is readable
		if n, _, err := r.WaitRead(ctx, "f", 0, int64(len(data))-1); err != nil || n != 1 {
			t.Fatalf("peer %s at the last byte written: %d readable (%v)", r.Name(), n, err)
		}
	}
	if err := readers[0].Fetch(ctx, "f", 0, 1); err != nil {
		t.Fatal(err)
	}
	peer := readers[0]
	if peer.fetching.Load() {
		peer = readers[1]
	}
	nc, err := nats.Connect(c.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	asked, err := nc.SubscribeSync(c.names.Ensure("h"))
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	const piece = 4 << 10
	for off := 0; off < len(data); off += piece {
		if got := readStore(t, peer, "f", int64(off), piece); !bytes.Equal(got, data[off:off+piece]) {
			t.Fatalf("bytes %d to %d in the store after Fetch differ from those written", off, off+piece)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if n, _, _ := asked.Pending(); n > len(data)/MaxChunk {
		t.Errorf("the peer asked its materialiser %d times for %d reads of a %d-byte NoUpdate file, want at most one per MiB", n, len(data)/piece, len(data))
	}
}

// The node's materialiser stops mid-file (its pod ended): another peer of the node takes
// the role over where it stopped, and the reader gets every byte, in order.
func TestMaterialiserFailover(t *testing.T) {
	c := newCluster(t, "", oneToOne, []string{"prod"}, 0)
	prod := c.nodes["prod"]
	readers := c.sharedHost("r1", "r2")
	data := randomBytes(8 << 20)
	prod.Create("f", false)
	c.write(prod, "f", 0, data[:4<<20])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Both peers see the first half, and the node's materialiser fetches it.
	for _, r := range readers {
		if _, _, err := r.WaitRead(ctx, "f", 0, 4<<20-1); err != nil {
			t.Fatal(err)
		}
	}
	if err := readers[0].Fetch(ctx, "f", 0, 4<<20); err != nil {
		t.Fatal(err)
	}
	holder, survivor := readers[0], readers[1]
	if holder.Counters().BytesReceived == 0 {
		holder, survivor = survivor, holder
	}
	holder.Stop()
	c.write(prod, "f", 4<<20, data[4<<20:])
	prod.Close("f")
	out, err := readAll(ctx, survivor, "f")
	if err != nil || !bytes.Equal(out, data) {
		t.Fatalf("after failover the survivor read %d bytes (%v), want %d", len(out), err, len(data))
	}
	if got := holder.Counters().BytesReceived + survivor.Counters().BytesReceived; got > int64(len(data))+MaxChunk {
		t.Errorf("the node received %d bytes for a %d-byte file: the new materialiser fetched again what was stored", got, len(data))
	}
}
