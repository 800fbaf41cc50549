package transport

import (
	"bytes"
	"runtime"
	"strconv"
	"testing"

	"github.com/nats-io/nats.go"
)

// A holder serving a stream reuses its chunk buffers: answering 32 requests of 1 MiB
// allocates a part of 32 MiB, where a buffer per answer allocated all of it (and gave the
// collector as much to do: a fifth of a two-node stream's CPU profile). The bound is half:
// under the race detector sync.Pool drops a quarter of what it is given.
func TestServingReusesChunkBuffers(t *testing.T) {
	c := newCluster(t, "", oneToOne, []string{"a"}, 0)
	a := c.nodes["a"]
	data := randomBytes(4 * MaxChunk)
	a.Create("f", false)
	c.write(a, "f", 0, data)
	a.Close("f")
	request := func(k int) nats.Header {
		h := nats.Header{}
		h.Set(hdrPath, "f")
		h.Set(hdrOffset, strconv.Itoa(k%4*MaxChunk))
		h.Set(hdrLength, strconv.Itoa(MaxChunk))
		h.Set(hdrSeq, "0")
		return h
	}
	const answers = 32
	serve := func(k int) {
		t.Helper()
		buf, err := a.read(request(k))
		if err != nil {
			t.Fatal(err)
		}
		if off := k % 4 * MaxChunk; !bytes.Equal(buf, data[off:off+MaxChunk]) {
			t.Fatalf("answer %d: wrong bytes", k)
		}
		putServeBuf(buf)
	}
	serve(0) // the first buffer
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for k := range answers {
		serve(k)
	}
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got > answers*MaxChunk/2 {
		t.Errorf("serving %d chunks of %d bytes allocated %d bytes; want at most %d", answers, MaxChunk, got, answers*MaxChunk/2)
	}
}
