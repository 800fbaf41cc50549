// Package pathpattern parses and matches the file patterns of a workflow: literal names
// and globs with *, ? and [...] classes, relative to the root of the streaming volume.
//
// A pattern is matched segment by segment, as a shell does: "*" and "?" never match "/",
// so "chunks/*" matches "chunks/a" but not "chunks/a/b". Because of that, two patterns can
// only match a common path when they have the same number of segments, and Overlaps decides
// it exactly, segment against segment.
package pathpattern

import (
	"context"
	"errors"
	"fmt"
	"math"
	"path"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Errors returned by Clean and Parse; they are wrapped with the offending text.
var (
	// ErrEmpty is returned for an empty path or pattern.
	ErrEmpty = errors.New("empty path")
	// ErrDotDot is returned for a path with a ".." segment.
	ErrDotDot = errors.New(`path has a ".." segment`)
	// ErrNUL is returned for a path containing a NUL byte.
	ErrNUL = errors.New("path contains a NUL byte")
	// ErrBadUTF8 is returned for a path that is not valid UTF-8.
	ErrBadUTF8 = errors.New("path is not valid UTF-8")
	// ErrBadClass is returned for an unterminated or malformed [...] class.
	ErrBadClass = errors.New("malformed [...] class")
	// ErrTooLong is returned by Parse for a pattern longer than MaxPatternBytes or with a
	// segment longer than MaxSegmentBytes.
	ErrTooLong = errors.New("pattern too long")
)

// Pattern size limits, in bytes of UTF-8, that Parse enforces. A file name is at most
// NAME_MAX (255) bytes on Linux and a path PATH_MAX (4,096); a pattern gets the same room
// (a class counts its whole text). They bound what comparing two patterns costs
// (Work.Overlaps: a segment against a segment is at most 255² units).
const (
	// MaxSegmentBytes bounds one "/"-separated segment of a pattern, after Clean.
	MaxSegmentBytes = 255
	// MaxPatternBytes bounds a whole pattern as written.
	MaxPatternBytes = 4096
)

// Clean turns a workflow path into its canonical form: relative to the volume root (a
// leading "/" is dropped), with no "." segments, no duplicate or trailing "/". The volume
// root itself is ".". It returns ErrEmpty, ErrDotDot, ErrNUL or ErrBadUTF8 (wrapped) for a
// path that cannot name a file inside the volume.
func Clean(p string) (string, error) {
	if p == "" {
		return "", ErrEmpty
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", fmt.Errorf("%q: %w", p, ErrNUL)
	}
	if !utf8.ValidString(p) {
		return "", fmt.Errorf("%q: %w", p, ErrBadUTF8)
	}
	for _, seg := range strings.Split(p, "/") {
		if seg == ".." {
			return "", fmt.Errorf("%q: %w", p, ErrDotDot)
		}
	}
	c := path.Clean("/" + p)
	if c == "/" {
		return ".", nil
	}
	return c[1:], nil
}

// Parent returns the directory holding the cleaned path p, or "." for a top-level name.
func Parent(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[:i]
	}
	return "."
}

// tokKind is the kind of one token of a segment pattern.
type tokKind uint8

const (
	tokLiteral tokKind = iota // one literal rune
	tokAny                    // ?: any one rune but '/'
	tokClass                  // [...]: one rune in (or, negated, not in) a set of ranges
	tokStar                   // *: any run of runes without '/'
)

type runeRange struct{ lo, hi rune }

// token is one element of a segment pattern. A '?' or a class holds the runes it accepts
// as sorted, disjoint, non-adjacent ranges within [1, utf8.MaxRune] without '/' (a negated
// class is stored complemented), so that membership is a binary search and two classes
// intersect in one merge of their ranges.
type token struct {
	kind   tokKind
	r      rune
	ranges *[]runeRange // nil for a literal or a star; a pointer keeps a token 16 bytes
}

// anyRanges is what '?' accepts: every rune a segment can hold.
var anyRanges = []runeRange{{1, '/' - 1}, {'/' + 1, utf8.MaxRune}}

