package runner

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/streamfs"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/internal/validation"
)

func TestMain(m *testing.M) {
	// Everything the tests mount lives under a temp root of this package's own.
	root, err := os.MkdirTemp("", "runner-test-")
	if err != nil {
		panic(err)
	}
	os.Setenv("TMPDIR", root)
	code := m.Run()
	data, _ := os.ReadFile("/proc/self/mounts")
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 2 && strings.HasPrefix(f[1], root) {
			os.Stderr.WriteString("tests left a mount behind: " + f[1] + "\n")
			code = 1
		}
	}
	os.RemoveAll(root)
	os.Exit(code)
}

func load(t *testing.T, file string, data []byte) (*v1alpha1.Workflow, *semantics.RuleSet) {
	t.Helper()
	testenv.Root(t, "runs workflows in FUSE views")
	var res *validation.Result
	var err error
	if data == nil {
		res, err = validation.LoadFile(context.Background(), file)
	} else {
		res, err = validation.Load(context.Background(), file, data)
	}
	if err != nil {
		t.Fatal(err)
	}
	return res.Workflow, res.Rules
}

// The wordcount example under sluice run gives byte for byte the result of its commands
// run one after another on a plain directory, and its counters start reading before the
// split step ends.
func TestWordcountMatchesBatchRun(t *testing.T) {
	wf, rules := load(t, "../../examples/wordcount/workflow.yaml", nil)
	tmp := t.TempDir()
	rep, err := Run(context.Background(), wf, rules, Options{WorkDir: filepath.Join(tmp, "work"), OutDir: filepath.Join(tmp, "out")})
	if err != nil {
		t.Fatal(err)
	}
	plain := filepath.Join(tmp, "plain")
	if err := os.MkdirAll(plain, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := RunBatch(context.Background(), wf, plain, filepath.Join(tmp, "batch-logs"), nil); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(tmp, "out", "result", "wordcount.txt"))
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(filepath.Join(plain, "result", "wordcount.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if len(want) < 1000 || !bytes.Equal(got, want) {
		t.Fatalf("sluice run result (%d bytes) differs from the batch run's (%d bytes)", len(got), len(want))
	}
	if len(rep.Outputs) != 1 || rep.Outputs[0].Size != int64(len(want)) {
		t.Errorf("report outputs = %+v", rep.Outputs)
	}
	var splitEnd time.Time
	for _, ir := range rep.Instances {
		if ir.Step == "split" {
			splitEnd = ir.End
		}
	}
	for _, ir := range rep.Instances {
		if ir.Step != "count" {
			continue
		}
		if ir.FirstInput.IsZero() || !ir.FirstInput.Before(splitEnd) {
			t.Errorf("%s read its first input at %v, split ended at %v: no streaming", ir.Name(), ir.FirstInput.Sub(rep.Start), splitEnd.Sub(rep.Start))
		}
	}
	if rep.WorkDir != filepath.Join(tmp, "work") {
		t.Errorf("a given work dir must be kept; report says %q", rep.WorkDir)
	}
}

const envWorkflow = `apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: env}
spec:
  steps:
  - name: s
    replicas: 2
    template:
      spec:
        initContainers:
        - {name: i1, image: x, command: [sh, -c, 'echo i1 >> "$SLUICE_DIR/order-$SLUICE_INSTANCE"']}
        - {name: i2, image: x, command: [sh, -c, 'echo i2 >> "$SLUICE_DIR/order-$SLUICE_INSTANCE"']}
        containers:
        - name: main
          image: x
          env:
          - {name: GREETING, value: "hi $(SLUICE_STEP)"}
          - {name: ESCAPED, value: "$$(NOT)"}
          command: [sh, -c]
          args: ['echo "$(GREETING) $SLUICE_WORKFLOW $SLUICE_INSTANCE/$SLUICE_REPLICAS $ESCAPED $(SLUICE_INSTANCE)" > "$SLUICE_DIR/out-$SLUICE_INSTANCE.txt"; pwd > "$SLUICE_DIR/pwd-$SLUICE_INSTANCE"']
    outputs: [{path: "out-*.txt", commit: {rule: OnClose}}]
  permanent: ["out-*.txt"]
`

func TestEnvironmentExpansionAndInitContainers(t *testing.T) {
	wf, rules := load(t, "env.yaml", []byte(envWorkflow))
	tmp := t.TempDir()
	work := filepath.Join(tmp, "work")
	if _, err := Run(context.Background(), wf, rules, Options{WorkDir: work, OutDir: filepath.Join(tmp, "out"), StoreOnDisk: true}); err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"hi s env 0/2 $(NOT) 0\n", "hi s env 1/2 $(NOT) 1\n"} {
		got, err := os.ReadFile(filepath.Join(tmp, "out", "out-"+string(rune('0'+i))+".txt"))
		if err != nil || string(got) != want {
			t.Errorf("instance %d wrote %q (%v), want %q", i, got, err, want)
		}
		order, _ := os.ReadFile(filepath.Join(work, "store", "order-"+string(rune('0'+i))))
		if string(order) != "i1\ni2\n" {
			t.Errorf("init containers ran as %q, want i1 then i2", order)
		}
		pwd, _ := os.ReadFile(filepath.Join(work, "store", "pwd-"+string(rune('0'+i))))
		if !strings.HasPrefix(string(pwd), filepath.Join(work, "mounts")) {
			t.Errorf("working directory %q is not the instance's view", pwd)
		}
	}
}

