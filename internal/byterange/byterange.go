// Package byterange keeps sets of byte ranges of a file: which bytes were written, which
// a node holds. Offsets are in bytes; every range is half-open, [Off, End).
package byterange

import "sort"

// Range is the half-open byte range [Off, End) of a file.
type Range struct {
	// Off is the first byte's offset and End the offset just past the last, in bytes.
	Off, End int64
}

// Set is a set of byte ranges kept sorted, disjoint and coalesced. The zero value is
// empty.
type Set []Range

// Add inserts [off, end), merging it with every range it touches; an empty range is
// ignored.
func (s *Set) Add(off, end int64) {
	if end <= off {
		return
	}
	rs := *s
	i := sort.Search(len(rs), func(k int) bool { return rs[k].End >= off })
	j := i
	for j < len(rs) && rs[j].Off <= end {
		off, end = min(off, rs[j].Off), max(end, rs[j].End)
		j++
	}
	merged := append(rs[:i:i], Range{off, end}) //nolint:gocritic // rs[:i:i] caps the prefix: the append copies it, leaving rs intact for rs[j:]
	merged = append(merged, rs[j:]...)
	*s = merged
}

// Remove takes [off, end) out of the set and reports whether any of it was in the set.
func (s *Set) Remove(off, end int64) bool {
	if end <= off {
		return false
	}
	var out Set
	hit := false
	for _, r := range *s {
		if r.End <= off || r.Off >= end {
			out = append(out, r)
			continue
		}
		hit = true
		if r.Off < off {
			out = append(out, Range{r.Off, off})
		}
		if r.End > end {
			out = append(out, Range{end, r.End})
		}
	}
	*s = out
	return hit
}

// Truncate drops everything at or beyond size bytes.
func (s *Set) Truncate(size int64) { s.Remove(size, 1<<62) }

// ContiguousFrom returns how many bytes starting at off are in the set without a gap.
func (s Set) ContiguousFrom(off int64) int64 {
	i := sort.Search(len(s), func(k int) bool { return s[k].End > off })
	if i < len(s) && s[i].Off <= off {
		return s[i].End - off
	}
	return 0
}

// Gaps returns the parts of [off, end) that are not in the set, in order.
func (s Set) Gaps(off, end int64) []Range {
	var out []Range
	i := sort.Search(len(s), func(k int) bool { return s[k].End > off })
	for ; off < end && i < len(s); i++ {
		r := s[i]
		if r.Off >= end {
			break
		}
		if r.Off > off {
			out = append(out, Range{off, r.Off})
		}
		off = max(off, r.End)
	}
	if off < end {
		out = append(out, Range{off, end})
	}
	return out
}
