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

// Rule is the compiled rule of one declared pattern: its commit and firing rule and the
// steps that produce the files it matches. Rules are immutable once compiled.
type Rule struct {
	// Pattern is the cleaned pattern the rule applies to.
	Pattern *pathpattern.Pattern
	// Type says whether the pattern names files or a directory.
	Type v1alpha1.FileType
	// Commit is the commit rule.
	Commit v1alpha1.CommitRule
	// Count is the resolved count: closes (OnClose), producer instances (OnTermination),
	// committed entries (OnNFiles); 0 for OnFile.
	Count int
	// Deps are the cleaned paths whose commit commits this rule's files (OnFile).
	Deps []string
	// Fire is the firing rule.
	Fire v1alpha1.FireRule
	// Producers are the steps that write the files, sorted by name.
	Producers []string
	// Instances is the total number of producer instances (sum of their replicas).
	Instances int
	// Lifetime is how long the files' bytes are kept (Workflow or Consumed).
	Lifetime v1alpha1.Lifetime
	// Replicate is how the files' bytes reach the other nodes (Fetch or Stream).
	Replicate v1alpha1.Replication

	declaredCount int // count as written in the spec, 0 if absent
	origins       []*field.Path
	index         int // position in RuleSet.rules
}

// String describes the rule as it appears in logs and errors, e.g.
// `"chunks/*" (OnClose:1, Update)`.
func (r *Rule) String() string {
	c := string(r.Commit)
	switch r.Commit {
	case v1alpha1.CommitOnFile:
		c += "(" + strings.Join(r.Deps, ",") + ")"
	default:
		c += fmt.Sprintf(":%d", r.Count)
	}
	return fmt.Sprintf("%q (%s, %s)", r.Pattern.String(), c, r.Fire)
}

// producedBy reports whether step writes the rule's files.
func (r *Rule) producedBy(step string) bool {
	i := sort.SearchStrings(r.Producers, step)
	return i < len(r.Producers) && r.Producers[i] == step
}

// sameSemantics reports whether two rules make files behave alike.
func (r *Rule) sameSemantics(o *Rule) bool {
	if r.Type != o.Type || r.Commit != o.Commit || r.Fire != o.Fire || r.Lifetime != o.Lifetime || r.Replicate != o.Replicate || r.declaredCount != o.declaredCount || len(r.Deps) != len(o.Deps) {
		return false
	}
	for i := range r.Deps {
		if r.Deps[i] != o.Deps[i] {
			return false
		}
	}
	return true
}

// Resolution is what a path resolves to.
type Resolution struct {
	// Path is the cleaned path.
	Path string
	// Rule is the rule governing the path, nil when no rule applies (a plain file).
	Rule *Rule
	// Excluded is true when an exclude pattern matches the path or one of its ancestors.
	Excluded bool
	// Dir is the directory whose Directory rule the path inherits, "" when the path
	// matches a rule of its own.
	Dir string
	// Commit, Count, Deps and Fire are the effective rule for this path: a file inside a
	// declared directory inherits the directory's rule, except that OnNFiles (which counts
	// a directory's entries) becomes OnTermination of the directory's producers.
	Commit v1alpha1.CommitRule
	Count  int               // as Rule.Count
	Deps   []string          // as Rule.Deps
	Fire   v1alpha1.FireRule // as Rule.Fire
}

// Governed reports whether a rule governs the path.
func (r Resolution) Governed() bool { return r.Rule != nil }

// Describe names the path and its effective rule for log lines and errors.
func (r Resolution) Describe() string {
	if r.Rule == nil {
		return fmt.Sprintf("%q (no rule)", r.Path)
	}
	c := string(r.Commit)
	if r.Commit == v1alpha1.CommitOnFile {
		c += "(" + strings.Join(r.Deps, ",") + ")"
	} else {
		c += fmt.Sprintf(":%d", r.Count)
	}
	via := ""
	if r.Dir != "" {
		via = fmt.Sprintf(" via directory %q", r.Dir)
	}
	return fmt.Sprintf("%q (%s, %s%s)", r.Path, c, r.Fire, via)
}

// StepInfo is what the rule set knows of one step.
type StepInfo struct {
	// Name is the step's name.
	Name string
	// Replicas is its number of instances.
	Replicas int
	// Inputs are the step's declared inputs, aliases expanded.
	Inputs []string
}