// matches reports whether a single-rune token accepts c.
func (t *token) matches(c rune) bool {
	switch t.kind {
	case tokLiteral:
		return c == t.r
	case tokAny, tokClass:
		rs := *t.ranges
		lo, hi := 0, len(rs)
		for lo < hi {
			m := int(uint(lo+hi) >> 1)
			switch {
			case c < rs[m].lo:
				hi = m
			case c > rs[m].hi:
				lo = m + 1
			default:
				return true
			}
		}
	}
	return false
}

// nonEmpty reports whether a single-rune token accepts some rune.
// (A star is not a single-rune token: false.)
func (t *token) nonEmpty() bool { return t.kind == tokLiteral || t.ranges != nil && len(*t.ranges) > 0 }

// normalizeRanges sorts and merges rs and removes what no segment can hold (NUL and '/');
// with negate it returns the complement instead.
func normalizeRanges(rs []runeRange, negate bool) []runeRange {
	sort.Slice(rs, func(i, j int) bool { return rs[i].lo < rs[j].lo })
	var merged []runeRange
	for _, r := range rs {
		if n := len(merged); n > 0 && r.lo <= merged[n-1].hi+1 {
			merged[n-1].hi = max(merged[n-1].hi, r.hi)
			continue
		}
		merged = append(merged, r)
	}
	if negate {
		var comp []runeRange
		next := rune(0)
		for _, r := range merged {
			if r.lo > next {
				comp = append(comp, runeRange{next, r.lo - 1})
			}
			next = r.hi + 1
		}
		if next <= utf8.MaxRune {
			comp = append(comp, runeRange{next, utf8.MaxRune})
		}
		merged = comp
	}
	// intersect with anyRanges: drop NUL and '/'
	var out []runeRange
	for _, r := range merged {
		for _, a := range anyRanges {
			lo, hi := max(r.lo, a.lo), min(r.hi, a.hi)
			if lo <= hi {
				out = append(out, runeRange{lo, hi})
			}
		}
	}
	return out
}

// Pattern is a parsed path pattern. The zero value is not usable; use Parse.
type Pattern struct {
	text     string
	segments [][]token
	literal  bool
}

// Parse cleans p (see Clean) and parses it as a pattern. A "\" escapes the next rune. It
// returns the errors of Clean, ErrTooLong (wrapped, with the length and the limit) for a
// pattern or segment over MaxPatternBytes or MaxSegmentBytes, or ErrBadClass (wrapped)
// for a malformed [...] class.
func Parse(p string) (*Pattern, error) {
	if len(p) > MaxPatternBytes {
		return nil, fmt.Errorf("%w: %d bytes, at most %d", ErrTooLong, len(p), MaxPatternBytes)
	}
	c, err := Clean(p)
	if err != nil {
		return nil, err
	}
	pat := &Pattern{text: c, literal: true}
	if c == "." {
		return pat, nil
	}
	for _, seg := range strings.Split(c, "/") {
		if len(seg) > MaxSegmentBytes {
			return nil, fmt.Errorf("%w: a segment of %d bytes (%.20q...), at most %d", ErrTooLong, len(seg), seg, MaxSegmentBytes)
		}
		toks, lit, err := parseSegment(seg)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", p, err)
		}
		pat.segments = append(pat.segments, toks)
		pat.literal = pat.literal && lit
	}
	return pat, nil
}

// MustParse is Parse for patterns known to be valid (tests, constants); it panics on error.
func MustParse(p string) *Pattern {
	pat, err := Parse(p)
	if err != nil {
		panic(err)
	}
	return pat
}

