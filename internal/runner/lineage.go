package runner

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/sluice-io/sluice/internal/outputs"
	"github.com/sluice-io/sluice/internal/pathpattern"
)

// A failed run keeps in --out only what rests on nothing that failed (docs/sluice-run.md,
// "When a run fails"): a stored permanent output whose step failed, did not deliver what it
// declared, or reads (by its declared inputs, or by what its instances opened) what such a
// step makes, directly or through other steps, is removed from the object store and listed
// in the report. A script that looks at --out rather than the exit code finds no result
// computed from a missing, failed or killed producer.

// RemovedOutput is a permanent output that a failed run stored and then took back
// because it may rest on what failed.
type RemovedOutput struct {
	// Path is the file's volume path.
	Path string `json:"path"`
	// URI is where it had been stored.
	URI string `json:"uri"`
	// Reason names the step that made it and the failure it may rest on, e.g. "made by
	// step c, which reads what step p makes; p[0] failed (exit code 3)".
	Reason string `json:"reason"`
}

// objectRemover is an object store that can take an object back (objstore.Dir,
// objstore.S3).
type objectRemover interface {
	// Remove deletes the object under key; a missing object is not an error.
	Remove(ctx context.Context, key string) error
}

// failedSteps returns, for each step whose results cannot be trusted in rep's failed run,
// why: its own failure (an instance failed with no retries left, an output it declares
// is unmet or incomplete, an instance succeeded on withdrawn bytes), or, transitively,
// that it reads what such a step makes.
func (r *run) failedSteps(rep *Report) map[string]string {
	bad := map[string]string{}
	mark := func(step, why string) {
		if _, ok := bad[step]; !ok {
			bad[step] = why
		}
	}
	for _, ir := range rep.Instances {
		if ir.ExitCode != 0 || ir.Error != "" {
			why := ir.Error
			if why == "" {
				why = fmt.Sprintf("exit code %d", ir.ExitCode)
			}
			mark(ir.Step, fmt.Sprintf("%s failed (%s)", ir.Name(), why))
		}
	}
	for _, u := range rep.Unmet {
		for _, s := range u.Steps {
			mark(s, fmt.Sprintf("step %s did not deliver %s (%s)", s, pathpattern.Printable(u.Path), u.Reason))
		}
	}
	for _, f := range rep.Incomplete {
		if rule := r.rules.Resolve(f.Path).Rule; rule != nil {
			for _, s := range rule.Producers {
				mark(s, fmt.Sprintf("%s is incomplete (%s)", pathpattern.Printable(f.Path), f.Reason))
			}
		}
	}
	for _, t := range rep.Tainted {
		step, _, _ := strings.Cut(t.Instance, "[")
		mark(step, fmt.Sprintf("%s read %s, withdrawn since", t.Instance, pathpattern.Printable(t.Input)))
	}
	// What each step reads: the rules feeding its declared inputs, and the rules of the
	// governed files its instances opened.
	reads := map[string][]string{} // step -> producer steps of what it reads
	for _, s := range r.rules.Steps() {
		for _, rule := range r.rules.Feeding(s.Name) {
			reads[s.Name] = append(reads[s.Name], rule.Producers...)
		}
	}
	for _, in := range r.instances {
		if in.view == nil {
			continue
		}
		for _, p := range in.view.OpenedInputs() {
			if rule := r.rules.Resolve(p).Rule; rule != nil {
				reads[in.step] = append(reads[in.step], rule.Producers...)
			}
		}
	}
	for changed := true; changed; {
		changed = false
		steps := make([]string, 0, len(reads))
		for s := range reads {
			steps = append(steps, s)
		}
		sort.Strings(steps)
		for _, s := range steps {
			if _, ok := bad[s]; ok {
				continue
			}
			for _, from := range reads[s] {
				if why, ok := bad[from]; ok && from != s {
					bad[s] = fmt.Sprintf("step %s reads what step %s makes; %s", s, from, why)
					changed = true
					break
				}
			}
		}
	}
	return bad
}

// removeDerived takes back, from the object store, the permanent outputs of rep's failed
// run made by steps failedSteps names, moves them from rep.Outputs to rep.Removed and
// returns the errors of removals that failed (those outputs stay listed as stored).
func (r *run) removeDerived(rep *Report) error {
	bad := r.failedSteps(rep)
	if len(bad) == 0 {
		return nil
	}
	rm, canRemove := r.opts.ObjStore.(objectRemover)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var errs []string
	kept := rep.Outputs[:0:0]
	for _, o := range rep.Outputs {
		why := outputTaint(r, bad, o)
		if why == "" {
			kept = append(kept, o)
			continue
		}
		if !canRemove {
			kept = append(kept, o)
			errs = append(errs, fmt.Sprintf("%s: %s, but the object store cannot remove it", pathpattern.Printable(o.Path), why))
			continue
		}
		if err := rm.Remove(ctx, o.Path); err != nil {
			kept = append(kept, o)
			errs = append(errs, fmt.Sprintf("removing %s (%s): %v", pathpattern.Printable(o.Path), why, err))
			continue
		}
		r.log.Info("removed a stored permanent output that may rest on what failed", "path", pathpattern.Printable(o.Path), "uri", o.URI, "reason", why)
		rep.Removed = append(rep.Removed, RemovedOutput{Path: o.Path, URI: o.URI, Reason: why})
	}
	rep.Outputs = kept
	if len(errs) > 0 {
		return fmt.Errorf("permanent outputs that may rest on what failed are still stored: %s", strings.Join(errs, "; "))
	}
	return nil
}

// outputTaint says why the stored output o may rest on what failed ("" when it does
// not): a step that made it is in bad.
func outputTaint(r *run, bad map[string]string, o outputs.Output) string {
	rule := r.rules.Resolve(o.Path).Rule
	if rule == nil {
		return ""
	}
	producers := slices.Clone(rule.Producers)
	sort.Strings(producers)
	for _, s := range producers {
		if why, ok := bad[s]; ok {
			return fmt.Sprintf("made by step %s: %s", s, why)
		}
	}
	return ""
}
