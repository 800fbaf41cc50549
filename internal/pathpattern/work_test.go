package pathpattern

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
)

// referenceIntersect is the former overlap check, kept as an oracle: a memoised search
// over every pair of positions, with an L² table, deciding single-rune tokens by trying
// every rune that can change a class's membership.
func referenceIntersect(a, b []token) bool {
	seen := make([]uint8, (len(a)+1)*(len(b)+1))
	var visit func(i, j int) bool
	visit = func(i, j int) bool {
		k := i*(len(b)+1) + j
		if v := seen[k]; v != 0 {
			return v == 2
		}
		var ok bool
		switch {
		case i == len(a) && j == len(b):
			ok = true
		case i < len(a) && a[i].kind == tokStar:
			ok = visit(i+1, j) || (j < len(b) && (b[j].kind == tokStar || bruteNonEmpty(&b[j])) && visit(i, j+1))
		case j < len(b) && b[j].kind == tokStar:
			ok = visit(i, j+1) || (i < len(a) && bruteNonEmpty(&a[i]) && visit(i+1, j))
		case i < len(a) && j < len(b):
			ok = bruteShare(&a[i], &b[j]) && visit(i+1, j+1)
		}
		seen[k] = 1
		if ok {
			seen[k] = 2
		}
		return ok
	}
	return visit(0, 0)
}

// bruteShare tries every rune at which membership of x or y can change.
func bruteShare(x, y *token) bool {
	cs := []rune{1, 'a', '0', '/', 0x10FFFF}
	for _, t := range []*token{x, y} {
		if t.kind == tokLiteral {
			cs = append(cs, t.r)
		}
		if t.ranges == nil {
			continue
		}
		for _, rg := range *t.ranges {
			cs = append(cs, rg.lo, rg.hi, rg.lo-1, rg.hi+1)
		}
	}
	for _, c := range cs {
		if c >= 1 && c <= 0x10FFFF && x.matches(c) && y.matches(c) {
			return true
		}
	}
	return false
}

func bruteNonEmpty(t *token) bool { return bruteShare(t, t) }

// randomSegment is a segment pattern over a small alphabet, so that random pairs overlap
// often enough for the comparison to mean something.
func randomSegment(r *rand.Rand) string {
	parts := []string{"a", "b", "*", "?", "[ab]", "[!a]", "[^b-c]", "[b-d]", "\\*", "[\x00]"}
	var s strings.Builder
	for n := r.IntN(7); n >= 0; n-- {
		s.WriteString(parts[r.IntN(len(parts))])
	}
	return s.String()
}

// The row-by-row check decides exactly what the former memoised search decided, on
// 20,000 random pairs of segments.
func TestOverlapsAgreesWithTheFormerSearch(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for n := 0; n < 20000; n++ {
		x, y := randomSegment(r), randomSegment(r)
		px, err1 := Parse(x)
		py, err2 := Parse(y)
		if err1 != nil || err2 != nil {
			continue
		}
		want := referenceIntersect(px.segments[0], py.segments[0])
		if got := Overlaps(px, py); got != want {
			t.Fatalf("Overlaps(%q, %q) = %v, the former search says %v", x, y, got, want)
		}
	}
}

