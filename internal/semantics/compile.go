package semantics

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/pathpattern"
)

// compiler accumulates a RuleSet and the problems found on the way.
type compiler struct {
	spec     *v1alpha1.WorkflowSpec
	aliases  map[string][]string
	rs       *RuleSet
	errs     field.ErrorList
	warnings []string
	// incomplete says that an output's rule could not be built (a malformed path): rules
	// that refer to it would be reported wrongly, so those checks are skipped.
	incomplete bool
	// work bounds what comparing the spec's patterns costs (MaxCompileWork); stopped
	// says that it ran out, or that the context ended, and the error is recorded: every
	// check that compares patterns stops.
	work    *pathpattern.Work
	stopped bool
	// depRules memoises ruleFor.
	depRules map[string]*Rule
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
// or that closes a cycle; homeNode.manual naming an unknown step or instance; a spec over
// the limits above (MaxPatterns, MaxExpandedPatternBytes, MaxOutputPatterns, pathpattern's
// segment and pattern lengths), or one whose checks need more than MaxCompileWork ("too
// costly", naming the field being checked). It looks at ctx as it goes: once ctx ends it
// stops with one field.ErrorTypeInternal error wrapping ctx's error, which a caller tells
// from a problem of the spec by ctx.Err().
func Compile(ctx context.Context, spec *v1alpha1.WorkflowSpec) (rs *RuleSet, errs field.ErrorList, warnings []string) {
	c := &compiler{
		spec:     spec,
		aliases:  map[string][]string{},
		rs:       &RuleSet{steps: map[string]StepInfo{}, consumers: map[*Rule][]string{}, feeding: map[string][]*Rule{}},
		work:     pathpattern.NewWork(ctx, MaxCompileWork),
		depRules: map[string]*Rule{},
	}
	if err := ctx.Err(); err != nil {
		c.stop(field.NewPath("spec"), err)
	} else {
		c.compile(field.NewPath("spec"))
	}
	c.rs.aliases = c.aliases
	c.rs.homeNode = spec.HomeNode.DeepCopy()
	if len(c.errs) > 0 {
		return nil, c.errs, c.warnings
	}
	return c.rs, nil, c.warnings
}

func (c *compiler) compile(fp *field.Path) {
	names := make(map[string]bool, len(c.spec.Aliases))
	for _, a := range c.spec.Aliases {
		names[a.Name] = true
	}
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
			if names[f] {
				c.errs = append(c.errs, field.Invalid(p.Child("files").Index(j), f, "an alias cannot name another alias"))
			}
		}
		c.aliases[a.Name] = a.Files
	}
	if !c.checkSize(fp) {
		return
	}
	c.compileSteps(fp.Child("steps"))
	c.rs.exclude = c.patterns(fp.Child("exclude"), c.spec.Exclude)
	c.rs.permanent = c.patterns(fp.Child("permanent"), c.spec.Permanent)
	c.checkPermanent(fp.Child("permanent"))
	c.checkDeps()
	c.relateInputs(fp.Child("steps"))
	c.checkLifetimes()
	c.checkStepCycles(fp.Child("steps"))
	c.checkHomeNode(fp.Child("homeNode"))
	if c.spec.Tiers != nil {
		c.rs.memTier = c.patterns(fp.Child("tiers", "memory"), c.spec.Tiers.Memory)
		c.rs.fsTier = c.patterns(fp.Child("tiers", "fs"), c.spec.Tiers.FS)
	}
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
		r.index = len(c.rs.rules)
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
		c.incomplete = true
		return nil
	}
	if pat.String() == "." {
		c.errs = append(c.errs, field.Invalid(op.Child("path"), o.Path, "the volume root cannot be an output"))
		c.incomplete = true
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

// checkPermanent refuses a permanent entry that no output declares, nor anything inside
// it, nor a directory it lies in: only governed files are committed, and so stored; an
// undeclared file is a step's scratch space, never uploaded, and a run would end with
// nothing stored under the name the user asked to keep.
func (c *compiler) checkPermanent(fp *field.Path) {
	for i, s := range c.spec.Permanent {
		ip := fp.Index(i)
		for _, f := range c.expand(s) {
			pat, err := pathpattern.Parse(f)
			if err != nil {
				continue // reported by patterns
			}
			related := false
			for _, r := range c.rs.rules {
				if related = c.related(ip, pat, r.Pattern); related || c.stopped {
					break
				}
			}
			if c.stopped {
				return
			}
			if !related {
				c.errs = append(c.errs, field.Invalid(fp.Index(i), s, fmt.Sprintf(
					"no step's outputs declare %q or anything in it, so nothing there is ever committed or stored: "+
						"declare it in the outputs of the step that writes it (for a directory of files, e.g. {path: %q})", f, f+"/*")))
				break
			}
		}
	}
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
			if strings.HasPrefix(r.Pattern.String(), perm.String()+"/") || c.overlaps(lp, perm, r.Pattern) {
				c.errs = append(c.errs, field.Invalid(lp, r.Lifetime, fmt.Sprintf("%q is permanent (%q): it is kept to be stored", r.Pattern, perm)))
			}
		}
		if c.stopped {
			return
		}
		if len(c.rs.consumers[r]) == 0 {
			c.errs = append(c.errs, field.Invalid(lp, r.Lifetime, fmt.Sprintf("no step declares %q as an input, so nothing would consume it", r.Pattern)))
		}
	}
}

