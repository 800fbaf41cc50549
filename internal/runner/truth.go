package runner

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/outputs"
	"github.com/sluice-io/sluice/internal/pathpattern"
	"github.com/sluice-io/sluice/internal/semantics"
)

// A run succeeds only if its results are whole (docs/sluice-run.md, "When a run fails"):
// every declared output of the steps that succeeded committed, every permanent output
// stored, and no result built from withdrawn bytes. This file finds the exceptions.

// UnmetOutput is a declared output that the steps producing it did not deliver although
// every instance of them succeeded: a literal output path never created or never
// committed, or a literal permanent path with nothing stored under it.
type UnmetOutput struct {
	// Path is the declared volume path.
	Path string `json:"path"`
	// Steps are the steps that declare it.
	Steps []string `json:"steps"`
	// Reason says what is missing, e.g. "never created" or "not committed: closes 2 of 3".
	Reason string `json:"reason"`
}

// TaintedResult is a step instance that succeeded on an input withdrawn after it read it
// (the input's producer attempt failed later): what it made may rest on bytes that no
// longer exist, so its own governed outputs are withdrawn in turn and the run fails.
type TaintedResult struct {
	// Instance is the consumer, as step[i].
	Instance string `json:"instance"`
	// Input is the withdrawn file it had read.
	Input string `json:"input"`
	// Reason is why the input was withdrawn.
	Reason string `json:"reason"`
	// Withdrawn are the consumer's own outputs taken back because of it.
	Withdrawn []string `json:"withdrawn,omitempty"`
}

// taint withdraws the outputs of in, an instance that finished successfully after reading
// the file w withdrew, and records it so the run fails naming both. Its outputs'
// consumers are tainted in turn by the withdrawals this makes (lineage).
func (r *run) taint(in *instance, w *semantics.WithdrawnError) {
	name := fmt.Sprintf("%s[%d]", in.step, in.index)
	reason := fmt.Sprintf("step %s instance %d, which wrote it, had read %s, withdrawn since (%s)", in.step, in.index, pathpattern.Printable(w.Path), w.Reason)
	paths, err := in.view.Withdraw(reason)
	if err != nil {
		r.log.Error(err, "withdrawing the outputs of an instance that read a withdrawn file", "step", in.step, "instance", in.index)
	}
	r.log.Error(nil, "an instance that finished had read a file withdrawn since: its outputs are withdrawn and the run fails",
		"step", in.step, "instance", in.index, "path", pathpattern.Printable(w.Path), "reason", w.Reason, "withdrawn", len(paths))
	in.mu.Lock()
	in.withdrawn = append(in.withdrawn, paths...)
	in.mu.Unlock()
	r.truthMu.Lock()
	defer r.truthMu.Unlock()
	r.tainted = append(r.tainted, TaintedResult{Instance: name, Input: w.Path, Reason: w.Reason, Withdrawn: paths})
}

// taintedResults returns the tainted instances recorded so far, by instance and input.
func (r *run) taintedResults() []TaintedResult {
	r.truthMu.Lock()
	defer r.truthMu.Unlock()
	out := slices.Clone(r.tainted)
	sort.Slice(out, func(i, j int) bool {
		if out[i].Instance != out[j].Instance {
			return out[i].Instance < out[j].Instance
		}
		return out[i].Input < out[j].Input
	})
	return out
}

// unmetOutputs lists the declared outputs of rep's run that steps whose every instance
// succeeded did not deliver: literal output paths that are not committed, and literal
// permanent paths with no stored output at or under them. Glob patterns may match no
// file by design and are not checked. It reads every node's engine, which have heard
// every node's events once the run has settled.
func (r *run) unmetOutputs(rep *Report) []UnmetOutput {
	succeeded := map[string]bool{}
	for _, ir := range rep.Instances {
		ok, seen := succeeded[ir.Step]
		succeeded[ir.Step] = (ok || !seen) && ir.ExitCode == 0 && ir.Error == ""
	}
	allSucceeded := func(steps []string) bool {
		for _, s := range steps {
			if !succeeded[s] {
				return false
			}
		}
		return len(steps) > 0
	}
	// A file's state is the most advanced any node has heard of: the run has settled, so
	// they agree, unless an event is still being applied somewhere.
	status := func(p string) semantics.FileStatus {
		var best semantics.FileStatus
		for _, n := range r.nodes {
			st := n.Engine.Status(p)
			if st.Committed || st.Released || !best.Exists && st.Exists {
				best = st
			}
			if st.Committed || st.Released {
				break
			}
		}
		return best
	}
	withdrawn := map[string]bool{} // by the failed attempts of instances that then succeeded
	for _, ir := range rep.Instances {
		for _, p := range ir.Withdrawn {
			withdrawn[p] = true
		}
	}
	var out []UnmetOutput
	for _, rule := range r.rules.Rules() {
		if !rule.Pattern.IsLiteral() || !allSucceeded(rule.Producers) {
			continue
		}
		p := rule.Pattern.String()
		if withdrawnByTaint(rep, p) {
			continue // the tainted result names it
		}
		st := status(p)
		why := undelivered(st, rule)
		if why == "never created" && withdrawn[p] {
			why = "written by a failed attempt, withdrawn with it, and not written again by the attempt that succeeded"
		}
		if why != "" {
			out = append(out, UnmetOutput{Path: p, Steps: rule.Producers, Reason: why})
		}
	}
	for _, pat := range r.rules.Permanent() {
		p := pat.String()
		if !pat.IsLiteral() || slices.ContainsFunc(out, func(u UnmetOutput) bool { return u.Path == p }) {
			continue
		}
		res := r.rules.Resolve(p)
		if res.Rule == nil || !allSucceeded(res.Rule.Producers) {
			continue
		}
		if st := status(p); st.Released || withdrawnByTaint(rep, p) {
			continue
		}
		stored := slices.ContainsFunc(rep.Outputs, func(o outputs.Output) bool {
			return o.Path == p || strings.HasPrefix(o.Path, p+"/")
		})
		if !stored {
			out = append(out, UnmetOutput{Path: p, Steps: res.Rule.Producers, Reason: "declared permanent, but nothing was stored"})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

// withdrawnByTaint reports whether p was withdrawn from a tainted instance (it is listed
// there already).
func withdrawnByTaint(rep *Report, p string) bool {
	for _, t := range rep.Tainted {
		if slices.Contains(t.Withdrawn, p) {
			return true
		}
	}
	return false
}

// undelivered says why the literal output st of rule is not delivered, or "" when it is
// (committed, or released after its commit).
func undelivered(st semantics.FileStatus, rule *semantics.Rule) string {
	switch {
	case st.Committed || st.Released:
		return ""
	case !st.Exists:
		return "never created"
	}
	what := "not committed"
	switch rule.Commit {
	case v1alpha1.CommitOnClose:
		what += fmt.Sprintf(": closed %d of %d times", st.Closes, rule.Count)
	case v1alpha1.CommitOnNFiles:
		what += fmt.Sprintf(": %d of %d committed files", st.CommittedEntries, rule.Count)
	case v1alpha1.CommitOnFile:
		what += fmt.Sprintf(": waits for %s", strings.Join(rule.Deps, ", "))
	}
	return what + " by its rule " + rule.String()
}
