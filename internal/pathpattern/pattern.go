// Package pathpattern parses and matches the file patterns of a workflow: literal names
// and globs with *, ? and [...] classes, relative to the root of the streaming volume.
//
// A pattern is matched segment by segment, as a shell does: "*" and "?" never match "/",
// so "chunks/*" matches "chunks/a" but not "chunks/a/b". Because of that, two patterns can
// only match a common path when they have the same number of segments, and Overlaps decides
// it exactly, segment against segment.
package pathpattern

import (
	"errors"
	"fmt"
	"path"
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

type token struct {
	kind   tokKind
	r      rune
	ranges []runeRange
	negate bool
}

// matches reports whether a single-rune token accepts c.
func (t *token) matches(c rune) bool {
	switch t.kind {
	case tokLiteral:
		return c == t.r
	case tokAny:
		return c != '/'
	case tokClass:
		in := false
		for _, rg := range t.ranges {
			if rg.lo <= c && c <= rg.hi {
				in = true
				break
			}
		}
		return c != '/' && in != t.negate
	}
	return false
}

// Pattern is a parsed path pattern. The zero value is not usable; use Parse.
type Pattern struct {
	text     string
	segments [][]token
	literal  bool
}

// Parse cleans p (see Clean) and parses it as a pattern. A "\" escapes the next rune. It
// returns the errors of Clean, or ErrBadClass (wrapped) for a malformed [...] class.
func Parse(p string) (*Pattern, error) {
	c, err := Clean(p)
	if err != nil {
		return nil, err
	}
	pat := &Pattern{text: c, literal: true}
	if c == "." {
		return pat, nil
	}
	for _, seg := range strings.Split(c, "/") {
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
			toks = append(toks, token{kind: tokAny})
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
	if i < len(rs) && (rs[i] == '^' || rs[i] == '!') {
		t.negate = true
		i++
	}
	first := true
	for i < len(rs) {
		if rs[i] == ']' && !first {
			if len(t.ranges) == 0 {
				return token{}, 0, ErrBadClass
			}
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
		t.ranges = append(t.ranges, runeRange{lo, hi})
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
	if name == "." || p.text == "." {
		return name == p.text
	}
	segs := strings.Split(name, "/")
	if len(segs) != len(p.segments) {
		return false
	}
	for i, s := range segs {
		if !matchSegment(p.segments[i], []rune(s)) {
			return false
		}
	}
	return true
}

// MatchPrefix reports whether some ancestor directory of name, or name itself, matches the
// pattern; it returns the matching ancestor (or name). It is how a directory's rule reaches
// the files inside it.
func (p *Pattern) MatchPrefix(name string) (string, bool) {
	if name == "." {
		return "", false
	}
	segs := strings.Split(name, "/")
	n := len(p.segments)
	if p.text == "." || n > len(segs) {
		return "", false
	}
	for i := 0; i < n; i++ {
		if !matchSegment(p.segments[i], []rune(segs[i])) {
			return "", false
		}
	}
	return strings.Join(segs[:n], "/"), true
}

// MatchAncestor reports whether the cleaned path dir could be an ancestor directory of a
// path the pattern matches: dir has fewer segments than the pattern and each matches the
// pattern's segment at the same depth. ("out" is an ancestor for "out/*/x".)
func (p *Pattern) MatchAncestor(dir string) bool {
	if p.text == "." {
		return false
	}
	if dir == "." {
		return len(p.segments) > 0
	}
	segs := strings.Split(dir, "/")
	if len(segs) >= len(p.segments) {
		return false
	}
	for i, s := range segs {
		if !matchSegment(p.segments[i], []rune(s)) {
			return false
		}
	}
	return true
}

// matchSegment matches one segment with the classic linear backtracking over the last star.
func matchSegment(toks []token, s []rune) bool {
	ti, si := 0, 0
	starT, starS := -1, 0
	for si < len(s) {
		switch {
		case ti < len(toks) && toks[ti].kind == tokStar:
			starT, starS = ti, si
			ti++
		case ti < len(toks) && toks[ti].matches(s[si]):
			ti++
			si++
		case starT >= 0:
			starS++
			si = starS
			ti = starT + 1
		default:
			return false
		}
	}
	for ti < len(toks) && toks[ti].kind == tokStar {
		ti++
	}
	return ti == len(toks)
}

// Overlaps reports whether some path matches both a and b. It is exact: for every segment it
// decides whether the two segment patterns accept a common string.
func Overlaps(a, b *Pattern) bool {
	if a.text == "." || b.text == "." {
		return a.text == b.text
	}
	if len(a.segments) != len(b.segments) {
		return false
	}
	for i := range a.segments {
		if !segmentsIntersect(a.segments[i], b.segments[i]) {
			return false
		}
	}
	return true
}

// segmentsIntersect decides whether two segment patterns share a string, by a search over
// pairs of positions (the product automaton), memoised.
func segmentsIntersect(a, b []token) bool {
	// Quick rejects: a common string starts (and ends) with the runes both segments'
	// leading (trailing) literals give it; most pairs of declared patterns differ there.
	for i := 0; i < len(a) && i < len(b) && a[i].kind == tokLiteral && b[i].kind == tokLiteral; i++ {
		if a[i].r != b[i].r {
			return false
		}
	}
	for i, j := len(a)-1, len(b)-1; i >= 0 && j >= 0 && a[i].kind == tokLiteral && b[j].kind == tokLiteral; i, j = i-1, j-1 {
		if a[i].r != b[j].r {
			return false
		}
	}
	// 0: not visited yet, 1: no common string from here, 2: one
	seen := make([]uint8, (len(a)+1)*(len(b)+1))
	var visit func(i, j int) bool
	visit = func(i, j int) bool {
		k := i*(len(b)+1) + j
		if v := seen[k]; v != 0 {
			return v == 2
		}
		var ok bool // every move advances i or j, so the search terminates
		switch {
		case i == len(a) && j == len(b):
			ok = true
		case i < len(a) && a[i].kind == tokStar:
			// the star matches nothing more, or swallows what b's next token matches
			ok = visit(i+1, j) || (j < len(b) && visit(i, j+1))
		case j < len(b) && b[j].kind == tokStar:
			ok = visit(i, j+1) || (i < len(a) && visit(i+1, j))
		case i < len(a) && j < len(b):
			ok = runeTokensIntersect(&a[i], &b[j]) && visit(i+1, j+1)
		}
		seen[k] = 1
		if ok {
			seen[k] = 2
		}
		return ok
	}
	return visit(0, 0)
}

// runeTokensIntersect reports whether two single-rune tokens accept a common rune.
func runeTokensIntersect(x, y *token) bool {
	if x.kind == tokLiteral {
		return y.matches(x.r)
	}
	if y.kind == tokLiteral {
		return x.matches(y.r)
	}
	if x.kind == tokAny {
		return y.kind == tokAny || classNonEmpty(y)
	}
	if y.kind == tokAny {
		return classNonEmpty(x)
	}
	// two classes: try every boundary rune of x's ranges and the runes next to y's ranges
	for _, c := range candidates(x, y) {
		if x.matches(c) && y.matches(c) {
			return true
		}
	}
	return false
}

func classNonEmpty(t *token) bool {
	for _, c := range candidates(t, t) {
		if t.matches(c) {
			return true
		}
	}
	return false
}

// candidates lists runes at which membership in x or y can change; if the two classes share
// a rune they share one of these.
func candidates(x, y *token) []rune {
	cs := []rune{'a', '0', 0x10FFFF}
	for _, t := range []*token{x, y} {
		for _, rg := range t.ranges {
			cs = append(cs, rg.lo, rg.hi, rg.lo-1, rg.hi+1)
		}
	}
	out := cs[:0]
	for _, c := range cs {
		if c >= 1 && c <= utf8.MaxRune {
			out = append(out, c)
		}
	}
	return out
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
func Related(a, b *Pattern) bool {
	if a.text == "." || b.text == "." {
		return true
	}
	n := min(len(a.segments), len(b.segments))
	for i := 0; i < n; i++ {
		if !segmentsIntersect(a.segments[i], b.segments[i]) {
			return false
		}
	}
	return true
}