// checkOverlaps refuses two different patterns that can match one path with different
// rules; identical rules may overlap (they make the path behave the same either way).
func (c *compiler) checkOverlaps() {
	if len(c.rs.rules) > MaxOutputPatterns {
		c.errs = append(c.errs, field.TooMany(field.NewPath("spec", "steps").Child("outputs"), len(c.rs.rules), MaxOutputPatterns))
		return
	}
	found := 0
	// check reports whether checking should go on after comparing a and b.
	check := func(a, b *Rule) bool {
		if a.index > b.index {
			a, b = b, a // the later declaration is the one refused
		}
		if a.Pattern.IsLiteral() && b.Pattern.IsLiteral() {
			return true // two literals overlap only when equal, and those were merged
		}
		if a.sameSemantics(b) && sameStrings(a.Producers, b.Producers) {
			return true
		}
		ok, err := c.work.Overlaps(a.Pattern, b.Pattern)
		if err != nil {
			c.stop(b.origins[0].Child("path"), err)
			return false
		}
		if !ok {
			return true
		}
		if found == maxOverlapErrors {
			c.errs = append(c.errs, field.Forbidden(b.origins[0].Child("path"),
				fmt.Sprintf("more overlapping patterns, not listed (the first %d are)", maxOverlapErrors)))
			return false
		}
		found++
		c.errs = append(c.errs, field.Invalid(b.origins[0].Child("path"), b.Pattern.String(),
			fmt.Sprintf("overlaps %q declared at %s: both can match the same path with different rules", a.Pattern, a.origins[0])))
		return true
	}
	// Patterns of different depths never match one path, nor patterns whose first
	// segments are different literals: compare within a group of one depth and one
	// literal head, and the patterns whose head is a glob with every pattern of their
	// depth. Declared workflows mostly have literal heads, so this is far from all pairs.
	type group struct {
		depth int
		head  string
	}
	groups := map[group][]*Rule{}
	globHeads := map[int][]*Rule{}
	for _, r := range c.rs.rules {
		if h, ok := r.Pattern.Head(); ok {
			g := group{r.Pattern.Depth(), h}
			groups[g] = append(groups[g], r)
		} else {
			globHeads[r.Pattern.Depth()] = append(globHeads[r.Pattern.Depth()], r)
		}
	}
	keys := make([]group, 0, len(groups))
	for g := range groups {
		keys = append(keys, g)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].depth != keys[j].depth {
			return keys[i].depth < keys[j].depth
		}
		return keys[i].head < keys[j].head
	})
	for _, g := range keys {
		rules := groups[g]
		for i := range rules {
			for j := i + 1; j < len(rules); j++ {
				if !check(rules[i], rules[j]) {
					return
				}
			}
			for _, o := range globHeads[g.depth] {
				if !check(rules[i], o) {
					return
				}
			}
		}
	}
	depths := make([]int, 0, len(globHeads))
	for d := range globHeads {
		depths = append(depths, d)
	}
	sort.Ints(depths)
	for _, d := range depths {
		rules := globHeads[d]
		for i := range rules {
			for j := i + 1; j < len(rules); j++ {
				if !check(rules[i], rules[j]) {
					return
				}
			}
		}
	}
}

// MaxOutputPatterns bounds the distinct output patterns of a Workflow (all steps, aliases
// expanded): the overlap check compares patterns of one depth pairwise, and admission
// must bound what a Workflow costs the controller and the webhook (docs/security.md).
const MaxOutputPatterns = 4096

// maxOverlapErrors is how many overlapping pairs a refusal lists before it stops looking.
const maxOverlapErrors = 20

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

