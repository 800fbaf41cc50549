package semantics

import "sort"

// byteRange is the half-open byte range [off, end) of a file.
type byteRange struct{ off, end int64 }

// rangeSet is a set of written byte ranges kept sorted, disjoint and coalesced, so that a
// sparse file exposes exactly what was written.
type rangeSet []byteRange

// add inserts [off, end) and merges it with every range it touches.
func (s *rangeSet) add(off, end int64) {
	if end <= off {
		return
	}
	rs := *s
	// first range whose end reaches off
	i := sort.Search(len(rs), func(k int) bool { return rs[k].end >= off })
	j := i
	for j < len(rs) && rs[j].off <= end {
		if rs[j].off < off {
			off = rs[j].off
		}
		if rs[j].end > end {
			end = rs[j].end
		}
		j++
	}
	merged := append(rs[:i:i], byteRange{off, end})
	*s = append(merged, rs[j:]...)
}

// truncate drops everything at or beyond size.
func (s *rangeSet) truncate(size int64) {
	rs := *s
	out := rs[:0]
	for _, r := range rs {
		if r.off >= size {
			break
		}
		if r.end > size {
			r.end = size
		}
		out = append(out, r)
	}
	*s = out
}

// contiguousFrom returns how many bytes starting at off are written without a gap.
func (s rangeSet) contiguousFrom(off int64) int64 {
	i := sort.Search(len(s), func(k int) bool { return s[k].end > off })
	if i < len(s) && s[i].off <= off {
		return s[i].end - off
	}
	return 0
}