func parseSegment(seg string) (toks []token, literal bool, err error) {
	literal = true
	rs := []rune(seg)
	toks = make([]token, 0, len(rs))
	for i := 0; i < len(rs); i++ {
		switch rs[i] {
		case '*':
			literal = false
			if n := len(toks); n > 0 && toks[n-1].kind == tokStar {
				continue // "**" is the same as "*" within a segment
			}
			toks = append(toks, token{kind: tokStar})
		case '?':
			literal = false
			toks = append(toks, token{kind: tokAny, ranges: &anyRanges})
		case '\\':
			if i+1 >= len(rs) {
				return nil, false, fmt.Errorf(`trailing "\\" in %q`, seg)
			}
			i++
			toks = append(toks, token{kind: tokLiteral, r: rs[i]})
		case '[':
			literal = false
			t, next, err := parseClass(rs, i+1)
			if err != nil {
				return nil, false, fmt.Errorf("%w in %q", err, seg)
			}
			toks = append(toks, t)
			i = next
		default:
			toks = append(toks, token{kind: tokLiteral, r: rs[i]})
		}
	}
	return toks, literal, nil
}

// parseClass parses a class whose body starts at rs[i]; it returns the token and the index
// of the closing ']'.
func parseClass(rs []rune, i int) (token, int, error) {
	t := token{kind: tokClass}
	negate := false
	if i < len(rs) && (rs[i] == '^' || rs[i] == '!') {
		negate = true
		i++
	}
	var ranges []runeRange
	first := true
	for i < len(rs) {
		if rs[i] == ']' && !first {
			if len(ranges) == 0 {
				return token{}, 0, ErrBadClass
			}
			norm := normalizeRanges(ranges, negate)
			t.ranges = &norm
			return t, i, nil
		}
		first = false
		lo, err := classRune(rs, &i)
		if err != nil {
			return token{}, 0, err
		}
		hi := lo
		if i+1 < len(rs) && rs[i] == '-' && rs[i+1] != ']' {
			i++
			if hi, err = classRune(rs, &i); err != nil {
				return token{}, 0, err
			}
			if hi < lo {
				return token{}, 0, ErrBadClass
			}
		}
		ranges = append(ranges, runeRange{lo, hi})
	}
	return token{}, 0, ErrBadClass
}

func classRune(rs []rune, i *int) (rune, error) {
	if rs[*i] == '\\' {
		*i++
		if *i >= len(rs) {
			return 0, ErrBadClass
		}
	}
	r := rs[*i]
	*i++
	return r, nil
}

// String returns the cleaned pattern text.
func (p *Pattern) String() string { return p.text }

// IsLiteral reports whether the pattern has no wildcard, i.e. names exactly one path.
func (p *Pattern) IsLiteral() bool { return p.literal }

// Head returns the first segment of a pattern whose first segment is literal (no
// wildcard, escapes resolved), and false otherwise: two patterns with literal heads can
// match one path only if their heads are equal, which lets a caller compare patterns in
// groups rather than all pairs.
func (p *Pattern) Head() (string, bool) {
	if len(p.segments) == 0 {
		return "", false
	}
	rs := make([]rune, 0, len(p.segments[0]))
	for _, t := range p.segments[0] {
		if t.kind != tokLiteral {
			return "", false
		}
		rs = append(rs, t.r)
	}
	return string(rs), true
}

// Depth returns the number of path segments the pattern matches (0 for the root).
func (p *Pattern) Depth() int { return len(p.segments) }

// Match reports whether the cleaned path name (see Clean) matches the pattern.
func (p *Pattern) Match(name string) bool {
	_, ok, _ := p.match(name, matchWhole)
	return ok
}

// MatchPrefix reports whether some ancestor directory of name, or name itself, matches the
// pattern; it returns the matching ancestor (or name). It is how a directory's rule reaches
// the files inside it.
func (p *Pattern) MatchPrefix(name string) (string, bool) {
	n, ok, _ := p.match(name, matchLeading)
	if !ok {
		return "", false
	}
	return name[:n], true
}

// MatchAncestor reports whether the cleaned path dir could be an ancestor directory of a
// path the pattern matches: dir has fewer segments than the pattern and each matches the
// pattern's segment at the same depth. ("out" is an ancestor for "out/*/x".)
func (p *Pattern) MatchAncestor(dir string) bool {
	_, ok, _ := p.match(dir, matchAncestor)
	return ok
}

// matchMode says what part of a path match compares with the pattern.
type matchMode uint8

