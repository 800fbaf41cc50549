package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/runner"
	"github.com/sluice-io/sluice/internal/validation"
)

// The small-file probe of issue 41: one Python program writes files of 1 KiB under data/,
// another opens and reads each as it commits. Under FUSE a small file costs its round
// trips, so besides its makespan (the small-py pattern) the bench reports, at 10^3, 10^4
// and 10^5 files, what one file costs: microseconds, bytes of the run's memory, and FUSE
// requests of writer and reader.

// smallPyWriter and smallPyReader are the probe's programs; $PY runs them.
const (
	smallPyWriter = `import os, sys
d, n = os.environ["SLUICE_DIR"], int(os.environ["SMALLPY"])
os.makedirs(os.path.join(d, "data"), exist_ok=True)
for i in range(n):
    with open(os.path.join(d, "data", "f%06d" % i), "wb") as f:
        f.write(b"x" * 1024)
`
	smallPyReader = `import os, sys
d, n = os.environ["SLUICE_DIR"], int(os.environ["SMALLPY"])
t = 0
for i in range(n):
    with open(os.path.join(d, "data", "f%06d" % i), "rb") as f:
        t += len(f.read())
with open(os.path.join(d, "total"), "w") as f:
    f.write("%d\n" % t)
`
)

// smallPyPython is the interpreter of the probe: Debian's (make deps installs it).
const smallPyPython = "/usr/bin/python3"

// smallPyWorkflow is the probe on n files under firing rule fire.
func smallPyWorkflow(n int, fire v1alpha1.FireRule) *v1alpha1.Workflow {
	env := map[string]string{"SMALLPY": fmt.Sprint(n)}
	prod := fmt.Sprintf("exec %s -c %s", smallPyPython, shellQuote(smallPyWriter))
	cons := fmt.Sprintf("exec %s -c %s", smallPyPython, shellQuote(smallPyReader))
	return workflow("b-small-py",
		step("produce", 1, prod, env, []v1alpha1.Output{onClose("data/*", fire)}, nil),
		step("consume", 1, cons, env, []v1alpha1.Output{onClose("total", v1alpha1.FireUpdate)}, []string{"data/*"}))
}

// shellQuote quotes s for sh as one word.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// SmallFileScale measures the probe at each of the profile's ScaleFiles counts (10^3,
// 10^4 and 10^5 files) under Update: the
// microseconds a file costs against the same two programs one after another on the
// tmpfs, the heap this process holds at the run's end (every view still mounted) more than
// before it, and the FUSE requests a file costs the writer and the reader (counted in a
// run of its own: counting slows the views); and, between consecutive counts, the bytes of
// heap each added file holds. It needs python3.
func SmallFileScale(ctx context.Context, cfg Config) ([]Micro, error) {
	if _, err := os.Stat(smallPyPython); err != nil {
		return nil, fmt.Errorf("the small-file probe needs %s (make deps installs python3): %w", smallPyPython, err)
	}
	var out []Micro
	prevN, prevHeap := 0, int64(0)
	for _, n := range cfg.Profile.ScaleFiles {
		wf := smallPyWorkflow(n, v1alpha1.FireUpdate)
		dir, err := os.MkdirTemp(cfg.Dir, "small-")
		if err != nil {
			return nil, err
		}
		batch, err := runner.RunBatch(ctx, wf, filepath.Join(dir, "vol"), filepath.Join(dir, "logs"), nil)
		os.RemoveAll(dir)
		if err != nil {
			return nil, fmt.Errorf("small files %d on tmpfs: %w", n, err)
		}
		timed, heap, err := smallFileRun(ctx, cfg, wf, false)
		if err != nil {
			return nil, fmt.Errorf("small files %d: %w", n, err)
		}
		_, _, counted, err := smallFileRequests(ctx, cfg, wf)
		if err != nil {
			return nil, fmt.Errorf("small files %d, counting requests: %w", n, err)
		}
		per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(n) }
		label := fmt.Sprintf("small files, %d: ", n)
		out = append(out,
			Micro{Name: label + "µs a file, one python writes 1 KiB files, another reads each as it commits (Update), against the two one after another on tmpfs", Unit: "us", Volume: per(timed.Makespan.Duration()), Tmpfs: per(batch)},
			Micro{Name: label + "MB of heap at the run's end (the engine, the store, both views), more than before the run", Unit: "MB", Volume: float64(heap) / 1e6},
			Micro{Name: label + "FUSE requests a file, writer", Unit: "req", Volume: counted["produce"] / float64(n)},
			Micro{Name: label + "FUSE requests a file, reader", Unit: "req", Volume: counted["consume"] / float64(n)})
		if prevN > 0 {
			// what one more file costs, free of what every run holds whatever its size
			out = append(out, Micro{Name: fmt.Sprintf("small files, %d to %d: bytes of heap each added file holds at the run's end", prevN, n),
				Unit: "B", Volume: float64(heap-prevHeap) / float64(n-prevN)})
		}
		prevN, prevHeap = n, heap
	}
	return out, nil
}

// heapAtDone is a Progress that records this process's heap in use when the run is done,
// before its views are unmounted.
type heapAtDone struct{ heap uint64 }

// Update does nothing.
func (h *heapAtDone) Update(runner.Snapshot) {}

// Done records the heap in use after a garbage collection.
func (h *heapAtDone) Done(runner.Snapshot) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	h.heap = ms.HeapInuse
}

// smallFileRun runs wf once with sluice run and returns its report and how many bytes
// more of heap this process held at its end than before it.
func smallFileRun(ctx context.Context, cfg Config, wf *v1alpha1.Workflow, count bool) (*runner.Report, int64, error) {
	res, err := validation.ValidateWorkflow(ctx, wf.Name, wf)
	if err != nil {
		return nil, 0, err
	}
	dir, err := os.MkdirTemp(cfg.Dir, "small-")
	if err != nil {
		return nil, 0, err
	}
	defer os.RemoveAll(dir)
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	h := &heapAtDone{}
	rep, err := runner.Run(ctx, res.Workflow, res.Rules, runner.Options{WorkDir: filepath.Join(dir, "work"), OutDir: filepath.Join(dir, "out"),
		Progress: h, CountRequests: count})
	if err != nil {
		return nil, 0, err
	}
	return rep, int64(h.heap) - int64(before.HeapInuse), nil
}

// smallFileRequests runs wf counting its views' FUSE requests and returns them summed by
// step.
func smallFileRequests(ctx context.Context, cfg Config, wf *v1alpha1.Workflow) (*runner.Report, int64, map[string]float64, error) {
	rep, heap, err := smallFileRun(ctx, cfg, wf, true)
	if err != nil {
		return nil, 0, nil, err
	}
	by := map[string]float64{}
	for _, ir := range rep.Instances {
		for _, c := range ir.Requests {
			by[ir.Step] += float64(c)
		}
	}
	return rep, heap, by, nil
}
