package transport

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Hostile messages on the wire are refused and logged, never written outside the store
// or into a committed file.
func TestHostileMessagesAreRejected(t *testing.T) {
	c := newCluster(t, "", oneToOne, []string{"a", "b"}, 0)
	b := c.nodes["b"]
	nc, err := nats.Connect(c.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	send := func(m *nats.Msg) {
		t.Helper()
		if _, err := js.PublishMsg(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	raw := func(kind Kind, path string, off string, data []byte) *nats.Msg {
		m := nats.NewMsg(c.names.Data("a", "a"))
		m.Header.Set(hdrNode, "a")
		m.Header.Set(hdrKind, string(kind))
		m.Header.Set(hdrPath, path)
		m.Header.Set(hdrOffset, off)
		m.Header.Set(hdrLength, strconv.Itoa(len(data)))
		m.Data = data
		return m
	}
	send(raw(KindData, "../escape", "0", []byte("x")))
	send(raw(KindData, "/etc/passwd", "0", []byte("x")))
	send(raw(KindData, "f\x00g", "0", []byte("x")))
	send(raw(KindData, "f", "1099511627776", []byte("x")))
	send(raw(KindData, "plain-file", "0", []byte("x")))
	send(raw(KindData, "f", "-1", []byte("x")))
	lying := raw(KindData, "f", "0", []byte("x"))
	lying.Header.Set(hdrLength, "5") // says 5 bytes, carries 1
	send(lying)
	// a valid file, committed, then a duplicate and a late chunk
	send(Encode(c.names.Events("a"), &Message{Node: "a", Kind: KindCreate, Path: "f"}))
	send(Encode(c.names.Data("a", "a"), &Message{Node: "a", Kind: KindData, Path: "f", Offset: 0, Data: []byte("hello")}))
	send(Encode(c.names.Data("a", "a"), &Message{Node: "a", Kind: KindData, Path: "f", Offset: 0, Data: []byte("hello")}))
	send(Encode(c.names.Events("a"), &Message{Node: "a", Kind: KindClose, Path: "f"}))
	send(Encode(c.names.Data("a", "a"), &Message{Node: "a", Kind: KindData, Path: "f", Offset: 0, Data: []byte("EVIL!")}))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := b.CaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	out, err := readAll(ctx, b, "f")
	if err != nil || string(out) != "hello" {
		t.Errorf("f on node b = %q, %v; want hello", out, err)
	}
	if got := b.Counters().Rejected; got != 8 {
		t.Errorf("rejected %d messages, want 8 (7 invalid, 1 into a committed file)", got)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(b.store.Dir()), "escape")); err == nil {
		t.Error("a chunk escaped the store")
	}
}

// A withdrawal and a hard link cross the wire with what a peer needs to apply them: the
// reason, and a new name that is a clean volume path.
func TestWithdrawAndLinkMessagesAreChecked(t *testing.T) {
	if _, err := Decode(Encode("x", &Message{Node: "evil", Kind: KindWithdraw, Path: "f"})); !errors.Is(err, ErrInvalid) {
		t.Errorf("a withdrawal without a reason decoded: %v", err)
	}
	m, err := Decode(Encode("x", &Message{Node: "a", Kind: KindWithdraw, Path: "f", Reason: "attempt 1 failed"}))
	if err != nil || m.Reason != "attempt 1 failed" {
		t.Errorf("a valid withdrawal: %+v, %v", m, err)
	}
	for _, bad := range []string{"/etc/passwd", "../x", ""} {
		if _, err := Decode(Encode("x", &Message{Node: "evil", Kind: KindLink, Path: "d/a", NewPath: bad, Size: 1})); !errors.Is(err, ErrInvalid) {
			t.Errorf("a link to %q decoded: %v", bad, err)
		}
	}
	m, err = Decode(Encode("x", &Message{Node: "a", Kind: KindLink, Path: "d/a", NewPath: "d/b", Size: 5}))
	if err != nil || m.NewPath != "d/b" || m.Size != 5 {
		t.Errorf("a valid link: %+v, %v", m, err)
	}
}

// A symlink message needs a target the kernel could store: empty, NUL-bearing or
// PATH_MAX-long targets from the wire are refused.
func TestSymlinkMessagesAreChecked(t *testing.T) {
	for _, target := range []string{"", "a\x00b", strings.Repeat("x", 4096)} {
		m := Encode("x", &Message{Node: "evil", Kind: KindSymlink, Path: "d/l", Target: target})
		if _, err := Decode(m); !errors.Is(err, ErrInvalid) {
			t.Errorf("a symlink to %.20q decoded: %v", target, err)
		}
	}
	m := Encode("x", &Message{Node: "a", Kind: KindSymlink, Path: "d/l", Target: "../x"})
	if got, err := Decode(m); err != nil || got.Target != "../x" {
		t.Errorf("a valid symlink message: %+v, %v", got, err)
	}
}

// Requests for bytes are untrusted like every message: a path outside the volume or no
// rule governs, a range past the file's end or beyond MaxChunk, a request without the
// sequence, all get an error answer and no byte; a good one gets exactly its bytes.
func TestHostileFetchRequestsAreRefused(t *testing.T) {
	c := newCluster(t, "", oneToOne, []string{"a"}, 0)
	a := c.nodes["a"]
	data := randomBytes(100)
	a.Create("f", false)
	c.write(a, "f", 0, data)
	a.Close("f")
	sp, _ := a.store.Path("plain")
	if err := os.WriteFile(sp, []byte("not governed"), 0o644); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(c.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ask := func(path, off, length, seq string) *nats.Msg {
		t.Helper()
		req := nats.NewMsg(c.names.Serve("a"))
		for k, v := range map[string]string{hdrPath: path, hdrOffset: off, hdrLength: length, hdrSeq: seq} {
			if v != "" {
				req.Header.Set(k, v)
			}
		}
		resp, err := nc.RequestMsg(req, 5*time.Second)
		if err != nil {
			t.Fatalf("request %q %s+%s: %v", path, off, length, err)
		}
		return resp
	}
	for _, bad := range []struct{ what, path, off, length, seq string }{
		{"dot-dot", "../f", "0", "10", "1"},
		{"absolute", "/etc/passwd", "0", "10", "1"},
		{"not governed", "plain", "0", "10", "1"},
		{"past the end", "f", "90", "20", "1"},
		{"over MaxChunk", "f", "0", strconv.Itoa(MaxChunk + 1), "1"},
		{"no sequence", "f", "0", "10", ""},
		{"negative offset", "f", "-1", "10", "1"},
	} {
		resp := ask(bad.path, bad.off, bad.length, bad.seq)
		if resp.Header.Get(hdrError) == "" || len(resp.Data) != 0 {
			t.Errorf("%s: answered %d bytes, error %q; want an error and no byte", bad.what, len(resp.Data), resp.Header.Get(hdrError))
		}
	}
	if got := a.Counters().BytesServed; got != 0 {
		t.Errorf("served %d bytes to hostile requests", got)
	}
	if resp := ask("f", "10", "20", "1"); resp.Header.Get(hdrError) != "" || !bytes.Equal(resp.Data, data[10:30]) {
		t.Errorf("a good request: %d bytes, error %q", len(resp.Data), resp.Header.Get(hdrError))
	}
}
