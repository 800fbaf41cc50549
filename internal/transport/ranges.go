package transport

import (
	"sort"

	"github.com/sluice-io/sluice/internal/byterange"
)

// rng is the byte range [off, end).
func rng(off, end int64) byterange.Range { return byterange.Range{Off: off, End: end} }

// held is a range of a file's bytes written on another host, which serves them.
type held struct {
	byterange.Range
	host string
}

// holders maps a file's bytes written on other hosts to the host that wrote each range,
// sorted and disjoint; a later write of a range replaces what was known of it.
type holders []held

// set records that host wrote [off, end); host "" (written on this host) forgets the range.
func (hs *holders) set(off, end int64, host string) {
	var out holders
	for _, h := range *hs {
		if h.End <= off || h.Off >= end {
			out = append(out, h)
			continue
		}
		if h.Off < off {
			out = append(out, held{rng(h.Off, off), h.host})
		}
		if h.End > end {
			out = append(out, held{rng(end, h.End), h.host})
		}
	}
	if host != "" {
		out = append(out, held{rng(off, end), host})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Off < out[j].Off })
	// Coalesce neighbours of one host: a file written in order stays one range, so the
	// set (run on every extent event) and the lookups of every read stay short.
	merged := out[:0]
	for _, h := range out {
		if n := len(merged); n > 0 && merged[n-1].host == h.host && merged[n-1].End == h.Off {
			merged[n-1].End = h.End
			continue
		}
		merged = append(merged, h)
	}
	*hs = merged
}

// truncate drops everything at or beyond size.
func (hs *holders) truncate(size int64) { hs.set(size, 1<<62, "") }

// within returns the held ranges clipped to [off, end), in order.
func (hs holders) within(off, end int64) []held {
	var out []held
	for _, h := range hs {
		if h.End <= off || h.Off >= end {
			continue
		}
		out = append(out, held{rng(max(h.Off, off), min(h.End, end)), h.host})
	}
	return out
}
