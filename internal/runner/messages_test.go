package runner

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Counts of one are singular in the progress view and the report: "1 file committed",
// "1/1 instance", never "1 files" or "done 1/1 done".
func TestPluralsInProgressAndReport(t *testing.T) {
	var b bytes.Buffer
	p := NewProgress(&b, false, 0)
	p.Done(Snapshot{Workflow: "w", Committed: 1, Steps: []StepSnapshot{{Name: "p", Replicas: 1, Done: 1}}})
	NewProgress(&b, true, 0).Done(Snapshot{Workflow: "w", Committed: 3, Steps: []StepSnapshot{{Name: "p", Replicas: 1, Done: 1}, {Name: "q", Replicas: 2, Done: 2}}})
	(&Report{Committed: 1, Released: 1, PeakDiskBytes: 1, SpilledFiles: 1}).WriteTable(&b)
	out := b.String()
	for _, want := range []string{"1 file committed", "3 files committed", "done      1/1 instance ", "done      2/2 instances", "1 consumed file released", "1 file (0 B) spilled"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	for _, bad := range []string{"1 files", "done 1/1 done", "1 consumed files"} {
		if strings.Contains(out, bad) {
			t.Errorf("output says %q:\n%s", bad, out)
		}
	}
}

// noTempLeft points the temporary directory at an empty one of the test's own and returns
// a check that the run left nothing in it.
func noTempLeft(t *testing.T) func() {
	t.Helper()
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	return func() {
		t.Helper()
		if left, _ := os.ReadDir(tmp); len(left) > 0 {
			t.Errorf("the failed run left %s behind in %s", left[0].Name(), tmp)
		}
	}
}

// A container without a command is refused before anything is created, naming the field:
// sluice run cannot use the image's entrypoint. (Before, it failed at run time with an
// empty log and left its work directory.)
func TestContainerWithoutCommandIsRefusedBeforeStarting(t *testing.T) {
	wf, rules := load(t, "nocmd.yaml", []byte(`apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: nocmd}
spec:
  steps:
  - name: p
    template: {spec: {containers: [{name: c, image: busybox}]}}
  - name: q
`))
	check := noTempLeft(t)
	rep, err := Run(context.Background(), wf, rules, Options{OutDir: filepath.Join(t.TempDir(), "out")})
	if err == nil || rep != nil {
		t.Fatalf("Run = %v, %v; want a refusal", rep, err)
	}
	for _, want := range []string{
		"spec.steps[0].template.spec.containers[0].command: Required value: container c of step p has no command: sluice run runs it as a local process and cannot use the image's entrypoint",
		"spec.steps[1].template: Required value: step q has no pod template",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("err = %v\nwant it to contain %q", err, want)
		}
	}
	check()
}

// A run that fails before its steps start removes the temporary work directory it made.
func TestFailedStartRemovesItsWorkDirectory(t *testing.T) {
	wf, rules := load(t, "ok.yaml", []byte(`apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: ok}
spec:
  steps:
  - name: p
    template: {spec: {containers: [{name: c, image: busybox, command: ["true"]}]}}
`))
	notADir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notADir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	check := noTempLeft(t)
	if _, err := Run(context.Background(), wf, rules, Options{OutDir: filepath.Join(notADir, "out")}); err == nil {
		t.Fatal("Run succeeded with --out under a regular file")
	}
	check()
}

// A workingDir inside the volume that does not exist yet is created, as a container
// runtime does; a program that is not found is named with the step instance and the
// container (before: "<mount point>: 1: exec: produce-things: not found").
func TestWorkingDirIsCreatedAndAMissingProgramIsNamed(t *testing.T) {
	wf, rules := load(t, "wd.yaml", []byte(`apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: wd}
spec:
  steps:
  - name: p
    template: {spec: {containers: [{name: c, image: busybox, workingDir: /data/sub/deeper, command: [sh, -c, "echo here > out.txt"]}]}}
    outputs: [{path: sub/deeper/out.txt}]
  - name: q
    template: {spec: {containers: [{name: main, image: busybox, command: [produce-things, --fast]}]}}
  permanent: [sub/deeper/out.txt]
`))
	tmp := t.TempDir()
	rep, err := Run(context.Background(), wf, rules, Options{WorkDir: filepath.Join(tmp, "work"), OutDir: filepath.Join(tmp, "out"), Timeout: time.Minute})
	if rep == nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(tmp, "out", "sub", "deeper", "out.txt")); string(got) != "here\n" {
		t.Errorf("out.txt = %q, want the output written in the created workingDir", got)
	}
	for _, ir := range rep.Instances {
		if ir.Step == "p" && (ir.ExitCode != 0 || ir.Error != "") {
			t.Errorf("p[0] failed: exit %d %s", ir.ExitCode, ir.Error)
		}
	}
	want := "sluice run: step q instance 0 container main: produce-things: command not found (PATH="
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("err = %v\nwant it to contain %q", err, want)
	}
}