func TestFailureNamesInstanceAndKeepsLogs(t *testing.T) {
	wf, rules := load(t, "fail.yaml", []byte(`apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: fail}
spec:
  steps:
  - name: ok
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, "echo fine > $SLUICE_DIR/f"]}]}}
    outputs: [{path: f, commit: {rule: OnClose}}]
  - name: bad
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, "echo something broke; exit 3"]}]}}
`))
	rep, err := Run(context.Background(), wf, rules, Options{OutDir: t.TempDir()})
	var fe *FailedError
	if !errors.As(err, &fe) {
		t.Fatalf("err = %v, want a FailedError", err)
	}
	msg := err.Error()
	for _, want := range []string{"workflow fail failed: bad[0]", "bad[0]: exit code 3", "something broke"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q:\n%s", want, msg)
		}
	}
	if rep.WorkDir == "" {
		t.Fatal("a failed run must keep its work directory")
	}
	defer os.RemoveAll(rep.WorkDir)
	if _, err := os.Stat(filepath.Join(rep.WorkDir, "logs", "bad-0.log")); err != nil {
		t.Error(err)
	}
}

// Cancelling a run (Ctrl-C) stops every process group and unmounts every view; a reader
// blocked on a file that will never commit does not keep it alive.
func TestInterruptStopsEverything(t *testing.T) {
	started := filepath.Join(t.TempDir(), "started")
	if err := syscall.Mkfifo(started, 0o600); err != nil {
		t.Fatal(err)
	}
	wf, rules := load(t, "stuck.yaml", []byte(`apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: stuck}
spec:
  steps:
  - name: p
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'exec 3>"$SLUICE_DIR/f"; echo $$ > `+started+`; sleep 1000']}]}}
    outputs: [{path: f, commit: {rule: OnClose}}]
  - name: c
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'cat "$SLUICE_DIR/f"']}]}}
`))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var rep *Report
	go func() {
		var err error
		rep, err = Run(ctx, wf, rules, Options{OutDir: t.TempDir(), StopGrace: time.Second})
		done <- err
	}()
	// the producer writes its pid into the fifo once it holds f open
	pidc := make(chan []byte, 1)
	go func() { b, _ := os.ReadFile(started); pidc <- b }()
	var pidData []byte
	select {
	case pidData = <-pidc:
	case <-time.After(60 * time.Second):
		t.Fatal("producer never started")
	}
	cancel()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "interrupted") {
			t.Errorf("err = %v, want interrupted", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("run did not stop after cancel")
	}
	if rep != nil && rep.WorkDir != "" {
		os.RemoveAll(rep.WorkDir)
	}
	var pid int
	for _, c := range strings.TrimSpace(string(pidData)) {
		pid = pid*10 + int(c-'0')
	}
	if pid > 0 && syscall.Kill(pid, 0) == nil {
		t.Errorf("producer process %d still alive", pid)
	}
}

