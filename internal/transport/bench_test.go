package transport

import (
	"testing"
)

// BenchmarkEncodeDecode measures a 1 MiB data chunk through the wire codec.
func BenchmarkEncodeDecode(b *testing.B) {
	data := make([]byte, MaxChunk)
	m := &Message{Node: "node-0", Kind: KindData, Path: "chunks/chunk-07", Offset: 1 << 30, Data: data}
	b.SetBytes(MaxChunk)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := Decode(Encode("sluice.ns.wf.data.node-0", m)); err != nil {
			b.Fatal(err)
		}
	}
}
