package transport

import (
	"bytes"
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A waiting extent absorbs the next only when it continues it: the same file, peer and
// subject, starting where it ends, MaxChunk bytes at most in all.
func TestMergeExtent(t *testing.T) {
	ext := func(subj, p string, off, n int64) *nats.Msg {
		m := Encode(subj, &Message{Kind: KindExtent, Path: p, Offset: off, Length: n, Node: "a", Host: "a", Incarnation: "i"})
		m.Header.Set(jetstream.MsgIDHeader, "i-"+strconv.FormatInt(off, 10))
		return m
	}
	for _, tc := range []struct {
		name       string
		next       *nats.Msg
		merged     bool
		wantLength int64
	}{
		{"the next bytes", ext("d", "f", 100, 50), true, 150},
		{"a gap", ext("d", "f", 101, 50), false, 100},
		{"an overlap", ext("d", "f", 99, 50), false, 100},
		{"another file", ext("d", "g", 100, 50), false, 100},
		{"another subject", ext("e", "f", 100, 50), false, 100},
		{"past MaxChunk", ext("d", "f", 100, MaxChunk-99), false, 100},
		{"up to MaxChunk", ext("d", "f", 100, MaxChunk-100), true, MaxChunk},
		{"a close", Encode("d", &Message{Kind: KindClose, Path: "f", Node: "a", Host: "a", Incarnation: "i"}), false, 100},
		{"another peer", Encode("d", &Message{Kind: KindExtent, Path: "f", Offset: 100, Length: 5, Node: "b", Host: "a", Incarnation: "i"}), false, 100},
	} {
		last := ext("d", "f", 0, 100)
		if got := mergeExtent(last, tc.next); got != tc.merged {
			t.Errorf("%s: merged %v, want %v", tc.name, got, tc.merged)
		}
		m, err := Decode(last)
		if err != nil || m.Offset != 0 || m.Length != tc.wantLength || last.Header.Get(jetstream.MsgIDHeader) != "i-0" {
			t.Errorf("%s: the waiting extent is now %+v (%v), ID %q; want bytes 0 to %d, ID i-0", tc.name, m, err, last.Header.Get(jetstream.MsgIDHeader), tc.wantLength)
		}
	}
}

// A file written in many small writes (a shell loop of echo) is announced in far fewer
// extent messages than writes: extents that wait behind those in flight merge. Another
// node still reads every byte, and the bytes published are the bytes written.
func TestSmallWritesAreAnnouncedInFewMessages(t *testing.T) {
	c := newCluster(t, "", oneToOne, []string{"a", "b"}, 0)
	a, b := c.nodes["a"], c.nodes["b"]
	const writes = 2000
	var data []byte
	a.Create("f", false)
	for i := range writes {
		line := []byte(strconv.Itoa(i) + "\n")
		c.write(a, "f", int64(len(data)), line)
		data = append(data, line...)
	}
	a.Close("f")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := a.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	out, err := readAll(ctx, b, "f")
	if err != nil || !bytes.Equal(out, data) {
		t.Fatalf("node b read %d bytes (%v), want the %d written", len(out), err, len(data))
	}
	if got := a.Counters().BytesPublished; got != int64(len(data)) {
		t.Errorf("published %d bytes, want the %d written", got, len(data))
	}
	stream, err := a.js.Stream(ctx, c.names.Stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(c.names.Data(a.cfg.Host, a.cfg.Node)))
	if err != nil {
		t.Fatal(err)
	}
	if n := info.State.Subjects[c.names.Data(a.cfg.Host, a.cfg.Node)]; n == 0 || n > writes/2 {
		t.Errorf("%d writes were announced in %d extent messages, want at most half as many", writes, n)
	}
}
