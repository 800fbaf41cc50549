package streamfs

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// A view keeps nodes for at most its entry budget of regular files (and a batch more):
// past it the kernel is asked to forget the least recently looked-up ones, and forgets
// them, so the view's memory stops growing with the files a workflow makes; the files
// stay whole and readable, each found again by a new lookup.
func TestViewForgetsFilesPastItsEntryBudget(t *testing.T) {
	const files, budget = 2000, 100
	h := newHarness(t, `
steps:
- name: w
  outputs: [{path: "data/*", commit: {rule: OnClose}}]
- name: r
  inputs: ["data/*"]
`, harnessOpts{tmpfs: true, entryBudget: budget})
	script := fmt.Sprintf(`mkdir $V/data && i=0 && while [ $i -lt %d ]; do echo $i > $V/data/f$i; i=$((i+1)); done`, files)
	if out, code := h.sh("w", script); code != 0 {
		t.Fatalf("writing %d files: exit %d: %s", files, code, out)
	}
	if out, code := h.sh("r", fmt.Sprintf(`i=0 && while [ $i -lt %d ]; do read x < $V/data/f$i && [ "$x" = $i ] || exit 1; i=$((i+1)); done`, files)); code != 0 {
		t.Fatalf("reading them back: exit %d: %s", code, out)
	}
	for _, step := range []string{"w", "r"} {
		dir := h.views[step].root.EmbeddedInode().GetChild("data")
		held := 0
		err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
			held = len(dir.Children())
			return held <= budget+pruneBatch, nil
		})
		if err != nil {
			t.Errorf("view %s holds nodes of %d files of %d, want at most %d (budget %d and a batch)", step, held, files, budget+pruneBatch, budget)
		}
	}
	// A file forgotten is looked up again, with its own attributes.
	if out, _ := h.sh("r", `stat -c %s $V/data/f0; cat $V/data/f0`); strings.Fields(out)[0] != "2" || strings.Fields(out)[1] != "0" {
		t.Errorf("f0 after it was forgotten: %q, want size 2 and 0", out)
	}
}