// Both firing rules of the 1-to-1 example give the same checksums, and under NoUpdate the
// consumer reads before the producer has closed its first file, with FUSE passthrough
// where the kernel offers it (auto) and with the views serving every request (off).
func TestPipelineExamples(t *testing.T) {
	sums := map[string][]byte{}
	for _, run := range []struct {
		name string
		mode streamfs.PassthroughMode
	}{{"update", streamfs.PassthroughAuto}, {"noupdate", streamfs.PassthroughAuto}, {"update", streamfs.PassthroughOff}, {"noupdate", streamfs.PassthroughOff}} {
		wf, rules := load(t, "../../examples/pipeline/"+run.name+".yaml", nil)
		out := t.TempDir()
		rep, err := Run(context.Background(), wf, rules, Options{OutDir: out, Passthrough: run.mode})
		if err != nil {
			t.Fatalf("%s with passthrough %s: %v", run.name, run.mode, err)
		}
		name := run.name + " passthrough " + run.mode.String()
		b, err := os.ReadFile(filepath.Join(out, "sums.txt"))
		if err != nil {
			t.Fatal(err)
		}
		if n := bytes.Count(b, []byte("\n")); n != 8 {
			t.Fatalf("%s: %d checksums, want 8:\n%s", name, n, b)
		}
		sums[name] = b
		if rep.Instances[1].FirstInput.IsZero() {
			t.Errorf("%s: consumer read nothing", name)
		}
	}
	// the data is random per run, so compare shape, not bytes: 8 lines of "hash  data/file-k"
	for name, b := range sums {
		for k, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			if !strings.HasSuffix(line, "  data/file-"+string(rune('0'+k))) || len(strings.Fields(line)[0]) != 64 {
				t.Errorf("%s line %d = %q", name, k, line)
			}
		}
	}
}

// A reused work directory starts empty: the second run's appending step writes one line,
// not the first run's line and its own, and the other node replays no event of the first
// run (each run has streams of its own).
func TestReusedWorkDirStartsEmpty(t *testing.T) {
	wf, rules := load(t, "append.yaml", []byte(`apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: append}
spec:
  permanent: [log.txt, copy.txt]
  steps:
  - name: p
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'echo line >> "$SLUICE_DIR/log.txt"']}]}}
    outputs: [{path: log.txt}]
  - name: c
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'cat "$SLUICE_DIR/log.txt" > "$SLUICE_DIR/copy.txt"']}]}}
    inputs: [log.txt]
    outputs: [{path: copy.txt}]
`))
	tmp := t.TempDir()
	work := filepath.Join(tmp, "work")
	for run := 1; run <= 2; run++ {
		out := filepath.Join(tmp, fmt.Sprint("out", run))
		if _, err := Run(context.Background(), wf, rules, Options{WorkDir: work, OutDir: out, Nodes: 2}); err != nil {
			t.Fatalf("run %d: %v", run, err)
		}
		for _, f := range []string{"log.txt", "copy.txt"} {
			if b, err := os.ReadFile(filepath.Join(out, f)); err != nil || string(b) != "line\n" {
				t.Errorf("run %d: %s = %q (%v), want the one line this run wrote", run, f, b, err)
			}
		}
	}
}

