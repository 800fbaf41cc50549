package semantics

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"

	"github.com/sluice-io/sluice/api/v1alpha1"
)

// compileYAML compiles a WorkflowSpec written as YAML and fails the test on any error.
func compileYAML(t testing.TB, spec string) *RuleSet {
	t.Helper()
	rs, errs, _ := compileSpec(t, spec)
	if len(errs) > 0 {
		t.Fatalf("Compile: %v", errs.ToAggregate())
	}
	return rs
}

func compileSpec(t testing.TB, spec string) (*RuleSet, field.ErrorList, []string) {
	t.Helper()
	var s v1alpha1.WorkflowSpec
	if err := yaml.UnmarshalStrict([]byte(strings.ReplaceAll(spec, "\t", "  ")), &s); err != nil {
		t.Fatalf("bad test spec: %v", err)
	}
	rs, errs, warns := Compile(context.Background(), &s)
	return rs, errs, warns
}

// engineYAML returns an engine over the compiled spec.
func engineYAML(t testing.TB, spec string) *Engine {
	t.Helper()
	return NewEngine(compileYAML(t, spec))
}

// probe is an already cancelled context: a wait given it returns nil when its condition
// holds now and a *WaitError wrapping context.Canceled when it would block. It makes
// "blocks" assertions exact, with no timing involved.
func probe() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// blocked reports whether err is what a wait returns when it would have blocked.
func blocked(err error) bool { return errors.Is(err, context.Canceled) }

// waitAsync runs fn in a goroutine and returns a channel with its error.
func waitAsync(fn func() error) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- fn() }()
	return ch
}

// mustReturn asserts the waiter returns; the bound only catches a hang.
func mustReturn(t *testing.T, ch <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(10 * time.Second):
		t.Fatalf("%s still blocked", what)
		return nil
	}
}

// readableNow returns how many bytes a reader may read from offset off of p now and
// whether off is at EOF of the committed file: WaitRead's answer when it need not wait.
func readableNow(e *Engine, p string, off int64) (n int64, eof bool) {
	n, eof, _ = e.WaitRead(probe(), p, 0, off)
	return n, eof
}

// dirComplete reports whether a listing of directory p may end now (it is committed, or
// no rule governs it): WaitDir returns without waiting and without an error.
func dirComplete(e *Engine, p string) bool {
	_, err := e.WaitDir(probe(), p)
	return err == nil
}
