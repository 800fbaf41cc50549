package controller

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/pathpattern"
	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

// A Workflow succeeds only if its results are whole, as a `sluice run` does
// (docs/kubernetes.md, "When a Workflow fails"): once every instance of every step has
// exited 0, every literal file output is committed and every literal permanent path has
// an object stored at or under it. This file finds the exceptions.

// unmetOutput is a declared output the workflow's steps did not deliver although every
// instance of them succeeded.
type unmetOutput struct {
	// Path is the declared volume path.
	Path string
	// Steps are the steps that declare it.
	Steps []string
	// Reason says what is missing.
	Reason string
}

func (u unmetOutput) String() string {
	return fmt.Sprintf("%s (output of %s): %s", pathpattern.Printable(u.Path), strings.Join(u.Steps, ", "), u.Reason)
}

// unmetOutputs lists the declared outputs of a workflow whose steps all succeeded that
// the committed files recorded in its KV bucket (files, written by each file's home node
// before its sidecar exits) do not show: a literal file output never committed, and a
// literal permanent path with no object stored at or under it. Glob patterns may match
// no file by design, and a Directory output's commit is not recorded in the bucket, so
// neither is checked. A file withdrawn with its failed attempt has no record (its
// commit was forgotten), so it counts as missing unless a retry committed it again.
func unmetOutputs(rules *semantics.RuleSet, files []wfmeta.FileMeta) []unmetOutput {
	committed := make(map[string]wfmeta.FileMeta, len(files))
	for _, f := range files {
		committed[f.Path] = f
	}
	var out []unmetOutput
	for _, rule := range rules.Rules() {
		if !rule.Pattern.IsLiteral() || rule.Type == v1alpha1.FileTypeDirectory {
			continue
		}
		p := rule.Pattern.String()
		if _, ok := committed[p]; !ok {
			out = append(out, unmetOutput{Path: p, Steps: rule.Producers,
				Reason: "never committed by its rule " + rule.String() + " (no commit recorded in the workflow's metadata)"})
		}
	}
	for _, pat := range rules.Permanent() {
		p := pat.String()
		if !pat.IsLiteral() || slices.ContainsFunc(out, func(u unmetOutput) bool { return u.Path == p }) {
			continue
		}
		stored := slices.ContainsFunc(files, func(f wfmeta.FileMeta) bool {
			return f.URI != "" && (f.Path == p || strings.HasPrefix(f.Path, p+"/"))
		})
		if stored {
			continue
		}
		res := rules.Resolve(p)
		var steps []string
		if res.Rule != nil {
			steps = res.Rule.Producers
		}
		out = append(out, unmetOutput{Path: p, Steps: steps, Reason: "declared permanent, but nothing was stored"})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

// maxUnmetEvents bounds the Warning Events one failed delivery check emits; the Failed
// condition's message counts the rest.
const maxUnmetEvents = 10

// unmetMessage is the Failed condition's message for unmet outputs: how many, and the
// first few by path.
func unmetMessage(unmet []unmetOutput) string {
	var b strings.Builder
	fmt.Fprintf(&b, "every step succeeded, but %d declared output(s) were not delivered: ", len(unmet))
	for i, u := range unmet {
		if i == maxUnmetEvents {
			fmt.Fprintf(&b, "; and %d more", len(unmet)-i)
			break
		}
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(u.String())
	}
	return b.String()
}
