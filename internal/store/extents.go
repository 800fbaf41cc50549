package store

import (
	"errors"
	"fmt"
	"io"
	"sort"

	"golang.org/x/sys/unix"
)

// A store counts, per file, the byte ranges the file has allocated (extents), not its
// size: a write allocates the bytes it covers, fallocate the range it names, and a
// truncation that extends a file allocates nothing (the new bytes are a hole, as on
// tmpfs), while one that shrinks it frees what lies past its new end. A file's count is
// the total length of its ranges. Ranges are kept in bytes, not pages: a file of 60 bytes
// counts 60, as before; a program writing one byte every 4 KiB counts less than the pages
// tmpfs takes for it, which the tmpfs's own size (the CSI driver's bounded tmpfs) still
// bounds.

// span is the byte range [off, end).
type span struct{ off, end int64 }

// extents is a set of byte ranges: sorted, disjoint and not adjacent. The zero value is
// empty; a nil *extents reads as empty.
type extents struct {
	r []span
	n int64 // the sum of the ranges' lengths
}

// total returns the bytes in the set.
func (e *extents) total() int64 {
	if e == nil {
		return 0
	}
	return e.n
}

// gaps returns the parts of [off, end) not in the set, in order.
func (e *extents) gaps(off, end int64) []span {
	if off >= end {
		return nil
	}
	var out []span
	if e != nil {
		i := sort.Search(len(e.r), func(i int) bool { return e.r[i].end > off })
		for ; i < len(e.r) && e.r[i].off < end; i++ {
			if e.r[i].off > off {
				out = append(out, span{off, e.r[i].off})
			}
			off = e.r[i].end
		}
	}
	if off < end {
		out = append(out, span{off, end})
	}
	return out
}

// missing returns how many bytes of [off, end) are not in the set.
func (e *extents) missing(off, end int64) int64 {
	var n int64
	for _, g := range e.gaps(off, end) {
		n += g.end - g.off
	}
	return n
}

// add puts [off, end) in the set and returns the bytes that were not in it.
func (e *extents) add(off, end int64) int64 {
	if off >= end {
		return 0
	}
	// The ranges from i to j-1 overlap or touch [off, end): they merge into one.
	i := sort.Search(len(e.r), func(i int) bool { return e.r[i].end >= off })
	j := sort.Search(len(e.r), func(j int) bool { return e.r[j].off > end })
	merged := span{off, end}
	var had int64
	for _, s := range e.r[i:j] {
		had += s.end - s.off
		merged.off, merged.end = min(merged.off, s.off), max(merged.end, s.end)
	}
	added := merged.end - merged.off - had
	e.r = append(e.r[:i], append([]span{merged}, e.r[j:]...)...)
	e.n += added
	return added
}

// remove takes [off, end) out of the set and returns the bytes that were in it.
func (e *extents) remove(off, end int64) int64 {
	if e == nil || off >= end {
		return 0
	}
	i := sort.Search(len(e.r), func(i int) bool { return e.r[i].end > off })
	j := sort.Search(len(e.r), func(j int) bool { return e.r[j].off >= end })
	if i >= j {
		return 0
	}
	var keep []span
	var removed int64
	for _, s := range e.r[i:j] {
		removed += min(s.end, end) - max(s.off, off)
	}
	if first := e.r[i]; first.off < off {
		keep = append(keep, span{first.off, off})
	}
	if last := e.r[j-1]; last.end > end {
		keep = append(keep, span{end, last.end})
	}
	e.r = append(e.r[:i], append(keep, e.r[j:]...)...)
	e.n -= removed
	return removed
}

// dataSpans returns the ranges of the open file fd (of size bytes) that hold data, as
// SEEK_DATA and SEEK_HOLE report them (tmpfs and ext4: in pages or blocks, the last one
// ending at the file's end). A file system without them reports the whole file as data.
// It moves fd's offset.
func dataSpans(fd int, size int64) ([]span, error) {
	var out []span
	for off := int64(0); off < size; {
		d, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // no data past off
		}
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) {
			return append(out, span{off, size}), nil
		}
		if err != nil {
			return nil, err
		}
		h, err := unix.Seek(fd, d, unix.SEEK_HOLE)
		if err != nil {
			return nil, err
		}
		h = min(h, size)
		if h > d {
			out = append(out, span{d, h})
		}
		off = max(h, d+1)
	}
	return out, nil
}

// copyData copies the regular file src (of size bytes) to the empty file dst, data only:
// its holes stay holes (a sparse file's size is not what it takes), dst gets its size by
// ftruncate.
func copyData(dst, src int, size int64) error {
	spans, err := dataSpans(src, size)
	if err != nil {
		return err
	}
	buf := make([]byte, 1<<20)
	for _, sp := range spans {
		for off := sp.off; off < sp.end; {
			n, err := unix.Pread(src, buf[:min(int64(len(buf)), sp.end-off)], off)
			if err != nil {
				return err
			}
			if n == 0 {
				return fmt.Errorf("copied %d of %d bytes: %w", off, size, io.ErrUnexpectedEOF)
			}
			if k, err := unix.Pwrite(dst, buf[:n], off); err != nil {
				return err
			} else if k != n {
				return fmt.Errorf("short write at %d: %w", off, io.ErrShortWrite)
			}
			off += int64(n)
		}
	}
	return unix.Ftruncate(dst, size)
}