const (
	matchWhole    matchMode = iota // the path has the pattern's segments
	matchLeading                   // the path's first segments are the pattern's
	matchAncestor                  // the path's segments are the pattern's first ones, fewer
)

// match compares the cleaned path name with the pattern segment by segment, without
// allocating; it returns the length of name's matching part, whether it matched, and the
// steps it took (a Work's units).
func (p *Pattern) match(name string, mode matchMode) (int, bool, int64) {
	if p.text == "." || name == "." {
		switch mode {
		case matchWhole:
			return len(name), name == p.text, 1
		case matchAncestor:
			return 0, p.text != "." && name == ".", 1
		}
		return 0, false, 1
	}
	steps := int64(1)
	pos, i := 0, 0
	for ; i < len(p.segments); i++ {
		if pos > len(name) {
			break // name has fewer segments
		}
		end := strings.IndexByte(name[pos:], '/')
		if end < 0 {
			end = len(name)
		} else {
			end += pos
		}
		ok, n := matchSegmentSteps(p.segments[i], name[pos:end])
		steps += n
		if !ok {
			return 0, false, steps
		}
		pos = end + 1
	}
	more := pos <= len(name) // name has segments beyond those compared
	switch mode {
	case matchWhole:
		return len(name), i == len(p.segments) && !more, steps
	case matchLeading:
		if i < len(p.segments) {
			return 0, false, steps
		}
		return pos - 1, true, steps
	default: // matchAncestor
		return len(name), i < len(p.segments) && !more, steps
	}
}

// matchSegmentSteps matches one segment with the classic linear backtracking over the
// last star, and returns the steps it took (at most about len(toks)·len(s)).
func matchSegmentSteps(toks []token, s string) (bool, int64) {
	ti, si := 0, 0
	starT, starS := -1, 0
	steps := int64(1)
	for si < len(s) {
		steps++
		c, size := rune(s[si]), 1
		if c >= utf8.RuneSelf {
			c, size = utf8.DecodeRuneInString(s[si:])
		}
		switch {
		case ti < len(toks) && toks[ti].kind == tokStar:
			starT, starS = ti, si
			ti++
		case ti < len(toks) && toks[ti].matches(c):
			ti++
			si += size
		case starT >= 0:
			_, sz := utf8.DecodeRuneInString(s[starS:])
			starS += sz
			si = starS
			ti = starT + 1
		default:
			return false, steps
		}
	}
	for ti < len(toks) && toks[ti].kind == tokStar {
		ti++
	}
	return ti == len(toks), steps + int64(len(toks))
}

// Overlaps reports whether some path matches both a and b. It is exact: for every segment it
// decides whether the two segment patterns accept a common string. It needs memory linear
// in the longer segment and time up to the product of the segments' lengths; a caller
// comparing many patterns from untrusted input bounds the total with a Work instead.
func Overlaps(a, b *Pattern) bool {
	ok, _ := NewWork(context.Background(), math.MaxInt64).Overlaps(a, b)
	return ok
}

// Printable returns p as it may be written to a log line or a report: unchanged when
// every character is printable UTF-8, otherwise Go-quoted (strconv.Quote), so that a name
// holding a newline, a terminal escape or invalid UTF-8 (names come from steps, the wire
// and users, untrusted alike) cannot forge or garble a line.
func Printable(p string) string {
	if !utf8.ValidString(p) {
		return strconv.Quote(p)
	}
	for _, r := range p {
		if !unicode.IsPrint(r) {
			return strconv.Quote(p)
		}
	}
	return p
}

// Related reports whether a path that a matches and a path that b matches can be the
// same path or one an ancestor directory of the other: their leading segments, as many as
// the shorter pattern has, accept common strings ("results" and "results/*" are related,
// "results" and "logs/*" are not). It is exact, as Overlaps is.
//
// A caller comparing many patterns from untrusted input bounds the total with
// Work.Related instead.
func Related(a, b *Pattern) bool {
	ok, _ := NewWork(context.Background(), math.MaxInt64).Related(a, b)
	return ok
}
