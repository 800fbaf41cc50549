package runner

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A step that succeeds without delivering what it declared fails the run, and the report
// names each missing output and why: a permanent file written under another name (a
// typo), and an OnClose:3 file closed twice.
func TestDeclaredOutputsNeverDeliveredFailTheRun(t *testing.T) {
	tmp := t.TempDir()
	wf, rules := load(t, "unmet.yaml", []byte(`apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: unmet}
spec:
  permanent: [result.txt]
  steps:
  - name: p
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'cd "$SLUICE_DIR"; echo 42 > result.tx; echo a >> log.txt; echo b >> log.txt; echo done > ok.txt']}]}}
    outputs:
    - {path: result.txt, commit: {rule: OnClose}}
    - {path: log.txt, commit: {rule: OnClose, count: 3}}
    - {path: ok.txt, commit: {rule: OnClose}}
`))
	rep, err := Run(context.Background(), wf, rules, Options{WorkDir: filepath.Join(tmp, "work"), OutDir: filepath.Join(tmp, "out")})
	var fe *FailedError
	if !errors.As(err, &fe) {
		t.Fatalf("run of a step that delivered neither result.txt nor log.txt: err = %v, want a FailedError", err)
	}
	if rep.Succeeded {
		t.Error("report says the run succeeded")
	}
	got := map[string]string{}
	for _, u := range rep.Unmet {
		got[u.Path] = u.Reason
	}
	if len(got) != 2 || got["result.txt"] != "never created" || !strings.Contains(got["log.txt"], "closed 2 of 3 times") {
		t.Errorf("unmet outputs = %+v, want result.txt never created and log.txt closed 2 of 3 times", rep.Unmet)
	}
	for _, want := range []string{"missing output result.txt", "missing output log.txt", "result.txt: declared output of p, which succeeded: never created"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

// A consumer that finished on a file its producer's failed attempt wrote has built its
// result from withdrawn bytes: its outputs are withdrawn too (the stored permanent copy
// is removed) and the run fails naming the consumer and the file, although every
// instance's last attempt exited 0.
func TestResultFromWithdrawnBytesFailsTheRun(t *testing.T) {
	tmp := t.TempDir()
	tr := filepath.Join(tmp, "trace")
	if err := os.Mkdir(tr, 0o755); err != nil {
		t.Fatal(err)
	}
	wf, rules := load(t, "tainted.yaml", []byte(`apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: tainted}
spec:
  permanent: [copy.txt]
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
            T=`+tr+`; cd "$SLUICE_DIR"
            if [ -e $T/p-tried ]; then printf second > v.txt; exit 0; fi
            touch $T/p-tried
            printf first > v.txt
            # copy.txt commits when c has exited 0 (OnTermination): then fail.
            cat copy.txt > /dev/null
            exit 3
    outputs: [{path: v.txt, commit: {rule: OnClose}}]
  - name: c
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'cd "$SLUICE_DIR"; cat v.txt > copy.txt']}]}}
    inputs: [v.txt]
    outputs: [{path: copy.txt, commit: {rule: OnTermination}}]
`))
	out := filepath.Join(tmp, "out")
	rep, err := Run(context.Background(), wf, rules, Options{WorkDir: filepath.Join(tmp, "work"), OutDir: out})
	var fe *FailedError
	if !errors.As(err, &fe) {
		t.Fatalf("run whose consumer finished on withdrawn bytes: err = %v, want a FailedError", err)
	}
	if len(rep.Tainted) != 1 || rep.Tainted[0].Instance != "c[0]" || rep.Tainted[0].Input != "v.txt" || strings.Join(rep.Tainted[0].Withdrawn, ",") != "copy.txt" {
		t.Errorf("tainted = %+v, want c[0] on v.txt, copy.txt withdrawn", rep.Tainted)
	}
	if !strings.Contains(err.Error(), "c[0] read withdrawn v.txt") {
		t.Errorf("error %q does not name the consumer and the withdrawn file", err)
	}
	if b, err := os.ReadFile(filepath.Join(out, "copy.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("copy.txt, built from the withdrawn %q, is stored: %q (%v)", "first", b, err)
	}
	for _, o := range rep.Outputs {
		if o.Path == "copy.txt" {
			t.Errorf("the report lists copy.txt as stored: %+v", o)
		}
	}
}

// Steps that wait on each other in a way validation cannot see (OnClose files each closes
// only after reading the other's) fail the run at once, naming what each instance waits
// for, instead of waiting out the wait timeout; a run's --timeout names the waits too.
func TestDeadlockIsDetectedAndNamed(t *testing.T) {
	tmp := t.TempDir()
	wf, rules := load(t, "deadlock.yaml", []byte(`apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: deadlock}
spec:
  steps:
  - name: a
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'cd "$SLUICE_DIR"; cat b.txt > a.txt']}]}}
    inputs: [b.txt]
    outputs: [{path: a.txt, commit: {rule: OnClose}}]
  - name: b
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'cd "$SLUICE_DIR"; cat a.txt > b.txt']}]}}
    inputs: [a.txt]
    outputs: [{path: b.txt, commit: {rule: OnClose}}]
  - name: idle
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'exit 0']}]}}
`))
	start := time.Now()
	_, err := Run(context.Background(), wf, rules, Options{WorkDir: filepath.Join(tmp, "work"), OutDir: filepath.Join(tmp, "out"), DeadlockGrace: 500 * time.Millisecond})
	var dl *DeadlockError
	if !errors.As(err, &dl) {
		t.Fatalf("run of two steps waiting on each other: err = %v, want a DeadlockError", err)
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("the deadlock took %s to end, want seconds", took)
	}
	msg := err.Error()
	for _, want := range []string{`a[0] waits for`, `"b.txt" (OnClose:1, Update), made by step b`, `b[0] waits for`, `"a.txt" (OnClose:1, Update), made by step a`} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not say %q", msg, want)
		}
	}
}

// A run stopped by its --timeout says what each instance was waiting for.
func TestTimeoutNamesTheWaits(t *testing.T) {
	tmp := t.TempDir()
	wf, rules := load(t, "slow.yaml", []byte(`apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: slow}
spec:
  steps:
  - name: p
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'sleep 60; echo > "$SLUICE_DIR/late.txt"']}]}}
    outputs: [{path: late.txt, commit: {rule: OnClose}}]
  - name: c
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'cat "$SLUICE_DIR/late.txt"']}]}}
    inputs: [late.txt]
`))
	// The timeout must come after c[0] has begun to wait: on a loaded machine its cat may
	// not have looked late.txt up within the first timeout, and the run then names no
	// wait at all; the next run gets twice as long (p sleeps 60 s: it never ends first).
	for timeout := 2 * time.Second; ; timeout *= 2 {
		work := filepath.Join(tmp, "work-"+timeout.String())
		_, err := Run(context.Background(), wf, rules, Options{WorkDir: work, OutDir: filepath.Join(tmp, "out"), Timeout: timeout, StopGrace: 100 * time.Millisecond})
		if err != nil && !strings.Contains(err.Error(), "waiting then:") && timeout < 16*time.Second {
			continue
		}
		if err == nil || !strings.Contains(err.Error(), "timed out after "+timeout.String()) || !strings.Contains(err.Error(), `c[0] waits for lookup of "late.txt" (OnClose:1, Update), made by step p`) {
			t.Errorf("run timed out after %s: err = %v, want it to name c[0]'s wait for late.txt", timeout, err)
		}
		return
	}
}

// A shell glob over a plain directory sees every declared input: three replicas write
// counts/part-$i after a pause of their own, and the reducer's `cat counts/*` (and ls and
// find) list counts/ at once. The listing ends only once the producers of counts/* have
// exited, on one node and across two.
func TestGlobOverAPlainDirectorySeesEveryInput(t *testing.T) {
	for _, nodes := range []int{1, 2} {
		t.Run(fmt.Sprintf("nodes=%d", nodes), func(t *testing.T) {
			tmp := t.TempDir()
			wf, rules := load(t, "glob.yaml", []byte(`apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: glob}
spec:
  permanent: [total.txt, listed.txt]
  steps:
  - name: count
    replicas: 3
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'sleep 0.$((SLUICE_INSTANCE * 3)); mkdir -p "$SLUICE_DIR/counts"; echo $SLUICE_INSTANCE > "$SLUICE_DIR/counts/part-$SLUICE_INSTANCE"']}]}}
    outputs: [{path: "counts/*", commit: {rule: OnClose}}]
  - name: reduce
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'cd "$SLUICE_DIR"; cat counts/* > total.txt; { ls counts; find counts -type f | sort; } > listed.txt']}]}}
    inputs: ["counts/*"]
    outputs: [{path: total.txt, commit: {rule: OnClose}}, {path: listed.txt, commit: {rule: OnClose}}]
`))
			out := filepath.Join(tmp, "out")
			if _, err := Run(context.Background(), wf, rules, Options{WorkDir: filepath.Join(tmp, "work"), OutDir: out, Nodes: nodes}); err != nil {
				t.Fatalf("run: %v", err)
			}
			if b, err := os.ReadFile(filepath.Join(out, "total.txt")); err != nil || string(b) != "0\n1\n2\n" {
				t.Errorf("cat counts/* = %q (%v), want every part: 0 1 2", b, err)
			}
			want := "part-0\npart-1\npart-2\ncounts/part-0\ncounts/part-1\ncounts/part-2\n"
			if b, err := os.ReadFile(filepath.Join(out, "listed.txt")); err != nil || string(b) != want {
				t.Errorf("ls and find of counts = %q (%v), want every part", b, err)
			}
		})
	}
}

// "Steps one after another would take" counts work, not waiting: a consumer that waits a
// second for its input would not wait at all in a serial run, so its wait is left out.
func TestSerialTimeLeavesOutWaiting(t *testing.T) {
	tmp := t.TempDir()
	wf, rules := load(t, "serial.yaml", []byte(`apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: serial}
spec:
  steps:
  - name: p
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'sleep 1; echo x > "$SLUICE_DIR/f"']}]}}
    outputs: [{path: f, commit: {rule: OnClose}}]
  - name: c
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'cat "$SLUICE_DIR/f"']}]}}
    inputs: [f]
`))
	rep, err := Run(context.Background(), wf, rules, Options{WorkDir: filepath.Join(tmp, "work"), OutDir: filepath.Join(tmp, "out")})
	if err != nil {
		t.Fatal(err)
	}
	var spans time.Duration
	for _, ir := range rep.Instances {
		spans += ir.End.Sub(ir.Start)
	}
	// c waited about a second for f: at least half of it must be left out.
	if got := rep.SerialTime.Duration(); got > spans-500*time.Millisecond {
		t.Errorf("serial time %s, spans summed %s: the consumer's wait for its input was counted as work", got, spans)
	}
}