// RuleSet is the compiled form of a WorkflowSpec's file declarations. It is immutable and
// safe for concurrent use.
type RuleSet struct {
	aliases   map[string][]string
	rules     []*Rule
	dirRules  []*Rule
	exclude   []*pathpattern.Pattern
	permanent []*pathpattern.Pattern
	// memTier and fsTier are spec.tiers (CAPIO-CL storage).
	memTier, fsTier []*pathpattern.Pattern
	steps           map[string]StepInfo
	stepOrder       []string
	// homeNode is spec.homeNode (nil: policy Create for every file); see Home.
	homeNode *v1alpha1.HomeNodeSpec
	// consumers and feeding relate rules and steps' inputs, found once by Compile
	// (relateInputs): the steps, sorted, whose inputs consume a rule's files, and the
	// rules, in declaration order, that feed a step's inputs.
	consumers map[*Rule][]string
	feeding   map[string][]*Rule
}

// Rules returns the compiled rules in declaration order.
func (rs *RuleSet) Rules() []*Rule { return rs.rules }

// Steps returns the workflow's steps in declaration order.
func (rs *RuleSet) Steps() []StepInfo {
	out := make([]StepInfo, 0, len(rs.stepOrder))
	for _, n := range rs.stepOrder {
		out = append(out, rs.steps[n])
	}
	return out
}

// producerOrder returns every step that may produce files: the declared steps in
// declaration order, then the stage-in step when spec.sources is set.
func (rs *RuleSet) producerOrder() []string {
	if _, ok := rs.steps[v1alpha1.StageInStep]; !ok {
		return rs.stepOrder
	}
	return append(slices.Clip(rs.stepOrder), v1alpha1.StageInStep)
}

// Step returns the named step and whether it exists.
func (rs *RuleSet) Step(name string) (StepInfo, bool) {
	s, ok := rs.steps[name]
	return s, ok
}

// Resolve returns the rule governing the cleaned path p (see pathpattern.Clean). The path's
// own rule wins over the rule of an enclosing directory, and the nearest directory wins
// over farther ones; an exclude pattern matching p or an ancestor makes it a plain file.
func (rs *RuleSet) Resolve(p string) Resolution {
	res, _ := rs.resolve(p, nil)
	return res
}

// resolve is Resolve, its matching charged to w when w is not nil; it returns w's error
// once the budget is spent.
func (rs *RuleSet) resolve(p string, w *pathpattern.Work) (Resolution, error) {
	res := Resolution{Path: p}
	for _, ex := range rs.exclude {
		_, ok, err := matchPrefix(w, ex, p)
		if err != nil {
			return res, err
		}
		if ok {
			res.Excluded = true
			return res, nil
		}
	}
	for _, r := range rs.rules {
		ok, err := match(w, r.Pattern, p)
		if err != nil {
			return res, err
		}
		if ok {
			res.Rule = r
			res.Commit, res.Count, res.Deps, res.Fire = r.Commit, r.Count, r.Deps, r.Fire
			return res, nil
		}
	}
	best := -1
	for _, r := range rs.dirRules {
		prefix, ok, err := matchPrefix(w, r.Pattern, p)
		if err != nil {
			return res, err
		}
		if ok && prefix != p && len(prefix) > best {
			best = len(prefix)
			res.Rule, res.Dir = r, prefix
		}
	}
	if res.Rule != nil {
		r := res.Rule
		res.Commit, res.Count, res.Deps, res.Fire = r.Commit, r.Count, r.Deps, r.Fire
		if r.Commit == v1alpha1.CommitOnNFiles {
			res.Commit, res.Count = v1alpha1.CommitOnTermination, r.Instances
		}
	}
	return res, nil
}

// match is pat.Match(p), charged to w when w is not nil.
func match(w *pathpattern.Work, pat *pathpattern.Pattern, p string) (bool, error) {
	if w == nil {
		return pat.Match(p), nil
	}
	return w.Match(pat, p)
}

// matchPrefix is pat.MatchPrefix(p), charged to w when w is not nil.
func matchPrefix(w *pathpattern.Work, pat *pathpattern.Pattern, p string) (string, bool, error) {
	if w == nil {
		prefix, ok := pat.MatchPrefix(p)
		return prefix, ok, nil
	}
	return w.MatchPrefix(pat, p)
}

// Expand returns the files an alias stands for, or s itself when it is not an alias.
func (rs *RuleSet) Expand(s string) []string {
	if files, ok := rs.aliases[s]; ok {
		return files
	}
	return []string{s}
}

// ImpliedDir reports whether the cleaned path p is a directory that must exist for some
// rule's files to exist ("counts" for "counts/*") without being governed itself, and
// step produces none of those files. Such a step sees the directory even before it is
// created, so that it can wait on the files in it; a producer must see it missing, so
// that it creates it.
func (rs *RuleSet) ImpliedDir(p, step string) bool {
	implied := false
	for _, r := range rs.rules {
		if r.Pattern.MatchAncestor(p) {
			if r.producedBy(step) {
				return false
			}
			implied = true
		}
	}
	return implied
}

