package runner

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
)

// releaseOnWait is a Progress that creates release once a snapshot shows a step instance
// waiting as want says (a prefix of StepSnapshot.Waiting).
type releaseOnWait struct {
	release, want string
	seen          bool
}

func (p *releaseOnWait) Update(s Snapshot) {
	for _, st := range s.Steps {
		if !p.seen && strings.HasPrefix(st.Waiting, p.want) {
			p.seen = true
			_ = os.WriteFile(p.release, nil, 0o644)
		}
	}
}
func (p *releaseOnWait) Done(Snapshot) {}

// lines collects log lines, for tests that look for one.
type lines struct {
	mu  sync.Mutex
	all []string
}

func (l *lines) add(prefix, args string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.all = append(l.all, prefix+" "+args)
}

func (l *lines) find(subs ...string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.all {
		ok := true
		for _, s := range subs {
			ok = ok && strings.Contains(line, s)
		}
		if ok {
			return line
		}
	}
	return ""
}

// A producer of a Directory output that fails with no retries left, while a consumer's
// `ls` of the directory waits for its commit, ends that wait with an error naming the
// producer (EIO, docs/semantics.md "When waiting cannot end"), on the producer's node and
// on another one, and the run fails at once naming both, instead of waiting forever (the
// failed attempt's entry is withdrawn and the directory never commits). Under
// OnTermination the failed instance's exit does not commit the directory (empty, as it
// did).
func TestFailedProducerEndsDirectoryListing(t *testing.T) {
	for _, commit := range []string{"OnTermination}", "OnNFiles, count: 2}"} {
		for _, nodes := range []int{1, 2} {
			t.Run(fmt.Sprintf("%s/nodes=%d", strings.TrimRight(strings.Fields(commit)[0], ",}"), nodes), func(t *testing.T) {
				tmp := t.TempDir()
				release := filepath.Join(tmp, "release") // outside the volume
				wf, rules := load(t, "failed-dir.yaml", []byte(`apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: failed-dir}
spec:
  steps:
  - name: p
    template:
      spec:
        containers:
        - name: c
          image: x
          command: [sh, -c, 'mkdir "$SLUICE_DIR/tree"; echo a > "$SLUICE_DIR/tree/a"; while [ ! -e `+release+` ]; do sleep 0.05; done; exit 2']
    outputs: [{path: tree, type: Directory, commit: {rule: `+commit+`}]
  - name: c
    template: {spec: {containers: [{name: c, image: x, command: [ls, -l, $(SLUICE_DIR)/tree]}]}}
    inputs: [tree]
`))
				// The producer fails once the consumer's listing waits (the progress names
				// it); every wait would end after WaitTimeout, the run after Timeout.
				prog := &releaseOnWait{release: release, want: `c[0]: readdir of "tree"`}
				var log lines
				start := time.Now()
				rep, err := Run(context.Background(), wf, rules, Options{
					WorkDir: filepath.Join(tmp, "work"), OutDir: filepath.Join(tmp, "out"), Nodes: nodes,
					Progress: prog, WaitTimeout: time.Hour, Timeout: time.Minute,
					Log: funcr.New(log.add, funcr.Options{}),
				})
				took := time.Since(start)
				if !prog.seen {
					t.Fatalf("the consumer's listing never waited (err %v)", err)
				}
				var fe *FailedError
				if !errors.As(err, &fe) {
					t.Fatalf("run ended after %s with %v; want it to fail naming p[0] and c[0]", took.Round(time.Millisecond), err)
				}
				slices.Sort(fe.Failed)
				if !slices.Equal(fe.Failed, []string{"c[0]", "p[0]"}) || !strings.Contains(err.Error(), "p[0]: exit code 2") {
					t.Errorf("run failed with instances %q; want c[0] and p[0]:\n%v", fe.Failed, err)
				}
				if rep.WorkDir != "" {
					defer os.RemoveAll(rep.WorkDir)
				}
				b, _ := os.ReadFile(filepath.Join(tmp, "work", "logs", "c-0.log"))
				if !strings.Contains(string(b), "Input/output error") {
					t.Errorf("the consumer's ls printed %q; want an I/O error reading the directory", b)
				}
				if line := log.find("wait failed", `"step"="c"`, "tree", "its producer step p instance 0 failed with no retries left (exit code 2"); line == "" {
					t.Errorf("no log line of the consumer's failed wait names the failed producer; logged:\n%s", strings.Join(log.all, "\n"))
				}
				t.Log(string(b), log.find("wait failed"))
			})
		}
	}
}