// A write that fails (the store is full) leaves its file incomplete for good, even when
// the writer ignores the error and exits 0: the file never commits, its reader gets EIO
// instead of a truncated file, it is not stored as a permanent output, and the run fails
// naming it.
func TestFailedWriteNeverCommits(t *testing.T) {
	wf, rules := load(t, "full.yaml", []byte(`apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: full}
spec:
  volume: {sizeLimit: 1Mi}
  permanent: [out.bin, count.txt]
  steps:
  - name: p
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'head -c 3000000 /dev/zero > "$SLUICE_DIR/out.bin"; exit 0']}]}}
    outputs: [{path: out.bin, commit: {rule: OnClose}}]
  - name: c
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'wc -c < "$SLUICE_DIR/out.bin" > "$SLUICE_DIR/count.txt"']}]}}
    inputs: [out.bin]
    outputs: [{path: count.txt}]
`))
	tmp := t.TempDir()
	out := filepath.Join(tmp, "out")
	rep, err := Run(context.Background(), wf, rules, Options{WorkDir: filepath.Join(tmp, "work"), OutDir: out, SpaceWait: 100 * time.Millisecond})
	var failed *FailedError
	if !errors.As(err, &failed) {
		t.Fatalf("run: %v, want a FailedError", err)
	}
	if !strings.Contains(err.Error(), "incomplete file out.bin") || !strings.Contains(err.Error(), "node store is full") {
		t.Errorf("the run's error does not name the incomplete file and why:\n%v", err)
	}
	if len(rep.Incomplete) != 1 || rep.Incomplete[0].Path != "out.bin" {
		t.Errorf("report lists incomplete files %+v, want out.bin", rep.Incomplete)
	}
	for _, ir := range rep.Instances {
		if ir.Step == "c" && ir.ExitCode == 0 {
			t.Error("the reader of the incomplete file succeeded")
		}
	}
	if _, err := os.Stat(filepath.Join(out, "out.bin")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the incomplete file was stored as a permanent output (%v)", err)
	}
}

// A file left incomplete by an attempt that then failed (its write found the store full)
// is withdrawn with the attempt: its space is freed, the retry writes it whole, and the
// run succeeds with the retry's bytes stored.
func TestRetryAfterAFailedWriteSucceeds(t *testing.T) {
	tr := t.TempDir()
	wf, rules := load(t, "full-retry.yaml", []byte(`apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: full-retry}
spec:
  volume: {sizeLimit: 1Mi}
  permanent: [out.bin]
  steps:
  - name: p
    backoffLimit: 1
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'set -e; if [ -e `+tr+`/tried ]; then head -c 1000 /dev/zero > "$SLUICE_DIR/out.bin"; else touch `+tr+`/tried; head -c 3000000 /dev/zero > "$SLUICE_DIR/out.bin"; fi']}]}}
    outputs: [{path: out.bin, commit: {rule: OnClose}}]
`))
	tmp := t.TempDir()
	out := filepath.Join(tmp, "out")
	rep, err := Run(context.Background(), wf, rules, Options{WorkDir: filepath.Join(tmp, "work"), OutDir: out, SpaceWait: 100 * time.Millisecond})
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if len(rep.Incomplete) != 0 || rep.Instances[0].Attempts != 2 {
		t.Errorf("incomplete %+v, %d attempts; want none and 2", rep.Incomplete, rep.Instances[0].Attempts)
	}
	if st, err := os.Stat(filepath.Join(out, "out.bin")); err != nil || st.Size() != 1000 {
		t.Errorf("stored out.bin: %v %v, want the retry's 1000 bytes", st, err)
	}
}

// consumedSpec is a pipeline whose intermediates together exceed the node store (2 MiB):
// a writes part1 (1.5 MiB), b reads it, and c writes part2 (1.5 MiB) once b has
// summarised part1. It fits only if part1 leaves the store when b is done.
const consumedSpec = `apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: consumed}
spec:
  volume: {sizeLimit: 2Mi}
  permanent: [sums.txt]
  steps:
  - name: a
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'head -c 1572864 /dev/zero > "$SLUICE_DIR/part1"']}]}}
    outputs: [{path: part1, commit: {rule: OnClose}%s}]
  - name: b
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'wc -c < "$SLUICE_DIR/part1" > "$SLUICE_DIR/sum1"']}]}}
    inputs: [part1]
    outputs: [{path: sum1, commit: {rule: OnClose}}]
  - name: c
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'set -e; cat "$SLUICE_DIR/sum1" > /dev/null; head -c 1572864 /dev/zero > "$SLUICE_DIR/part2"']}]}}
    inputs: [sum1]
    outputs: [{path: part2, commit: {rule: OnClose}%s}]
  - name: d
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, '{ cat "$SLUICE_DIR/sum1"; wc -c < "$SLUICE_DIR/part2"; } > "$SLUICE_DIR/sums.txt"']}]}}
    inputs: [sum1, part2]
    outputs: [{path: sums.txt, commit: {rule: OnClose}}]
`

