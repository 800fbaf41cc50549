package pathpattern

import (
	"context"
	"errors"
	"fmt"
)

// ErrTooCostly is returned (wrapped) by Work.Overlaps and Work.Charge once the work they
// were given is spent.
var ErrTooCostly = errors.New("too costly")

// Work is a budget of work units shared by many overlap checks, for a caller that compares
// patterns from untrusted input (admission): a unit is half a cell of the product of two
// segments (one token of each; only the cells that can be reachable are visited), one
// token compared by a quick reject, or one rune range
// merged when two classes meet, one step of matching a path; every call costs a few more
// (callUnits). A unit is about 3 to 6 ns of one core. It also stops at a context's end. A
// Work is not safe for concurrent use.
type Work struct {
	ctx    context.Context
	budget int64
	left   int64
	spent  int64
	// untilCheck counts down the units until ctx is looked at again.
	untilCheck int64
	err        error
	row        []bool // scratch for segmentsIntersect, reused
}

// workCheckEvery is how many units pass between two looks at the context.
const workCheckEvery = 1 << 16

// callUnits is what one Overlaps, Related, Match or MatchPrefix costs beyond the cells and
// steps it counts, and cellUnits what one cell of two segments' product costs: measured,
// a call that rejects at once takes about as long as 4 tokens compared, a cell as 2.
const (
	callUnits = 4
	cellUnits = 2
)

// NewWork returns a budget of units (at least 0) that also ends when ctx does.
func NewWork(ctx context.Context, units int64) *Work {
	units = max(units, 0)
	return &Work{ctx: ctx, budget: units, left: units, untilCheck: workCheckEvery}
}

// Spent returns the units used so far.
func (w *Work) Spent() int64 { return w.spent }

// Err returns why the work stopped (ErrTooCostly or the context's error, wrapped), or nil.
func (w *Work) Err() error { return w.err }

// Charge takes units (at least 0) from the budget, for work a caller does itself between
// overlap checks (matching a pattern against a prefix, say). It returns ErrTooCostly
// (wrapped, with the budget) once the budget is spent, or the context's error once it has
// ended; after an error every later call returns the same error.
func (w *Work) Charge(units int64) error {
	if w.err != nil {
		return w.err
	}
	w.spent += units
	w.left -= units
	if w.left < 0 {
		w.err = fmt.Errorf("%w: more than %d units of pattern comparison", ErrTooCostly, w.budget)
		return w.err
	}
	w.untilCheck -= units
	if w.untilCheck <= 0 {
		w.untilCheck = workCheckEvery
		if err := w.ctx.Err(); err != nil {
			w.err = fmt.Errorf("comparing patterns: %w", err)
			return w.err
		}
	}
	return nil
}

// Overlaps is the package's Overlaps within the budget: it returns ErrTooCostly (wrapped)
// when the comparison would take more than the units left, or the context's error.
func (w *Work) Overlaps(a, b *Pattern) (bool, error) {
	if err := w.Charge(callUnits); err != nil {
		return false, err
	}
	if a.text == "." || b.text == "." {
		return a.text == b.text, nil
	}
	if len(a.segments) != len(b.segments) {
		return false, nil
	}
	for i := range a.segments {
		ok, err := w.segmentsIntersect(a.segments[i], b.segments[i])
		if err != nil || !ok {
			return false, err
		}
	}
	return true, nil
}

// Related is the package's Related within the budget: it returns ErrTooCostly (wrapped)
// when the comparison would take more than the units left, or the context's error.
func (w *Work) Related(a, b *Pattern) (bool, error) {
	if err := w.Charge(callUnits); err != nil {
		return false, err
	}
	if a.text == "." || b.text == "." {
		return true, nil
	}
	for i := 0; i < min(len(a.segments), len(b.segments)); i++ {
		ok, err := w.segmentsIntersect(a.segments[i], b.segments[i])
		if err != nil || !ok {
			return false, err
		}
	}
	return true, nil
}

// Match is Pattern.Match within the budget.
func (w *Work) Match(p *Pattern, name string) (bool, error) {
	_, ok, steps := p.match(name, matchWhole)
	if err := w.Charge(callUnits + steps); err != nil {
		return false, err
	}
	return ok, nil
}

// MatchPrefix is Pattern.MatchPrefix within the budget.
func (w *Work) MatchPrefix(p *Pattern, name string) (string, bool, error) {
	n, ok, steps := p.match(name, matchLeading)
	if err := w.Charge(callUnits + steps); err != nil || !ok {
		return "", false, err
	}
	return name[:n], true, nil
}

