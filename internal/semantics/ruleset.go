// Package semantics implements the CAPIO-CL semantics of a Workflow without any I/O: it
// resolves a path to its commit and firing rule (RuleSet) and runs the per-file state
// machine that answers whether a reader may open a file, how many bytes it may read and
// whether it has reached the end (Engine).
//
// The rules are those of the CAPIO-CL language as summarised in docs/semantics.md:
// commit rules on_termination[:N], on_close[:N], on_file, on_n_files; firing rules update
// and no_update; aliases, globs, exclude and a dir/file rule overriding its dir rule.
package semantics

import (
	"fmt"
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

// Managed reports whether a rule governs the path.
func (r Resolution) Managed() bool { return r.Rule != nil }

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

// Step returns the named step and whether it exists.
func (rs *RuleSet) Step(name string) (StepInfo, bool) {
	s, ok := rs.steps[name]
	return s, ok
}

// Resolve returns the rule governing the cleaned path p (see pathpattern.Clean). The path's
// own rule wins over the rule of an enclosing directory, and the nearest directory wins
// over farther ones; an exclude pattern matching p or an ancestor makes it a plain file.
func (rs *RuleSet) Resolve(p string) Resolution {
	res := Resolution{Path: p}
	for _, ex := range rs.exclude {
		if _, ok := ex.MatchPrefix(p); ok {
			res.Excluded = true
			return res
		}
	}
	for _, r := range rs.rules {
		if r.Pattern.Match(p) {
			res.Rule = r
			res.Commit, res.Count, res.Deps, res.Fire = r.Commit, r.Count, r.Deps, r.Fire
			return res
		}
	}
	best := -1
	for _, r := range rs.dirRules {
		if prefix, ok := r.Pattern.MatchPrefix(p); ok && prefix != p && len(prefix) > best {
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
	return res
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

// MayWrite reports whether instances of step may create, write, truncate, rename or unlink
// the cleaned path p: paths without a rule are plain files anyone may write; a governed
// path only by the steps whose outputs declare it.
func (rs *RuleSet) MayWrite(step, p string) bool {
	res := rs.Resolve(p)
	return res.Rule == nil || res.Rule.producedBy(step)
}

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
	for _, s := range list {
		for _, f := range rs.Expand(s) {
			if pat, err := pathpattern.Parse(f); err == nil {
				if _, ok := pat.MatchPrefix(p); ok {
					return true
				}
			}
		}
	}
	return false
}

// compiler accumulates a RuleSet and the problems found on the way.
type compiler struct {
	spec     *v1alpha1.WorkflowSpec
	aliases  map[string][]string
	rs       *RuleSet
	errs     field.ErrorList
	warnings []string
}

// Compile checks the file declarations of spec and compiles them into a RuleSet. It
// returns every problem as a field.Error whose path names the offending field (for example
// spec.steps[1].outputs[0].commit.files[0]), and warnings for declarations that are legal
// but probably not meant (an input no output declares). The RuleSet is nil when errs is not
// empty.
//
// Beyond what the CRD's OpenAPI and CEL rules check, Compile refuses: paths with "..", NUL
// or a malformed class; two patterns that can match one path with different rules (CAPIO-CL
// leaves the result undefined); an OnFile dependency that nothing declares, that is a glob,
// or that closes a cycle; homeNode.manual naming an unknown step or instance.
func Compile(spec *v1alpha1.WorkflowSpec) (rs *RuleSet, errs field.ErrorList, warnings []string) {
	c := &compiler{
		spec:    spec,
		aliases: map[string][]string{},
		rs:      &RuleSet{steps: map[string]StepInfo{}},
	}
	c.compile(field.NewPath("spec"))
	c.rs.aliases = c.aliases
	if len(c.errs) > 0 {
		return nil, c.errs, c.warnings
	}
	return c.rs, nil, c.warnings
}

func (c *compiler) compile(fp *field.Path) {
	for i, a := range c.spec.Aliases {
		p := fp.Child("aliases").Index(i)
		if _, dup := c.aliases[a.Name]; dup {
			c.errs = append(c.errs, field.Duplicate(p.Child("name"), a.Name))
			continue
		}
		if len(a.Files) == 0 {
			c.errs = append(c.errs, field.Required(p.Child("files"), "an alias must name at least one file"))
		}
		for j, f := range a.Files {
			if _, isAlias := c.aliasNamed(f); isAlias {
				c.errs = append(c.errs, field.Invalid(p.Child("files").Index(j), f, "an alias cannot name another alias"))
			}
		}
		c.aliases[a.Name] = a.Files
	}
	c.compileSteps(fp.Child("steps"))
	c.rs.exclude = c.patterns(fp.Child("exclude"), c.spec.Exclude)
	c.rs.permanent = c.patterns(fp.Child("permanent"), c.spec.Permanent)
	c.checkDeps()
	c.checkInputs(fp.Child("steps"))
	c.checkLifetimes()
	c.checkHomeNode(fp.Child("homeNode"))
	if c.spec.Tiers != nil {
		c.rs.memTier = c.patterns(fp.Child("tiers", "memory"), c.spec.Tiers.Memory)
		c.rs.fsTier = c.patterns(fp.Child("tiers", "fs"), c.spec.Tiers.FS)
	}
}

func (c *compiler) aliasNamed(s string) ([]string, bool) {
	for _, a := range c.spec.Aliases {
		if a.Name == s {
			return a.Files, true
		}
	}
	return nil, false
}

// expand replaces an alias name by the files it stands for (CAPIO-CL: an alias is usable
// anywhere a file is); an alias name wins over a file of the same name, except as the path
// of a Directory output, which always names the directory.
func (c *compiler) expand(s string) []string {
	if files, ok := c.aliases[s]; ok {
		return files
	}
	return []string{s}
}

// patterns parses every entry of list (after alias expansion), reporting bad ones at fp.
func (c *compiler) patterns(fp *field.Path, list []string) []*pathpattern.Pattern {
	var out []*pathpattern.Pattern
	for i, s := range list {
		for _, f := range c.expand(s) {
			pat, err := pathpattern.Parse(f)
			if err != nil {
				c.errs = append(c.errs, field.Invalid(fp.Index(i), s, err.Error()))
				continue
			}
			out = append(out, pat)
		}
	}
	return out
}

func (c *compiler) compileSteps(fp *field.Path) {
	if len(c.spec.Steps) == 0 {
		c.errs = append(c.errs, field.Required(fp, "a workflow needs at least one step"))
	}
	for i, s := range c.spec.Steps {
		p := fp.Index(i)
		if _, dup := c.rs.steps[s.Name]; dup {
			c.errs = append(c.errs, field.Duplicate(p.Child("name"), s.Name))
			continue
		}
		if s.Name == "" {
			c.errs = append(c.errs, field.Required(p.Child("name"), "a step needs a name"))
		}
		replicas := 1
		if s.Replicas != nil {
			replicas = int(*s.Replicas)
			if replicas < 1 {
				c.errs = append(c.errs, field.Invalid(p.Child("replicas"), replicas, "must be at least 1"))
			}
		}
		var inputs []string
		for _, in := range s.Inputs {
			inputs = append(inputs, c.expand(in)...)
		}
		c.rs.steps[s.Name] = StepInfo{Name: s.Name, Replicas: replicas, Inputs: inputs}
		c.rs.stepOrder = append(c.rs.stepOrder, s.Name)
	}
	if len(c.spec.Sources) > 0 {
		if _, taken := c.rs.steps[v1alpha1.StageInStep]; taken {
			c.errs = append(c.errs, field.Invalid(fp, v1alpha1.StageInStep, "the step name is reserved for spec.sources"))
		}
		c.rs.steps[v1alpha1.StageInStep] = StepInfo{Name: v1alpha1.StageInStep, Replicas: 1}
	}
	// byText merges declarations of the same pattern (several producers of one file).
	byText := map[string]*Rule{}
	add := func(op *field.Path, step, f string, o v1alpha1.Output) {
		r := c.outputRule(op, f, o)
		if r == nil {
			return
		}
		r.Producers = []string{step}
		if prev, ok := byText[r.Pattern.String()]; ok {
			if !prev.sameSemantics(r) {
				c.errs = append(c.errs, field.Invalid(op, o.Path, fmt.Sprintf("conflicts with %s: the same path %q is declared with another rule", prev.origins[0], r.Pattern)))
				return
			}
			if !prev.producedBy(step) {
				prev.Producers = append(prev.Producers, step)
				sort.Strings(prev.Producers)
			}
			prev.origins = append(prev.origins, op)
			return
		}
		byText[r.Pattern.String()] = r
		c.rs.rules = append(c.rs.rules, r)
	}
	for i, src := range c.spec.Sources {
		o := v1alpha1.Output{Path: src.Path, Type: src.Type, Commit: src.Commit, Fire: src.Fire}
		if o.Commit.Rule == "" {
			o.Commit.Rule = v1alpha1.CommitOnClose
		}
		if o.Fire == "" {
			o.Fire = v1alpha1.FireNoUpdate
		}
		sp := field.NewPath("spec", "sources").Index(i)
		if !strings.HasPrefix(src.From, "s3://") && !strings.HasPrefix(src.From, "file:///") {
			c.errs = append(c.errs, field.Invalid(sp.Child("from"), src.From, "must be an s3://bucket/key URL or, for sluice run, a file:/// path"))
		}
		add(sp, v1alpha1.StageInStep, src.Path, o)
	}
	for i, s := range c.spec.Steps {
		// A member of an alias output with an output of its own in the same step has that
		// output's rule: the member's rule refines the group's (CAPIO-CL lets a step list
		// an alias in output_stream and give its members rules in streaming).
		own := map[string]bool{}
		for _, o := range s.Outputs {
			if _, isAlias := c.aliases[o.Path]; !isAlias || o.Type == v1alpha1.FileTypeDirectory {
				own[o.Path] = true
			}
		}
		for j, o := range s.Outputs {
			op := fp.Index(i).Child("outputs").Index(j)
			var paths []string
			if members, isAlias := c.aliases[o.Path]; isAlias && o.Type != v1alpha1.FileTypeDirectory {
				for _, m := range members {
					if !own[m] {
						paths = append(paths, m)
					}
				}
			} else {
				// A directory output names the directory itself, even when an alias has
				// the same name (the issue's own example: alias "chunks" = "chunks/*").
				paths = []string{o.Path}
			}
			for _, f := range paths {
				add(op, s.Name, f, o)
			}
		}
	}
	for _, r := range c.rs.rules {
		for _, step := range r.Producers {
			r.Instances += c.rs.steps[step].Replicas
		}
		switch {
		case r.declaredCount > 0:
			r.Count = r.declaredCount
		case r.Commit == v1alpha1.CommitOnClose:
			r.Count = 1
		case r.Commit == v1alpha1.CommitOnTermination:
			r.Count = r.Instances
		}
		if r.Commit == v1alpha1.CommitOnTermination && r.Count > r.Instances {
			c.errs = append(c.errs, field.Invalid(r.origins[0].Child("commit", "count"), r.Count,
				fmt.Sprintf("OnTermination waits for %d instances but the producers of %q have %d", r.Count, r.Pattern, r.Instances)))
		}
		if r.Type == v1alpha1.FileTypeDirectory {
			c.rs.dirRules = append(c.rs.dirRules, r)
		}
	}
	c.checkOverlaps()
}

// outputRule compiles one declared output pattern f of output o at field path op.
func (c *compiler) outputRule(op *field.Path, f string, o v1alpha1.Output) *Rule {
	pat, err := pathpattern.Parse(f)
	if err != nil {
		c.errs = append(c.errs, field.Invalid(op.Child("path"), o.Path, err.Error()))
		return nil
	}
	if pat.String() == "." {
		c.errs = append(c.errs, field.Invalid(op.Child("path"), o.Path, "the volume root cannot be an output"))
		return nil
	}
	r := &Rule{Pattern: pat, Type: o.Type, Commit: o.Commit.Rule, Fire: o.Fire, Lifetime: o.Lifetime, Replicate: o.Replicate, origins: []*field.Path{op}}
	if r.Type == "" {
		r.Type = v1alpha1.FileTypeFile
	}
	if r.Lifetime == "" {
		r.Lifetime = v1alpha1.LifetimeWorkflow
	}
	if r.Replicate == "" {
		r.Replicate = v1alpha1.ReplicateFetch
	}
	if r.Lifetime == v1alpha1.LifetimeConsumed && r.Type == v1alpha1.FileTypeDirectory {
		c.errs = append(c.errs, field.Invalid(op.Child("lifetime"), r.Lifetime, "Consumed applies to files, not to a Directory"))
	}
	if r.Commit == "" {
		r.Commit = v1alpha1.CommitOnTermination
	}
	if r.Fire == "" {
		r.Fire = v1alpha1.FireUpdate
	}
	if o.Commit.Count != nil {
		r.declaredCount = int(*o.Commit.Count)
		if r.declaredCount < 1 {
			c.errs = append(c.errs, field.Invalid(op.Child("commit", "count"), r.declaredCount, "must be at least 1"))
		}
	}
	switch r.Commit {
	case v1alpha1.CommitOnNFiles:
		if r.Type != v1alpha1.FileTypeDirectory {
			c.errs = append(c.errs, field.Invalid(op.Child("commit", "rule"), r.Commit, "OnNFiles applies only to type Directory"))
		}
		if o.Commit.Count == nil {
			c.errs = append(c.errs, field.Required(op.Child("commit", "count"), "OnNFiles needs the number of files"))
		}
	case v1alpha1.CommitOnFile:
		if len(o.Commit.Files) == 0 {
			c.errs = append(c.errs, field.Required(op.Child("commit", "files"), "OnFile needs at least one file"))
		}
		if o.Commit.Count != nil {
			c.errs = append(c.errs, field.Forbidden(op.Child("commit", "count"), "not allowed with rule OnFile"))
		}
	}
	if r.Commit != v1alpha1.CommitOnFile && len(o.Commit.Files) > 0 {
		c.errs = append(c.errs, field.Forbidden(op.Child("commit", "files"), "allowed only with rule OnFile"))
	}
	for k, d := range o.Commit.Files {
		for _, df := range c.expand(d) {
			dp, err := pathpattern.Parse(df)
			switch {
			case err != nil:
				c.errs = append(c.errs, field.Invalid(op.Child("commit", "files").Index(k), d, err.Error()))
			case !dp.IsLiteral():
				c.errs = append(c.errs, field.Invalid(op.Child("commit", "files").Index(k), d, "an OnFile dependency must name a file or directory, not a glob"))
			default:
				r.Deps = append(r.Deps, dp.String())
			}
		}
	}
	sort.Strings(r.Deps)
	return r
}

// checkLifetimes refuses a Consumed output that is permanent (it must stay to be stored)
// or that no step declares as an input (nothing would ever consume it).
func (c *compiler) checkLifetimes() {
	for _, r := range c.rs.rules {
		if r.Lifetime != v1alpha1.LifetimeConsumed {
			continue
		}
		lp := r.origins[0].Child("lifetime")
		for _, perm := range c.rs.permanent {
			if pathpattern.Overlaps(perm, r.Pattern) || strings.HasPrefix(r.Pattern.String(), perm.String()+"/") {
				c.errs = append(c.errs, field.Invalid(lp, r.Lifetime, fmt.Sprintf("%q is permanent (%q): it is kept to be stored", r.Pattern, perm)))
			}
		}
		if len(c.rs.consumersOf(r.Pattern)) == 0 {
			c.errs = append(c.errs, field.Invalid(lp, r.Lifetime, fmt.Sprintf("no step declares %q as an input, so nothing would consume it", r.Pattern)))
		}
	}
}

// consumersOf returns the steps, sorted, whose declared inputs can match a path of pat
// (an input naming one of its directories included).
func (rs *RuleSet) consumersOf(pat *pathpattern.Pattern) []string {
	var out []string
	for _, name := range rs.stepOrder {
		s := rs.steps[name]
		for _, in := range s.Inputs {
			ip, err := pathpattern.Parse(in)
			if err == nil && (pathpattern.Overlaps(ip, pat) || strings.HasPrefix(pat.String(), ip.String()+"/")) {
				out = append(out, name)
				break
			}
		}
	}
	sort.Strings(out)
	return out
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

// checkOverlaps refuses two different patterns that can match one path with different
// rules; identical rules may overlap (they make the path behave the same either way).
func (c *compiler) checkOverlaps() {
	rules := c.rs.rules
	for i := 0; i < len(rules); i++ {
		for j := i + 1; j < len(rules); j++ {
			a, b := rules[i], rules[j]
			if !pathpattern.Overlaps(a.Pattern, b.Pattern) {
				continue
			}
			if a.sameSemantics(b) && sameStrings(a.Producers, b.Producers) {
				continue
			}
			c.errs = append(c.errs, field.Invalid(b.origins[0].Child("path"), b.Pattern.String(),
				fmt.Sprintf("overlaps %q declared at %s: both can match the same path with different rules", a.Pattern, a.origins[0])))
		}
	}
}

func sameStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// ruleFor resolves a dependency path to the rule that governs it, if any.
func (c *compiler) ruleFor(p string) *Rule {
	return c.rs.Resolve(p).Rule
}

// checkDeps refuses OnFile dependencies that nothing declares and dependency cycles.
func (c *compiler) checkDeps() {
	if len(c.errs) > 0 {
		return // rules are incomplete; cycles and references would be reported wrongly
	}
	for _, r := range c.rs.rules {
		for _, d := range r.Deps {
			if c.ruleFor(d) == nil {
				c.errs = append(c.errs, field.Invalid(r.origins[0].Child("commit", "files"), d,
					fmt.Sprintf("OnFile dependency %q is not declared by any output", d)))
			}
		}
	}
	// Depth-first search over rule -> rules of its dependencies.
	const (
		unvisited = iota
		onStack
		done
	)
	state := map[*Rule]int{}
	var stack []string
	var visit func(r *Rule) bool
	visit = func(r *Rule) bool {
		state[r] = onStack
		stack = append(stack, r.Pattern.String())
		for _, d := range r.Deps {
			dr := c.ruleFor(d)
			if dr == nil || dr.Commit != v1alpha1.CommitOnFile && !(dr.Type == v1alpha1.FileTypeDirectory && len(dr.Deps) > 0) {
				continue
			}
			switch state[dr] {
			case onStack:
				stack = append(stack, dr.Pattern.String())
				c.errs = append(c.errs, field.Invalid(dr.origins[0].Child("commit", "files"), d,
					"OnFile dependency cycle: "+strings.Join(stack, " -> ")))
				return true
			case unvisited:
				if visit(dr) {
					return true
				}
			}
		}
		stack = stack[:len(stack)-1]
		state[r] = done
		return false
	}
	for _, r := range c.rs.rules {
		if r.Commit == v1alpha1.CommitOnFile && state[r] == unvisited {
			stack = stack[:0]
			if visit(r) {
				return
			}
		}
	}
}

// Feeding returns the rules that may govern a file step reads: the rules whose patterns
// overlap one of its inputs, or whose directory holds one. It is how placement finds a
// step's producers (Rule.Producers) and how they fire (Rule.Fire).
func (rs *RuleSet) Feeding(step string) []*Rule {
	si, ok := rs.steps[step]
	if !ok {
		return nil
	}
	var out []*Rule
	seen := map[*Rule]bool{}
	for _, in := range si.Inputs {
		pat, err := pathpattern.Parse(in)
		if err != nil {
			continue
		}
		for _, r := range rs.rules {
			if !seen[r] && feeds(r, pat) {
				seen[r] = true
				out = append(out, r)
			}
		}
	}
	return out
}

// feeds reports whether rule r can govern a path pat matches: the patterns overlap, or r
// is a directory holding such a path.
func feeds(r *Rule, pat *pathpattern.Pattern) bool {
	if pathpattern.Overlaps(r.Pattern, pat) {
		return true
	}
	if r.Type == v1alpha1.FileTypeDirectory && r.Pattern.Depth() < pat.Depth() {
		if prefix, ok := r.Pattern.MatchPrefix(pat.String()); ok && prefix != pat.String() {
			return true
		}
	}
	return false
}

// checkInputs warns about inputs that no output declares: they may be placed in the volume
// by other means (stage-in, another tool), so this is not an error.
func (c *compiler) checkInputs(fp *field.Path) {
	for i, s := range c.spec.Steps {
		for j, in := range s.Inputs {
			ip := fp.Index(i).Child("inputs").Index(j)
			for _, f := range c.expand(in) {
				pat, err := pathpattern.Parse(f)
				if err != nil {
					c.errs = append(c.errs, field.Invalid(ip, in, err.Error()))
					continue
				}
				if !c.declared(pat) {
					c.warnings = append(c.warnings, fmt.Sprintf("%s: %q is not declared by any output; it must be placed in the volume by other means", ip, f))
				}
			}
		}
	}
}

// declared reports whether some output rule can govern a path pat matches.
func (c *compiler) declared(pat *pathpattern.Pattern) bool {
	for _, r := range c.rs.rules {
		if feeds(r, pat) {
			return true
		}
	}
	return false
}

func (c *compiler) checkHomeNode(fp *field.Path) {
	hn := c.spec.HomeNode
	if hn == nil {
		return
	}
	c.patterns(fp.Child("create"), hn.Create)
	c.patterns(fp.Child("hashing"), hn.Hashing)
	if hn.Policy == v1alpha1.HomeNodeManual && len(hn.Manual) == 0 {
		c.errs = append(c.errs, field.Required(fp.Child("manual"), "policy Manual needs at least one entry"))
	}
	for i, m := range hn.Manual {
		mp := fp.Child("manual").Index(i)
		c.patterns(mp.Child("files"), m.Files)
		st, ok := c.rs.steps[m.Step]
		if !ok {
			c.errs = append(c.errs, field.NotFound(mp.Child("step"), m.Step))
			continue
		}
		if m.Instance != nil && (*m.Instance < 0 || int(*m.Instance) >= st.Replicas) {
			c.errs = append(c.errs, field.Invalid(mp.Child("instance"), *m.Instance,
				fmt.Sprintf("step %q has instances 0..%d", m.Step, st.Replicas-1)))
		}
	}
}
