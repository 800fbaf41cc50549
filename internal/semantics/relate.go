package semantics

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/pathpattern"
)

// relateInputs finds, for every step's inputs, the rules that feed them (RuleSet.Feeding:
// the patterns overlap, or the rule is a directory holding the input) and the rules they
// consume (RuleSet.consumersOf: the patterns overlap, or the input names a directory
// holding the rule's files), once, within the compile's budget, comparing an input only
// with the rules it can relate to (same depth and compatible literal heads for an
// overlap). It warns about inputs that no output declares: they may be placed in the
// volume by other means (stage-in, another tool), so this is not an error.
func (c *compiler) relateInputs(fp *field.Path) {
	rules := c.rs.rules
	idx := newRuleIndex(rules)
	const (
		feeds    = 1 << iota // the rule feeds one of the step's inputs
		consumes             // one of the step's inputs consumes the rule's files
	)
	marks := make([]uint8, len(rules))
	for i, s := range c.spec.Steps {
		if c.stopped {
			return
		}
		if c.stepAt(i) != s.Name {
			continue // a duplicate or unnamed step, already refused
		}
		clear(marks)
		seen := map[string]bool{}
		for j, in := range s.Inputs {
			ip := fp.Index(i).Child("inputs").Index(j)
			for _, f := range c.expand(in) {
				if seen[f] {
					continue
				}
				seen[f] = true
				pat, err := pathpattern.Parse(f)
				if err != nil {
					c.errs = append(c.errs, field.Invalid(ip, in, err.Error()))
					continue
				}
				declared := false
				for _, k := range idx.sameDepth(pat) {
					if c.overlaps(ip, pat, rules[k].Pattern) {
						marks[k] |= feeds | consumes
						declared = true
					}
				}
				for _, k := range idx.dirsAbove(pat.Depth()) {
					r := rules[k]
					if !c.charge(ip, 1) {
						break
					}
					prefix, ok, err := c.work.MatchPrefix(r.Pattern, pat.String())
					if err != nil {
						c.stop(ip, err)
						break
					}
					if ok && prefix != pat.String() {
						marks[k] |= feeds
						declared = true
					}
				}
				for _, k := range idx.under(pat.String()) {
					if !c.charge(ip, 1) {
						break
					}
					marks[k] |= consumes
				}
				if c.stopped {
					return
				}
				if !declared {
					c.warnings = append(c.warnings, fmt.Sprintf("%s: %q is not declared by any output; it must be placed in the volume by other means", ip, f))
				}
			}
		}
		for k, m := range marks {
			if m&feeds != 0 {
				c.rs.feeding[s.Name] = append(c.rs.feeding[s.Name], rules[k])
			}
			if m&consumes != 0 {
				c.rs.consumers[rules[k]] = append(c.rs.consumers[rules[k]], s.Name)
			}
		}
	}
	for r, steps := range c.rs.consumers {
		sort.Strings(steps)
		c.rs.consumers[r] = steps
	}
}

// stepAt returns the name the RuleSet knows spec.steps[i] by, or "" for a step it does not
// know (a duplicate name).
func (c *compiler) stepAt(i int) string {
	name := c.spec.Steps[i].Name
	for j := 0; j < i; j++ {
		if c.spec.Steps[j].Name == name {
			return ""
		}
	}
	return name
}

// ruleIndex groups rules by what lets two patterns match one path: their depth and
// literal first segment.
type ruleIndex struct {
	rules   []*Rule
	byHead  map[depthHead][]int
	globs   map[int][]int // rules with a glob first segment, by depth
	byDepth map[int][]int
	dirs    []int // Directory rules by increasing depth
	byText  []int // every rule, by pattern text
}

type depthHead struct {
	depth int
	head  string
}

func newRuleIndex(rules []*Rule) *ruleIndex {
	x := &ruleIndex{rules: rules, byHead: map[depthHead][]int{}, globs: map[int][]int{}, byDepth: map[int][]int{}}
	for k, r := range rules {
		d := r.Pattern.Depth()
		x.byDepth[d] = append(x.byDepth[d], k)
		if h, ok := r.Pattern.Head(); ok {
			x.byHead[depthHead{d, h}] = append(x.byHead[depthHead{d, h}], k)
		} else {
			x.globs[d] = append(x.globs[d], k)
		}
		if r.Type == v1alpha1.FileTypeDirectory {
			x.dirs = append(x.dirs, k)
		}
		x.byText = append(x.byText, k)
	}
	sort.SliceStable(x.dirs, func(i, j int) bool { return rules[x.dirs[i]].Pattern.Depth() < rules[x.dirs[j]].Pattern.Depth() })
	sort.Slice(x.byText, func(i, j int) bool { return rules[x.byText[i]].Pattern.String() < rules[x.byText[j]].Pattern.String() })
	return x
}

// sameDepth returns the rules that can overlap pat, in declaration order: of its depth,
// with its literal head or a glob one (every rule of its depth when its head is a glob).
func (x *ruleIndex) sameDepth(pat *pathpattern.Pattern) []int {
	d := pat.Depth()
	h, ok := pat.Head()
	if !ok {
		return x.byDepth[d]
	}
	out := append(slices.Clone(x.byHead[depthHead{d, h}]), x.globs[d]...)
	sort.Ints(out)
	return out
}

// dirsAbove returns the Directory rules of depth less than d.
func (x *ruleIndex) dirsAbove(d int) []int {
	n := sort.Search(len(x.dirs), func(i int) bool { return x.rules[x.dirs[i]].Pattern.Depth() >= d })
	return x.dirs[:n]
}

// under returns the rules whose pattern text lies under the directory text dir.
func (x *ruleIndex) under(dir string) []int {
	prefix := dir + "/"
	if dir == "." {
		return nil
	}
	lo := sort.Search(len(x.byText), func(i int) bool { return x.rules[x.byText[i]].Pattern.String() >= prefix })
	hi := lo
	for hi < len(x.byText) && strings.HasPrefix(x.rules[x.byText[hi]].Pattern.String(), prefix) {
		hi++
	}
	return x.byText[lo:hi]
}