// segmentsIntersect decides whether two segment patterns share a string. The pairs of
// positions (i in a, j in b) form a grid whose moves only go right, down or diagonally (a
// star swallows what the other side's next token matches, or ends; two single-rune tokens
// meet when they share a rune), so the pairs reachable from (0, 0) are found row by row,
// keeping one row: memory linear in len(b), time len(a)·len(b), charged to w.
func (w *Work) segmentsIntersect(a, b []token) (bool, error) {
	// Quick rejects: a common string starts (and ends) with the runes both segments'
	// leading (trailing) literals give it; most pairs of declared patterns differ there.
	n := int64(0)
	for i := 0; i < len(a) && i < len(b) && a[i].kind == tokLiteral && b[i].kind == tokLiteral; i++ {
		n++
		if a[i].r != b[i].r {
			return false, w.Charge(n)
		}
	}
	for i, j := len(a)-1, len(b)-1; i >= 0 && j >= 0 && a[i].kind == tokLiteral && b[j].kind == tokLiteral; i, j = i-1, j-1 {
		n++
		if a[i].r != b[j].r {
			return false, w.Charge(n)
		}
	}
	if err := w.Charge(n); err != nil {
		return false, err
	}
	la, lb := len(a), len(b)
	if cap(w.row) < lb+1 {
		w.row = make([]bool, lb+1)
	}
	row := w.row[:lb+1]
	// row[j] is whether (i, j) is reachable: a[:i] and b[:j] accept a common string. A
	// move into (i, j) comes from (i, j-1) (right: b's star ends, or a's star at i
	// swallows b[j-1]), from (i-1, j) (down: a's star ends, or b's star at j swallows
	// a[i-1]) or from (i-1, j-1) (two single-rune tokens that share a rune).
	// Only a band of each row is live: the pairs reachable in row i lie at or right of
	// the first live one of row i-1, and beyond the last live one of row i-1 only as far
	// as right moves carry them (stars). row[j] is false outside the band of the row last
	// computed, so only the band is visited: a segment without stars costs the diagonal,
	// not the whole product.
	row[0] = true
	nextStar := la > 0 && a[0].kind == tokStar
	hi := 0 // the band of row 0 is [0, hi]
	for j := 1; j <= lb; j++ {
		bt := &b[j-1]
		row[j] = row[j-1] && (bt.kind == tokStar || nextStar && bt.nonEmpty())
		if row[j] {
			hi = j
		}
	}
	lo := 0
	if err := w.Charge(cellUnits * int64(hi+1)); err != nil {
		return false, err
	}
	for i := 1; i <= la; i++ {
		at := &a[i-1]
		aStar, aNonEmpty := at.kind == tokStar, at.nonEmpty()
		nextStar = i < la && a[i].kind == tokStar
		newLo, newHi := -1, -1
		v := false
		j := lo
		diag := false // (i-1, j-1) before row[j-1] is overwritten
		if j == 0 {
			diag = row[0]
			v = row[0] && (aStar || lb > 0 && b[0].kind == tokStar && aNonEmpty)
			row[0] = v
			if v {
				newLo, newHi = 0, 0
			}
			j = 1
		} else {
			diag = row[j-1]
		}
		cost := int64(cellUnits)
		for ; j <= lb; j++ {
			if j > hi+1 && !v {
				break // nothing above, nothing to the left: the rest of the row is dead
			}
			cost += cellUnits
			up := row[j]
			bt := &b[j-1]
			bStar := bt.kind == tokStar
			switch {
			case up && (aStar || j < lb && b[j].kind == tokStar && aNonEmpty):
				v = true
			case v && (bStar || nextStar && bt.nonEmpty()): // v is row[j-1] of row i
				v = true
			case diag && !aStar && !bStar:
				if at.kind == tokLiteral && bt.kind == tokLiteral {
					v = at.r == bt.r
				} else {
					var c int64
					v, c = runeTokensIntersect(at, bt)
					cost += c
				}
			default:
				v = false
			}
			diag = up
			row[j] = v
			if v {
				if newLo < 0 {
					newLo = j
				}
				newHi = j
			}
		}
		if err := w.Charge(cost); err != nil {
			return false, err
		}
		if newLo < 0 {
			return false, nil
		}
		lo, hi = newLo, newHi
	}
	return row[lb], nil
}

// runeTokensIntersect reports whether two single-rune tokens accept a common rune, and the
// rune ranges it looked at.
func runeTokensIntersect(x, y *token) (bool, int64) {
	if x.kind == tokLiteral {
		return y.matches(x.r), 1
	}
	if y.kind == tokLiteral {
		return x.matches(y.r), 1
	}
	// two sets of sorted, disjoint ranges: merge
	xs, ys := *x.ranges, *y.ranges
	i, j := 0, 0
	for i < len(xs) && j < len(ys) {
		switch {
		case xs[i].hi < ys[j].lo:
			i++
		case ys[j].hi < xs[i].lo:
			j++
		default:
			return true, int64(i + j + 1)
		}
	}
	return false, int64(i + j + 1)
}
