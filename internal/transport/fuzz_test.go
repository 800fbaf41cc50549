package transport

import (
	"strconv"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/sluice-io/sluice/internal/pathpattern"
)

// FuzzDecode feeds arbitrary headers and payloads to the decoder: it must never panic, and
// whatever it accepts must be safe to apply (a clean relative path, a chunk within the
// size bounds) and survive an encode/decode round trip unchanged.
func FuzzDecode(f *testing.F) {
	f.Add("a", "data", "f", "", "0", "", "", []byte("hello"))
	f.Add("a", "rename", "x/y", "x/z", "", "10", "", []byte(nil))
	f.Add("a", "link", "x/y", "x/z", "", "10", "", []byte(nil))
	f.Add("a", "link", "x/y", "../z", "", "10", "", []byte(nil))
	f.Add("a", "terminate", "", "", "", "", "3", []byte(nil))
	f.Add("a", "data", "../etc/passwd", "", "0", "", "", []byte("x"))
	f.Add("b", "create", "d", "", "", "", "", []byte(nil))
	f.Fuzz(func(t *testing.T, node, kind, path, newPath, off, size, inst string, data []byte) {
		msg := nats.NewMsg("sluice.t.w.data." + "n")
		h := msg.Header
		h.Set(hdrNode, node)
		h.Set(hdrKind, kind)
		h.Set(hdrPath, path)
		h.Set(hdrNewPath, newPath)
		h.Set(hdrOffset, off)
		h.Set(hdrLength, strconv.Itoa(len(data)))
		h.Set(hdrSize, size)
		h.Set(hdrStep, "s")
		h.Set(hdrInstance, inst)
		msg.Data = data
		m, err := Decode(msg)
		if err != nil {
			return
		}
		for _, p := range []string{m.Path, m.NewPath} {
			if p == "" {
				continue
			}
			c, err := pathpattern.Clean(p)
			if err != nil || c != p || p[0] == '/' || c == "." {
				t.Fatalf("accepted unsafe path %q", p)
			}
		}
		if len(m.Data) > MaxChunk || m.Offset < 0 || m.Offset+int64(len(m.Data)) > MaxFileSize || m.Size < 0 {
			t.Fatalf("accepted out-of-bounds message %+v", m)
		}
		again, err := Decode(Encode("s", m))
		if err != nil {
			t.Fatalf("re-decoding an accepted message: %v", err)
		}
		if again.Kind != m.Kind || again.Path != m.Path || again.Offset != m.Offset || again.Size != m.Size || string(again.Data) != string(m.Data) {
			t.Fatalf("round trip changed %+v into %+v", m, again)
		}
	})
}