// ruleFor resolves a dependency path to the rule that governs it, if any, within the
// compile's budget (charged to fp); nil once stopped.
func (c *compiler) ruleFor(fp *field.Path, p string) *Rule {
	if r, ok := c.depRules[p]; ok {
		return r
	}
	if c.stopped {
		return nil
	}
	res, err := c.rs.resolve(p, c.work)
	if err != nil {
		c.stop(fp, err)
		return nil
	}
	c.depRules[p] = res.Rule
	return res.Rule
}

// checkDeps refuses OnFile dependencies that nothing declares and dependency cycles,
// every one of them, whatever other errors were found, unless an output's rule is missing.
func (c *compiler) checkDeps() {
	if c.incomplete {
		return // rules are incomplete; cycles and references would be reported wrongly
	}
	for _, r := range c.rs.rules {
		for _, d := range r.Deps {
			if c.ruleFor(r.origins[0].Child("commit", "files"), d) == nil && !c.stopped {
				c.errs = append(c.errs, field.Invalid(r.origins[0].Child("commit", "files"), d,
					fmt.Sprintf("OnFile dependency %q is not declared by any output", d)))
			}
		}
	}
	// Depth-first search over rule -> rules of its dependencies; every edge back to a
	// rule on the stack closes a cycle.
	const (
		unvisited = iota
		onStack
		done
	)
	state := map[*Rule]int{}
	var stack []string
	var visit func(r *Rule)
	visit = func(r *Rule) {
		state[r] = onStack
		stack = append(stack, r.Pattern.String())
		for _, d := range r.Deps {
			dr := c.ruleFor(r.origins[0].Child("commit", "files"), d)
			if dr == nil || dr.Commit != v1alpha1.CommitOnFile && !(dr.Type == v1alpha1.FileTypeDirectory && len(dr.Deps) > 0) {
				continue
			}
			switch state[dr] {
			case onStack:
				from := slices.Index(stack, dr.Pattern.String())
				cycle := append(slices.Clone(stack[from:]), dr.Pattern.String())
				c.errs = append(c.errs, field.Invalid(r.origins[0].Child("commit", "files"), d,
					"OnFile dependency cycle: "+strings.Join(cycle, " -> ")))
			case unvisited:
				visit(dr)
			}
		}
		stack = stack[:len(stack)-1]
		state[r] = done
	}
	for _, r := range c.rs.rules {
		if r.Commit == v1alpha1.CommitOnFile && state[r] == unvisited {
			stack = stack[:0]
			visit(r)
		}
	}
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

// ListingNotes explains, for each glob input of a step of spec (compiled as rs) whose
// files another step makes in a plain directory, how a listing of that directory behaves
// (docs/semantics.md, "Listings"): it ends only once those producers have exited, so a
// glob in the step's command sees every file, and a Directory output lists files as they
// commit. One note a line, naming the input's field path; `sluice validate` prints them.
// They are not warnings: nothing is wrong with such a declaration.
func ListingNotes(spec *v1alpha1.WorkflowSpec, rs *RuleSet) []string {
	var notes []string
	fp := field.NewPath("spec", "steps")
	for i, s := range spec.Steps {
		for j, in := range s.Inputs {
			for _, f := range rs.Expand(in) {
				pat, err := pathpattern.Parse(f)
				if err != nil {
					continue
				}
				if n := listingNote(rs, s.Name, pat); n != "" {
					notes = append(notes, fmt.Sprintf("%s: %s", fp.Index(i).Child("inputs").Index(j), n))
				}
			}
		}
	}
	return notes
}

// listingNote is ListingNotes's note for step's input pat, or "".
func listingNote(rs *RuleSet, step string, pat *pathpattern.Pattern) string {
	if pat.IsLiteral() || pat.Depth() < 1 {
		return ""
	}
	dir := pathpattern.Parent(pat.String())
	if dp, err := pathpattern.Parse(dir); err != nil || !dp.IsLiteral() {
		return ""
	}
	var producers []string
	for _, r := range rs.ListingRules(dir, step) {
		for _, p := range r.Producers {
			if !slices.Contains(producers, p) {
				producers = append(producers, p)
			}
		}
	}
	if len(producers) == 0 {
		return ""
	}
	return fmt.Sprintf("a listing of %q (a glob, ls, find) ends only once step %s has exited, so that it shows every file of %q; declare %q as a Directory output to list its files as they commit",
		dir, strings.Join(producers, ", "), pat.String(), dir)
}
