package bench

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/servers"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/internal/validation"
)

func TestWordcountPatternIsTheExample(t *testing.T) {
	example, err := os.ReadFile("../../examples/wordcount/workflow.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(example, wordcountYAML) {
		t.Fatal("internal/bench/wordcount.yaml differs from examples/wordcount/workflow.yaml: copy it over")
	}
}

// Every pattern of both profiles is a valid Workflow under both firing rules.
func TestPatternsAreValid(t *testing.T) {
	for _, prof := range []Profile{Quick, Full} {
		for _, p := range Patterns(prof) {
			for _, fire := range []v1alpha1.FireRule{v1alpha1.FireUpdate, v1alpha1.FireNoUpdate} {
				if _, err := validation.ValidateWorkflow(context.Background(), p.Name, p.Build(fire)); err != nil {
					t.Errorf("%s/%s/%s: %v", prof.Name, p.Name, fire, err)
				}
			}
		}
	}
}

// Repeat reports the median of each measure with its range, in first-seen order.
func TestRepeatTakesMediansAndRanges(t *testing.T) {
	vols := []float64{30, 10, 20}
	i := 0
	got, err := Repeat(3, func() ([]Micro, error) {
		v := vols[i]
		i++
		return []Micro{{Name: "a", Unit: "MB/s", Volume: v, Tmpfs: 2 * v}, {Name: "b", Unit: "us", Volume: 1}}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Name != "a" || got[1].Name != "b" {
		t.Fatalf("measures %+v, want a then b", got)
	}
	if a := got[0]; a.Volume != 20 || a.VolumeMin != 10 || a.VolumeMax != 30 || a.Tmpfs != 40 || a.Ratio() != 0.5 {
		t.Errorf("a = %+v, want median 20 (10–30), tmpfs 40, ratio 0.5", a)
	}
}

// The plot draws every mode in its own colour: a run with a result in each mode (as the
// quick profile has) writes the PNG.
func TestPlotDrawsEveryMode(t *testing.T) {
	var results []Result
	for i, m := range Modes {
		if _, ok := modeColors[m]; !ok {
			t.Errorf("mode %s has no colour", m)
		}
		results = append(results, Result{Pattern: "1toN", Mode: string(m), Runs: []time.Duration{time.Duration(i+1) * time.Second}})
	}
	out := filepath.Join(t.TempDir(), "results.png")
	if err := Plot(out, "every mode", results); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(out); err != nil || st.Size() == 0 {
		t.Fatalf("no plot written: %v", err)
	}
}

// The small-file rows give, per file, its time against tmpfs, the heap it holds and the
// FUSE requests of the writer and the reader (those of a Python open, write, close and
// open, read, close: docs/benchmarks.md).
func TestSmallFileScaleRows(t *testing.T) {
	testenv.Root(t, "runs sluice run in FUSE views")
	if _, err := os.Stat(smallPyPython); err != nil {
		t.Skip("needs " + smallPyPython)
	}
	prof := Quick
	prof.ScaleFiles = []int{200}
	rows, err := SmallFileScale(context.Background(), Config{Profile: prof, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 4 {
		t.Fatalf("rows %+v, want 4 for 200 files", rows)
	}
	if rows[0].Volume <= 0 || rows[0].Tmpfs <= 0 {
		t.Errorf("time row %+v: want figures above 0", rows[0])
	}
	// Each file costs the writer 6 requests and the reader 4 (5 with a READ where the
	// kernel offers no passthrough), and a few for the whole run.
	if w, r := rows[2].Volume, rows[3].Volume; w < 6 || w > 6.2 || r < 4 || r > 5.2 {
		t.Errorf("requests a file: writer %.2f, reader %.2f; want 6 and 4 (or 5)", w, r)
	}
}

// batch-rclone moves each step's files through the bucket with rclone: the consumer of the
// 1to1 pattern reads every file the producer wrote, as in batch-s3 and batch-local.
func TestBatchRcloneMovesFilesThroughTheBucket(t *testing.T) {
	testenv.Integration(t, "MinIO (hack/servers.sh)")
	testenv.Root(t, "runs steps as sluice run's batch mode does")
	if _, err := exec.LookPath("rclone"); err != nil {
		t.Skip("needs rclone (make deps)")
	}
	m, err := servers.StartMinIO(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Stop)
	prof := Quick
	prof.Files, prof.FileMiB, prof.WriteKiB = 2, 1, 1024
	var pat Pattern
	for _, p := range Patterns(prof) {
		if p.Name == "1to1" {
			pat = p
		}
	}
	cfg := Config{Profile: prof, S3Endpoint: m.Endpoint, S3AccessKey: m.AccessKey, S3SecretKey: m.SecretKey}
	dir := filepath.Join(t.TempDir(), "run-rclone")
	if _, err := batchRclone(context.Background(), cfg, pat.Build(v1alpha1.FireUpdate), dir); err != nil {
		t.Fatal(err)
	}
	sums, err := os.ReadFile(filepath.Join(dir, "step-1", "sums"))
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(sums, []byte("\n")); n != 2 || !bytes.Contains(sums, []byte("data/f1")) {
		t.Errorf("the consumer's sums:\n%s\nwant one line for each of the 2 files", sums)
	}
}
