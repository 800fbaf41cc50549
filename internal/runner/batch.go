package runner

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/streamfs"
)

// RunBatch runs wf the way a batch workflow engine does, with no streaming: steps one
// after another in declaration order (each step's instances together), every process
// seeing the plain directory dir as its volume. It is the baseline `sluice run` is
// compared with (tests, `sluice-bench` mode batch-local). Logs go to logDir. It returns
// the makespan and an error naming the first failed instance.
func RunBatch(ctx context.Context, wf *v1alpha1.Workflow, dir, logDir string, env []string) (time.Duration, error) {
	if env == nil {
		env = os.Environ()
	}
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return 0, fmt.Errorf("creating log directory: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, fmt.Errorf("creating volume directory: %w", err)
	}
	r := &run{wf: wf, opts: Options{Env: env, StopGrace: 5 * time.Second}}
	r.log = discardLogger()
	start := time.Now()
	for _, s := range wf.Spec.Steps {
		if s.Template == nil {
			return 0, fmt.Errorf("step %s has no pod template", s.Name)
		}
		replicas := 1
		if s.Replicas != nil {
			replicas = int(*s.Replicas)
		}
		var wg sync.WaitGroup
		insts := make([]*instance, replicas)
		for i := range insts {
			insts[i] = &instance{
				r: r, step: s.Name, index: i, replicas: replicas, spec: s, plainDir: dir,
				logPath: filepath.Join(logDir, fmt.Sprintf("%s-%d.log", s.Name, i)),
			}
			wg.Add(1)
			go func(in *instance) { defer wg.Done(); in.run(ctx) }(insts[i])
		}
		wg.Wait()
		for _, in := range insts {
			if code, msg := in.exit(); code != 0 || msg != "" {
				return time.Since(start), fmt.Errorf("batch run of %s: %s failed (exit %d %s); last lines of %s:\n%s", wf.Name, in.name(), code, msg, in.logPath, tail(in.logPath, 10))
			}
		}
	}
	return time.Since(start), nil
}

// viewStats returns the instance's view counters (zero for a plain-directory run).
func (in *instance) viewStats() streamfs.Stats {
	if in.view == nil {
		return streamfs.Stats{}
	}
	return in.view.Stats()
}