// ListingRules returns the rules whose entries a listing of directory dir by step waits
// for: their pattern can match a path under dir (dir is an ancestor, as "counts" for
// "counts/*"), step declares an input that can match it, and step does not produce it.
// dir must not be governed itself (a Directory output has its own listing rule).
func (rs *RuleSet) ListingRules(dir, step string) []*Rule {
	if rs.Resolve(dir).Rule != nil {
		return nil
	}
	var out []*Rule
	for _, r := range rs.rules {
		if r.Pattern.MatchAncestor(dir) && !r.producedBy(step) && slices.Contains(rs.consumers[r], step) {
			out = append(out, r)
		}
	}
	return out
}

// MayWrite reports whether instances of step may create, write, truncate, rename or unlink
// the cleaned path p: paths without a rule are plain files anyone may write; a governed
// path only by the steps whose outputs declare it.
func (rs *RuleSet) MayWrite(step, p string) bool {
	res := rs.Resolve(p)
	return res.Rule == nil || res.Rule.producedBy(step)
}

// Permanent returns the workflow's permanent patterns (spec.permanent, aliases expanded),
// cleaned, in declaration order.
func (rs *RuleSet) Permanent() []*pathpattern.Pattern { return rs.permanent }

// IsPermanent reports whether the cleaned path p matches a permanent pattern, or lies in a
// permanent directory.
func (rs *RuleSet) IsPermanent(p string) bool {
	for _, pat := range rs.permanent {
		if _, ok := pat.MatchPrefix(p); ok {
			return true
		}
	}
	return false
}

// OnDisk reports whether the cleaned path p is to be kept in a node store's disk tier:
// it (or a directory it lies in) is listed in spec.tiers.fs and not in spec.tiers.memory
// (CAPIO-CL storage; a path in both stays in memory).
func (rs *RuleSet) OnDisk(p string) bool {
	return matchesPrefix(rs.fsTier, p) && !matchesPrefix(rs.memTier, p)
}

// PinnedToMemory reports whether the cleaned path p is listed in spec.tiers.memory (or lies
// in a directory listed there): it never moves to a disk tier.
func (rs *RuleSet) PinnedToMemory(p string) bool { return matchesPrefix(rs.memTier, p) }

// HasDiskTier reports whether spec.tiers.fs lists anything.
func (rs *RuleSet) HasDiskTier() bool { return len(rs.fsTier) > 0 }

func matchesPrefix(pats []*pathpattern.Pattern, p string) bool {
	for _, pat := range pats {
		if _, ok := pat.MatchPrefix(p); ok {
			return true
		}
	}
	return false
}

// MatchesAny reports whether the cleaned path p matches one of the files, globs,
// directories (p lies in it) or aliases in list: how home-node lists name files.
func (rs *RuleSet) MatchesAny(list []string, p string) bool {
	return MatchPrefixAny(rs.Patterns(list), p)
}

// Patterns parses the files, globs and directories of list, aliases expanded, for
// matching many paths against the same list (MatchPrefixAny) without parsing it again;
// entries that do not parse are left out, as MatchesAny ignores them.
func (rs *RuleSet) Patterns(list []string) []*pathpattern.Pattern {
	var pats []*pathpattern.Pattern
	for _, s := range list {
		for _, f := range rs.Expand(s) {
			if pat, err := pathpattern.Parse(f); err == nil {
				pats = append(pats, pat)
			}
		}
	}
	return pats
}

// MatchPrefixAny reports whether the cleaned path p is matched by one of pats, or lies in
// a directory one of them matches.
func MatchPrefixAny(pats []*pathpattern.Pattern, p string) bool {
	for _, pat := range pats {
		if _, ok := pat.MatchPrefix(p); ok {
			return true
		}
	}
	return false
}

// Consumers returns the steps, sorted, whose declared inputs match the cleaned path p.
func (rs *RuleSet) Consumers(p string) []string {
	var out []string
	for _, name := range rs.stepOrder {
		if rs.MatchesAny(rs.steps[name].Inputs, p) {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// Feeding returns the rules that may govern a file step reads: the rules whose patterns
// overlap one of its inputs, or whose directory holds one, in declaration order. It is how
// placement finds a step's producers (Rule.Producers) and how they fire (Rule.Fire).
// Compile found them; the slice is shared and must not be modified.
func (rs *RuleSet) Feeding(step string) []*Rule {
	return rs.feeding[step]
}
