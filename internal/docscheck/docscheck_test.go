package docscheck

import (
	"strings"
	"testing"
)

func TestParseMarkersBlocksAndTables(t *testing.T) {
	md := "# T\n" +
		"<!-- docs-check: run: sluice run x.yaml 2>&1 -->\n" +
		"```\n" +
		"out 1\n" +
		"```\n" +
		"- item:\n" +
		"  <!-- docs-check: skip: a diagram -->\n" +
		"  ```text\n" +
		"  a ─► b\n" +
		"\n" +
		"  ```\n" +
		"```yaml\n" +
		"k: v\n" +
		"```\n" +
		"<!-- docs-check: usage: sluice run -->\n" +
		"| flag | meaning |\n" +
		"|---|---|\n" +
		"| `--keep` | keep |\n" +
		"\n" +
		"```sh\n" +
		"make demo\n" +
		"```\n"
	blocks, err := Parse(md)
	if err != nil {
		t.Fatal(err)
	}
	if len(blocks) != 5 {
		t.Fatalf("%d blocks, want 5: %+v", len(blocks), blocks)
	}
	want := []struct {
		line        int
		kind, arg   string
		body        string
		needsMarker bool
	}{
		{3, KindRun, "sluice run x.yaml 2>&1", "out 1\n", true},
		{8, KindSkip, "a diagram", "a ─► b\n\n", true},
		{12, "", "", "k: v\n", false},
		{16, KindUsage, "sluice run", "| flag | meaning |\n|---|---|\n| `--keep` | keep |\n", false},
		{20, "", "", "make demo\n", true},
	}
	for i, w := range want {
		b := blocks[i]
		kind, arg := "", ""
		if b.Marker != nil {
			kind, arg = b.Marker.Kind, b.Marker.Arg
		}
		if b.Line != w.line || kind != w.kind || arg != w.arg || b.Body != w.body || b.NeedsMarker() != w.needsMarker {
			t.Errorf("block %d: line %d, marker %q %q, body %q, needs a marker %v; want line %d, %q %q, %q, %v",
				i, b.Line, kind, arg, b.Body, b.NeedsMarker(), w.line, w.kind, w.arg, w.body, w.needsMarker)
		}
	}

	// -update rewrites a block in place, keeping its indentation.
	got := ReplaceBody(md, blocks[1], "a ─► c\n")
	if !strings.Contains(got, "  ```text\n  a ─► c\n  ```\n```yaml") || strings.Contains(got, "a ─► b") {
		t.Errorf("ReplaceBody:\n%s", got)
	}
	if again, err := Parse(got); err != nil || len(again) != 5 || again[4].Line != 19 {
		t.Errorf("the rewritten document parses to %d blocks (%v)", len(again), err)
	}
}

func TestParseRefusesMisplacedOrUnknownMarkers(t *testing.T) {
	for _, md := range []string{
		"<!-- docs-check: run: x -->\n\n```\nout\n```\n", // not directly before
		"<!-- docs-check: runs: x -->\n```\nout\n```\n",  // unknown kind
		"<!-- docs-check: skip -->\n```\nout\n```\n",     // a skip needs its reason
		"<!-- docs-check: run: x -->\n",                  // before nothing
		"```\nnot closed\n",
	} {
		if _, err := Parse(md); err == nil {
			t.Errorf("Parse accepted %q", md)
		}
	}
}

func TestMatchIgnoresWhatChangesFromRunToRun(t *testing.T) {
	docs := `INSTANCE    START  FIRST INPUT  END    EXIT  IN          OUT
produce[0]  0.04s  -            0.84s  0     0 B         128.0 MiB
makespan 2.34s; steps one after another would take 3.11s (overlap 1.33x); 9 files committed
output sums.txt -> file:///root/sluice/sluice-out/p/sums.txt (624 B, sha256 88ecd55d269f08c0)
p   1.0s  3 files committed, 62.0 MiB written, 89.9 MiB/s
work directory kept: /tmp/sluice-run-cycle-2605831657
E1126 17:46:41.135638   32514 deadlock.go:95] "deadlock: stopping the run"
wait failed … op="readdir" reason="x"
must be a string (...)
`
	run := `INSTANCE    START  FIRST INPUT  END     EXIT  IN          OUT
produce[0]  0.04s  -            10.70s  0     0 B         128.0 MiB
makespan 4.38s; steps one after another would take 6.00s (overlap 1.37x); 9 files committed
output sums.txt -> file:///root/sluice/sluice-out/p/sums.txt (624 B, sha256 5c6677f4727d13cc)
p   1.2s  3 files committed, 62.0 MiB written, 1.1 GiB/s
work directory kept: /tmp/sluice-run-cycle-11   
I0101 01:02:03.000001   7 other.go:1] "deadlock: stopping the run"
wait failed logger="run" op="readdir" reason="x"
must be a string (YAML reads yes as a boolean)
`
	if ok, diff := Match(docs, run); !ok {
		t.Errorf("a run that differs only in timings, hashes and paths does not match:\n%s", diff)
	}
	for _, change := range []struct{ from, to string }{
		{"128.0 MiB\nmakespan", "127.0 MiB\nmakespan"},    // a size
		{"9 files committed", "8 files committed"},        // a count
		{"sums.txt (624 B", "sums.tx (624 B"},             // a name
		{`op="readdir"`, `op="lookup"`},                   // around an ellipsis
		{"must be a string", "must be an int"},            // before an ellipsis
		{"(overlap 1.37x)", "(overlap)"},                  // a field gone
		{"FIRST INPUT  END", "FIRST_INPUT  END"},          // a header
		{"(YAML reads", "\nmust be a string (YAML reads"}, // a line more
	} {
		changed := strings.Replace(run, change.from, change.to, 1)
		if changed == run {
			t.Fatalf("%q is not in the run", change.from)
		}
		if ok, _ := Match(docs, changed); ok {
			t.Errorf("output with %q changed to %q still matches the docs", change.from, change.to)
		}
	}
}

// Instances that start together are listed in the order they happened to start: a run
// that lists them the other way round matches, a run whose rows differ does not.
func TestMatchTakesInstanceRowsInAnyOrder(t *testing.T) {
	docs := `INSTANCE    START  FIRST INPUT  END    EXIT  IN          OUT
produce[0]  0.04s  -            0.84s  0     0 B         128.0 MiB
consume[0]  0.04s  0.05s        2.34s  0     128.0 MiB*  624 B
makespan 2.34s
`
	run := `INSTANCE    START  FIRST INPUT  END    EXIT  IN          OUT
consume[0]  0.01s  0.09s        3.83s  0     128.0 MiB*  624 B
produce[0]  0.03s  -            3.53s  0     0 B         128.0 MiB
makespan 3.83s
`
	if ok, diff := Match(docs, run); !ok {
		t.Errorf("the same instances in another order do not match:\n%s", diff)
	}
	if ok, _ := Match(docs, strings.Replace(run, "624 B", "625 B", 1)); ok {
		t.Error("a reordered table whose row differs matches")
	}
	if ok, _ := Match(docs, strings.Replace(run, "makespan 3.83s", "consume[0]  0.01s  0.09s  3.83s  0  128.0 MiB*  624 B", 1)); ok {
		t.Error("a table with a row in place of the makespan matches")
	}
}
