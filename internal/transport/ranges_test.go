package transport

import "testing"

// Ranges one host wrote in order stay one range; a rewrite by another host splits it.
func TestHoldersCoalesce(t *testing.T) {
	var hs holders
	for off := int64(0); off < 10<<20; off += 1 << 20 {
		hs.set(off, off+1<<20, "a")
	}
	if len(hs) != 1 || hs[0].Off != 0 || hs[0].End != 10<<20 || hs[0].host != "a" {
		t.Fatalf("ten sequential extents of a: %+v, want one range [0, 10 MiB)", hs)
	}
	hs.set(2<<20, 3<<20, "b")
	if len(hs) != 3 || hs[1].host != "b" || hs[0].End != 2<<20 || hs[2].Off != 3<<20 {
		t.Fatalf("after b rewrote [2, 3 MiB): %+v", hs)
	}
	if got := hs.within(1<<20, 4<<20); len(got) != 3 || got[0].Off != 1<<20 || got[2].End != 4<<20 {
		t.Errorf("within [1, 4 MiB): %+v", got)
	}
	hs.set(2<<20, 3<<20, "")
	if len(hs) != 2 {
		t.Errorf("after the range was written here: %+v, want a's two ranges", hs)
	}
}
