package semantics

import (
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/sluice-io/sluice/internal/pathpattern"
)

// Limits of what one Workflow may ask of Compile (docs/workflow-reference.md#limits).
// Together with MaxOutputPatterns and pathpattern's MaxSegmentBytes and MaxPatternBytes
// they bound the time and memory of a compile whatever the spec: every loop over the
// spec's patterns runs over at most MaxPatterns entries, parsing reads at most
// MaxExpandedPatternBytes, and every comparison of two patterns, every match of a
// dependency against the rules and every step of the cycle search is charged to a budget
// of MaxCompileWork units (pathpattern.Work), beyond which the spec is refused as too
// costly, naming the field being checked.
const (
	// MaxPatterns bounds the entries of every list of files of a spec (aliases, inputs,
	// outputs, commit.files, sources, permanent, exclude, homeNode, tiers), counted once
	// per use with aliases expanded: an alias of 1,000 files used as the input of ten
	// steps counts 10,000.
	MaxPatterns = 1 << 16
	// MaxExpandedPatternBytes bounds the bytes of those entries, aliases expanded.
	MaxExpandedPatternBytes = 2 << 20
	// MaxCompileWork is the work budget of one compile, in pathpattern.Work units (about
	// 3 to 6 ns each): at most about half a second of one core. 4,096 glob outputs of one
	// depth, every pair compared, take two thirds of it.
	MaxCompileWork = 100_000_000
)

// stop records that the work budget ran out, or that the context ended, while checking
// the field at fp; every later comparison is skipped.
func (c *compiler) stop(fp *field.Path, err error) {
	if c.stopped {
		return
	}
	c.stopped = true
	if errors.Is(err, pathpattern.ErrTooCostly) {
		c.errs = append(c.errs, field.Forbidden(fp, fmt.Sprintf(
			"too costly to check: comparing the workflow's patterns needs more than %d units of work (docs/workflow-reference.md#limits); declare fewer or simpler globs, or group files under Directory outputs",
			MaxCompileWork)))
		return
	}
	c.errs = append(c.errs, field.InternalError(fp, err))
}

// overlaps is pathpattern.Overlaps within the compile's budget; it is false once stopped.
func (c *compiler) overlaps(fp *field.Path, a, b *pathpattern.Pattern) bool {
	if c.stopped {
		return false
	}
	ok, err := c.work.Overlaps(a, b)
	if err != nil {
		c.stop(fp, err)
		return false
	}
	return ok
}

// related is pathpattern.Related within the compile's budget; it is false once stopped.
func (c *compiler) related(fp *field.Path, a, b *pathpattern.Pattern) bool {
	if c.stopped {
		return false
	}
	ok, err := c.work.Related(a, b)
	if err != nil {
		c.stop(fp, err)
		return false
	}
	return ok
}

// charge takes units from the compile's budget for work done at fp; false once stopped.
func (c *compiler) charge(fp *field.Path, units int64) bool {
	if c.stopped {
		return false
	}
	if err := c.work.Charge(units); err != nil {
		c.stop(fp, err)
		return false
	}
	return true
}

// checkSize counts the entries of every list of files of the spec, aliases expanded, and
// their bytes, before anything is parsed; it refuses the spec (and returns false) at the
// first list that takes the count over MaxPatterns or the bytes over
// MaxExpandedPatternBytes.
func (c *compiler) checkSize(fp *field.Path) bool {
	n, size := 0, 0
	aliasBytes := make(map[string]int, len(c.aliases))
	for name, files := range c.aliases {
		for _, f := range files {
			aliasBytes[name] += len(f)
		}
	}
	over := func(lp *field.Path) bool {
		switch {
		case n > MaxPatterns:
			c.errs = append(c.errs, field.TooMany(lp, n, MaxPatterns))
		case size > MaxExpandedPatternBytes:
			c.errs = append(c.errs, field.TooLong(lp, "", MaxExpandedPatternBytes))
			c.errs[len(c.errs)-1].Detail = fmt.Sprintf("the workflow's file lists, aliases expanded, hold more than %d bytes (docs/workflow-reference.md#limits)", MaxExpandedPatternBytes)
		default:
			return false
		}
		return true
	}
	count := func(lp *field.Path, list ...string) bool {
		for _, s := range list {
			if files, ok := c.aliases[s]; ok {
				n += len(files)
				size += aliasBytes[s]
			} else {
				n++
				size += len(s)
			}
		}
		return over(lp)
	}
	for i, a := range c.spec.Aliases {
		n += len(a.Files)
		for _, f := range a.Files {
			size += len(f)
		}
		if over(fp.Child("aliases").Index(i).Child("files")) {
			return false
		}
	}
	for i, s := range c.spec.Steps {
		sp := fp.Child("steps").Index(i)
		if count(sp.Child("inputs"), s.Inputs...) {
			return false
		}
		for j, o := range s.Outputs {
			op := sp.Child("outputs").Index(j)
			if count(op.Child("path"), o.Path) || count(op.Child("commit", "files"), o.Commit.Files...) {
				return false
			}
		}
	}
	for i, src := range c.spec.Sources {
		if count(fp.Child("sources").Index(i).Child("path"), src.Path) || count(fp.Child("sources").Index(i).Child("commit", "files"), src.Commit.Files...) {
			return false
		}
	}
	if count(fp.Child("permanent"), c.spec.Permanent...) || count(fp.Child("exclude"), c.spec.Exclude...) {
		return false
	}
	if hn := c.spec.HomeNode; hn != nil {
		if count(fp.Child("homeNode", "create"), hn.Create...) || count(fp.Child("homeNode", "hashing"), hn.Hashing...) {
			return false
		}
		for i, m := range hn.Manual {
			if count(fp.Child("homeNode", "manual").Index(i).Child("files"), m.Files...) {
				return false
			}
		}
	}
	if t := c.spec.Tiers; t != nil {
		if count(fp.Child("tiers", "memory"), t.Memory...) || count(fp.Child("tiers", "fs"), t.FS...) {
			return false
		}
	}
	return true
}