// Comparing two patterns takes memory linear in their length, not their product: two
// 4,096-byte patterns of 16 segments of 255 tokens (a 65,025-cell product per segment,
// which the former check allocated as a table) allocate less than 8 KiB.
func TestOverlapsMemoryIsLinear(t *testing.T) {
	seg := strings.Repeat("*a", 127) + "*"                                 // 255 bytes
	a := MustParse(strings.Repeat(seg+"/", 15) + seg[:len(seg)-3] + "[x]") // cannot match b's end
	b := MustParse(strings.Repeat(seg+"/", 15) + seg[:len(seg)-3] + "[y]")
	w := NewWork(context.Background(), 1<<40)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	ok, err := w.Overlaps(a, b)
	runtime.ReadMemStats(&after)
	if err != nil || ok {
		t.Fatalf("Overlaps = %v, %v; want false, nil", ok, err)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 8<<10 {
		t.Errorf("comparing two 4,096-byte patterns allocated %d bytes, want < 8 KiB", got)
	}
	if w.Spent() < 15*255*255 {
		t.Errorf("Spent() = %d units, want at least the %d cells compared", w.Spent(), 15*255*255)
	}
}

// A Work stops a comparison that needs more than its budget with ErrTooCostly, and one
// whose context has ended with the context's error; later calls fail the same way.
func TestWorkBoundsTheComparison(t *testing.T) {
	seg := strings.Repeat("*a", 127) + "*"
	a, b := MustParse(seg), MustParse(seg[:len(seg)-1]+"b")
	w := NewWork(context.Background(), 10000)
	if _, err := w.Overlaps(a, b); !errors.Is(err, ErrTooCostly) {
		t.Fatalf("Overlaps within 10,000 units = %v, want ErrTooCostly", err)
	}
	if _, err := w.Overlaps(MustParse("x"), MustParse("y")); !errors.Is(err, ErrTooCostly) {
		t.Errorf("after the budget ran out: %v, want ErrTooCostly again", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	w = NewWork(ctx, 1<<40)
	var err error
	for i := 0; i < 10 && err == nil; i++ {
		_, err = w.Overlaps(a, b)
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Overlaps with an ended context = %v, want context.Canceled", err)
	}
}

// Parse refuses a pattern over MaxPatternBytes and a segment over MaxSegmentBytes.
func TestParseBoundsLength(t *testing.T) {
	ok := strings.Repeat("a", MaxSegmentBytes)
	if _, err := Parse(ok + "/" + ok); err != nil {
		t.Errorf("two segments of %d bytes: %v", MaxSegmentBytes, err)
	}
	for _, p := range []string{
		ok + "a",
		"dir/" + ok + "[ab]",
		strings.Repeat("a/", MaxPatternBytes/2) + "a",
	} {
		if _, err := Parse(p); !errors.Is(err, ErrTooLong) {
			t.Errorf("Parse(%d bytes) = %v, want ErrTooLong", len(p), err)
		}
	}
}

// BenchmarkOverlapsProduct compares two 255-token segments that share a string only at
// their end: every cell of the product is visited.
func BenchmarkOverlapsProduct(b *testing.B) {
	seg := strings.Repeat("*a", 127) + "*"
	x, y := MustParse(seg[:len(seg)-3]+"[x]"), MustParse(seg[:len(seg)-3]+"[y]")
	b.ReportAllocs()
	for b.Loop() {
		w := NewWork(context.Background(), 1<<40)
		if ok, _ := w.Overlaps(x, y); ok {
			b.Fatal("overlap")
		}
	}
}

// BenchmarkOverlapsQuickReject compares two glob patterns told apart by their last rune.
func BenchmarkOverlapsQuickReject(b *testing.B) {
	x, y := MustParse("*-00001.txt"), MustParse("*-00002.txt")
	w := NewWork(context.Background(), 1<<62)
	b.ReportAllocs()
	for b.Loop() {
		if ok, _ := w.Overlaps(x, y); ok {
			b.Fatal("overlap")
		}
	}
}

// The matchers compare segment by segment without splitting the path: a table of the
// cases where segment counts differ, and non-ASCII names under a star.
func TestMatchersBySegments(t *testing.T) {
	for _, tc := range []struct {
		pat, name       string
		whole, ancestor bool
		prefix          string
		prefixOK        bool
	}{
		{"out/*/x", "out", false, true, "", false},
		{"out/*/x", "out/a", false, true, "", false},
		{"out/*/x", "out/a/x", true, false, "out/a/x", true},
		{"out/*/x", "out/a/x/y", false, false, "out/a/x", true},
		{"out/*/x", "other", false, false, "", false},
		{"out/*/x", ".", false, true, "", false},
		{"d*", "dé/ü", false, false, "dé", true},
		{"*ü", "éü", true, false, "éü", true},
		{".", ".", true, false, "", false},
		{"a", ".", false, true, "", false},
	} {
		p := MustParse(tc.pat)
		if got := p.Match(tc.name); got != tc.whole {
			t.Errorf("%q.Match(%q) = %v, want %v", tc.pat, tc.name, got, tc.whole)
		}
		if got := p.MatchAncestor(tc.name); got != tc.ancestor {
			t.Errorf("%q.MatchAncestor(%q) = %v, want %v", tc.pat, tc.name, got, tc.ancestor)
		}
		if got, ok := p.MatchPrefix(tc.name); got != tc.prefix || ok != tc.prefixOK {
			t.Errorf("%q.MatchPrefix(%q) = %q, %v; want %q, %v", tc.pat, tc.name, got, ok, tc.prefix, tc.prefixOK)
		}
		w := NewWork(context.Background(), 1<<20)
		if got, err := w.Match(p, tc.name); err != nil || got != tc.whole {
			t.Errorf("Work.Match(%q, %q) = %v, %v; want %v", tc.pat, tc.name, got, err, tc.whole)
		}
	}
}