// A step that renames a symlink onto a permanent output's name never gets the link's
// target stored: the run fails saying the output is a symbolic link.
func TestSymlinkOutputNeverExportsItsTarget(t *testing.T) {
	tmp := t.TempDir()
	secret := filepath.Join(tmp, "secret")
	if err := os.WriteFile(secret, []byte("credentials"), 0o600); err != nil {
		t.Fatal(err)
	}
	wf, rules := load(t, "link.yaml", []byte(`apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: link}
spec:
  permanent: [out.txt]
  steps:
  - name: p
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'ln -s `+secret+` "$SLUICE_DIR/tmp" && mv "$SLUICE_DIR/tmp" "$SLUICE_DIR/out.txt"']}]}}
    outputs: [{path: out.txt, commit: {rule: OnClose}}]
`))
	out := filepath.Join(tmp, "out")
	_, err := Run(context.Background(), wf, rules, Options{WorkDir: filepath.Join(tmp, "work"), OutDir: out})
	if err == nil || !strings.Contains(err.Error(), "out.txt is a symbolic link") {
		t.Errorf("run: %v, want it to fail saying out.txt is a symbolic link", err)
	}
	if b, err := os.ReadFile(filepath.Join(out, "out.txt")); err == nil {
		t.Errorf("the symlink's target was stored as the output: %q", b)
	}
}

// seenWaits is a Progress that records the waits the snapshots name, and releases the
// producer (by creating release) once it has seen one.
type seenWaits struct {
	release string
	seen    []string
}

func (p *seenWaits) Update(s Snapshot) {
	for _, st := range s.Steps {
		if st.Waiting != "" {
			p.seen = append(p.seen, st.Waiting)
			_ = os.WriteFile(p.release, nil, 0o644)
		}
	}
}
func (p *seenWaits) Done(Snapshot) {}

// The progress view names what a waiting step waits for: the instance, the request, the
// file and its rule.
func TestProgressNamesWhatAStepWaitsFor(t *testing.T) {
	tmp := t.TempDir()
	release := filepath.Join(tmp, "release")
	wf, rules := load(t, "late.yaml", []byte(`apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: late}
spec:
  steps:
  - name: p
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'while [ ! -e `+release+` ]; do sleep 0.05; done; echo x > "$SLUICE_DIR/late.txt"']}]}}
    outputs: [{path: late.txt, commit: {rule: OnClose}}]
  - name: c
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'cat "$SLUICE_DIR/late.txt"']}]}}
    inputs: [late.txt]
`))
	p := &seenWaits{release: release}
	if _, err := Run(context.Background(), wf, rules, Options{WorkDir: filepath.Join(tmp, "work"), OutDir: filepath.Join(tmp, "out"), Progress: p, Timeout: 2 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	if len(p.seen) == 0 || !strings.HasPrefix(p.seen[0], `c[0]: lookup of "late.txt" (OnClose:1, Update)`) {
		t.Errorf("progress named the waits %q, want c[0]'s lookup of late.txt with its rule", p.seen)
	}
}

// Symlinks and hard links a step creates in a declared output (as tar -x and cp -a do) are
// outputs: they commit, consumers on the producer's node and on another node list and read
// them, and they travel between nodes as links (never followed by a server; a hard link
// names the same bytes there too, not a copy).
func TestSymlinksInOutputsReachConsumers(t *testing.T) {
	wf, rules := load(t, "links.yaml", []byte(`apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: links}
spec:
  permanent: ["seen-*.txt"]
  steps:
  - name: p
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'mkdir "$SLUICE_DIR/d" && echo data > "$SLUICE_DIR/d/a" && ln -s a "$SLUICE_DIR/d/link" && ln -s /nonexistent/abs "$SLUICE_DIR/d/out" && ln "$SLUICE_DIR/d/a" "$SLUICE_DIR/d/hard"']}]}}
    outputs:
    - {path: d, type: Directory, commit: {rule: OnNFiles, count: 4}}
    - {path: "d/*", commit: {rule: OnClose}}
  - name: c
    replicas: 2
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'cd "$SLUICE_DIR/d" && { ls; readlink link out; cat link hard; stat -c %h hard; } > "$SLUICE_DIR/seen-$SLUICE_INSTANCE.txt"']}]}}
    inputs: [d]
    outputs: [{path: "seen-*.txt"}]
`))
	tmp := t.TempDir()
	out := filepath.Join(tmp, "out")
	// Two nodes, instances round-robin: p on node-0, c[0] on node-1, c[1] on node-0.
	if _, err := Run(context.Background(), wf, rules, Options{WorkDir: filepath.Join(tmp, "work"), OutDir: out, Nodes: 2}); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		b, err := os.ReadFile(filepath.Join(out, fmt.Sprintf("seen-%d.txt", i)))
		if want := "a\nhard\nlink\nout\na\n/nonexistent/abs\ndata\ndata\n2\n"; err != nil || string(b) != want {
			t.Errorf("c[%d] saw %q (%v), want %q", i, b, err, want)
		}
	}
}

// A failed attempt's outputs are withdrawn and its retry (backoffLimit) writes them anew:
// what the failed attempt committed is no longer stored as a permanent output, the retry
// may write the name again (no EPERM), an instance still running that had opened one of
// them fails and is retried in turn (c reading the stream, r having read the committed
// result), and readers after the withdrawal see only the retry's bytes.
func TestFailedAttemptIsWithdrawnAndRetried(t *testing.T) {
	tmp := t.TempDir()
	tr := filepath.Join(tmp, "trace") // outside the volume: which attempt is which
	if err := os.Mkdir(tr, 0o755); err != nil {
		t.Fatal(err)
	}
	wf, rules := load(t, "retry.yaml", []byte(`apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: retry}
spec:
  permanent: [result.txt, "only*.txt", copy.bin, seen.txt, seen-by-r.txt]
  steps:
  - name: p
    backoffLimit: 1
    template:
      spec:
        containers:
        - name: c
          image: x
          command:
          - sh
          - -c
          - |
            set -e; T=`+tr+`; cd "$SLUICE_DIR"
            if [ -e $T/p-tried ]; then printf good > result.txt; printf retry-stream > stream.bin; exit 0; fi
            touch $T/p-tried
            printf bad > result.txt; printf first > only1.txt
            exec 4> stream.bin; printf part1 >&4
            while [ ! -e $T/ack ] || [ ! -e $T/r-read ]; do sleep 0.05; done
            exit 3
    outputs:
    - {path: result.txt, commit: {rule: OnClose}}
    - {path: "only*.txt", commit: {rule: OnClose}} # a glob: the retry need not make it
    - {path: stream.bin, commit: {rule: OnTermination}, fire: NoUpdate}
  - name: c
    backoffLimit: 1
    template:
      spec:
        containers:
        - name: c
          image: x
          command:
          - sh
          - -c
          - |
            set -e; T=`+tr+`; cd "$SLUICE_DIR"
            if [ -e $T/c-tried ]; then cat stream.bin > copy.bin; cat result.txt > seen.txt; exit 0; fi
            touch $T/c-tried
            exec 3< stream.bin; head -c 5 <&3 > $T/got; touch $T/ack
            cat <&3 > /dev/null
    inputs: [stream.bin, result.txt]
    outputs: [{path: copy.bin, commit: {rule: OnClose}}, {path: seen.txt, commit: {rule: OnClose}}]
  - name: r
    backoffLimit: 1
    template:
      spec:
        containers:
        - name: c
          image: x
          command:
          - sh
          - -c
          - |
            set -e; T=`+tr+`; cd "$SLUICE_DIR"
            if [ -e $T/r-tried ]; then cat result.txt > seen-by-r.txt; exit 0; fi
            touch $T/r-tried
            cat result.txt > $T/r-first; touch $T/r-read
            # Still running when the producer fails; it would exit 0 after 30 s.
            i=0; while [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done
    inputs: [result.txt]
    outputs: [{path: seen-by-r.txt, commit: {rule: OnClose}}]
`))
	out := filepath.Join(tmp, "out")
	rep, err := Run(context.Background(), wf, rules, Options{WorkDir: filepath.Join(tmp, "work"), OutDir: out})
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	for file, want := range map[string]string{"result.txt": "good", "copy.bin": "retry-stream", "seen.txt": "good", "seen-by-r.txt": "good"} {
		if b, err := os.ReadFile(filepath.Join(out, file)); err != nil || string(b) != want {
			t.Errorf("stored %s = %q (%v), want the retry's %q", file, b, err, want)
		}
	}
	if _, err := os.Stat(filepath.Join(out, "only1.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("only1.txt, written only by the failed attempt, is still stored (%v)", err)
	}
	if b, _ := os.ReadFile(filepath.Join(tr, "got")); string(b) != "part1" {
		t.Errorf("the first reader read %q of the failed attempt's stream, want part1", b)
	}
	if b, _ := os.ReadFile(filepath.Join(tr, "r-first")); string(b) != "bad" {
		t.Errorf("r's first attempt read %q, want the failed attempt's committed result", b)
	}
	byName := map[string]InstanceReport{}
	for _, ir := range rep.Instances {
		byName[ir.Name()] = ir
	}
	if p := byName["p[0]"]; p.Attempts != 2 || p.ExitCode != 0 || strings.Join(p.Withdrawn, ",") != "only1.txt,result.txt,stream.bin" {
		t.Errorf("p[0]: %d attempts, exit %d, withdrew %q; want 2, 0 and its three files", p.Attempts, p.ExitCode, p.Withdrawn)
	}
	if c := byName["c[0]"]; c.Attempts != 2 || c.ExitCode != 0 || len(c.Withdrawn) != 0 {
		t.Errorf("c[0]: %d attempts, exit %d, withdrew %q; want 2, 0, nothing", c.Attempts, c.ExitCode, c.Withdrawn)
	}
	if r := byName["r[0]"]; r.Attempts != 2 || r.ExitCode != 0 {
		t.Errorf("r[0]: %d attempts, exit %d; want its first attempt stopped (it had read the withdrawn result) and a retry", r.Attempts, r.ExitCode)
	}
}

// diskTierYAML has a producer write 4 files of 4 MiB into chunks/ (spec.tiers.fs), 4x the
// memory tier's sizeLimit, and a consumer checksum them; the producer's own checksum
// stays in memory.
const diskTierYAML = `apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: tiers}
spec:
  volume: {sizeLimit: 4Mi%s}
  tiers: {fs: [chunks]}
  permanent: [produced.txt, consumed.txt]
  steps:
  - name: split
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'set -e; cd "$SLUICE_DIR"; mkdir -p chunks; for i in 0 1 2 3; do head -c 4194304 /dev/urandom > chunks/c$i; done; sha256sum chunks/c0 chunks/c1 chunks/c2 chunks/c3 > produced.txt']}]}}
    outputs: [{path: "chunks/*", commit: {rule: OnClose}}, {path: produced.txt, commit: {rule: OnClose}}]
  - name: merge
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'set -e; cd "$SLUICE_DIR"; sha256sum chunks/c0 chunks/c1 chunks/c2 chunks/c3 > consumed.txt']}]}}
    inputs: ["chunks/*"]
    outputs: [{path: consumed.txt, commit: {rule: OnClose}}]
`
