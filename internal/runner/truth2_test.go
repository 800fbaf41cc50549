package runner

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-logr/logr/funcr"

	"github.com/sluice-io/sluice/internal/validation"
)

// Cases of a run that told a newcomer nothing, or exit 0, for a wrong result (issue 40).

// A relative work directory is taken from the current directory: $SLUICE_DIR is absolute,
// so a step that writes $SLUICE_DIR/results/x while its working directory is its view
// writes the declared output, which is committed and stored.
func TestRelativeWorkDirGivesStepsAnAbsoluteVolume(t *testing.T) {
	tmp := t.TempDir()
	wf, rules := load(t, "rel.yaml", []byte(`apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: rel}
spec:
  permanent: ["results/*"]
  steps:
  - name: p
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'mkdir -p "$SLUICE_DIR/results"; echo hi > "$SLUICE_DIR/results/x"']}]}}
    outputs:
    - {path: "results/*", commit: {rule: OnClose}}
`))
	t.Chdir(tmp)
	rep, err := Run(context.Background(), wf, rules, Options{WorkDir: "work", OutDir: filepath.Join(tmp, "out")})
	if err != nil {
		t.Fatalf("run with --work work: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(tmp, "out", "results", "x")); err != nil || string(b) != "hi\n" {
		t.Fatalf("stored results/x = %q, %v; want \"hi\\n\" (outputs %+v)", b, err, rep.Outputs)
	}
	if rep.Committed != 1 {
		t.Errorf("%d files committed, want 1", rep.Committed)
	}
}

// A step that reads inputs in a plain directory and writes its own outputs beside them (an
// index beside its data, as tabix and samtools index do) waits for the directory that its
// inputs come in, instead of getting ENOENT because it also makes files there.
func TestIndexBesideItsDataWaitsForTheDirectory(t *testing.T) {
	tmp := t.TempDir()
	wf, rules := load(t, "index.yaml", []byte(`apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: index}
spec:
  permanent: [vcf]
  steps:
  - name: make
    inputs: [go]
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'cat "$SLUICE_DIR/go"; mkdir "$SLUICE_DIR/vcf"; for i in 1 2 3; do echo data$i > "$SLUICE_DIR/vcf/s$i.vcf.gz"; done']}]}}
    outputs:
    - {path: "vcf/*.vcf.gz", commit: {rule: OnClose}}
  - name: index
    inputs: ["vcf/*.vcf.gz"]
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'echo > "$SLUICE_DIR/go"; cd "$SLUICE_DIR"; for f in vcf/*.vcf.gz; do [ -e "$f" ] || exit 9; wc -c < "$f" > "$f.tbi"; done']}]}}
    outputs:
    - {path: go, commit: {rule: OnClose}}
    - {path: "vcf/*.tbi", commit: {rule: OnClose}}
`))
	// index starts listing vcf before make has made it: make waits for go, which index
	// writes first.
	rep, err := Run(context.Background(), wf, rules, Options{WorkDir: filepath.Join(tmp, "work"), OutDir: filepath.Join(tmp, "out")})
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	for i := 1; i <= 3; i++ {
		f := filepath.Join(tmp, "out", "vcf", "s"+string(rune('0'+i))+".vcf.gz.tbi")
		if b, err := os.ReadFile(f); err != nil || strings.TrimSpace(string(b)) != "6" {
			t.Errorf("%s = %q, %v; want the size of its data, 6 (outputs %+v)", f, b, err, rep.Outputs)
		}
	}
}

// A permanent entry that no output declares can never be stored: the workflow is refused
// at validation, naming the field and what to declare.
func TestUndeclaredPermanentIsRefused(t *testing.T) {
	_, err := validation.Load(context.Background(), "perm.yaml", []byte(`apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: perm}
spec:
  permanent: [results, "logs/*.txt"]
  steps:
  - name: p
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'mkdir -p "$SLUICE_DIR/results"; echo hi > "$SLUICE_DIR/results/x"']}]}}
    outputs:
    - {path: "logs/*", commit: {rule: OnClose}}
`))
	if err == nil {
		t.Fatal("a workflow whose permanent results no output declares was accepted")
	}
	msg := err.Error()
	if !strings.Contains(msg, `spec.permanent[0]: Invalid value: "results": no step's outputs declare "results"`) || !strings.Contains(msg, `{path: "results/*"}`) {
		t.Errorf("error %q does not name spec.permanent[0] and what to declare", msg)
	}
	if strings.Contains(msg, "spec.permanent[1]") {
		t.Errorf("error %q refuses logs/*.txt, which the output logs/* declares", msg)
	}
}

// A background writer that the main process leaves holding a declared output open is
// killed with it (as in a container), so the output lacks what it would have written:
// the instance fails naming the process and the file, and its consumer's result is not
// stored.
func TestBackgroundWriterKilledAtExitFailsTheInstance(t *testing.T) {
	tmp := t.TempDir()
	wf, rules := load(t, "bg.yaml", []byte(`apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: bg}
spec:
  permanent: [out.txt]
  steps:
  - name: p
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'cd "$SLUICE_DIR"; echo early >> log.txt; m=$(mktemp -u); (touch $m; sleep 60; echo late) >> log.txt & while [ ! -e $m ]; do sleep 0.01; done; rm $m; exit 0']}]}}
    outputs:
    - {path: log.txt, commit: {rule: OnTermination}}
  - name: c
    inputs: [log.txt]
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'cd "$SLUICE_DIR"; cat log.txt > out.txt']}]}}
    outputs:
    - {path: out.txt, commit: {rule: OnClose}}
`))
	rep, err := Run(context.Background(), wf, rules, Options{WorkDir: filepath.Join(tmp, "work"), OutDir: filepath.Join(tmp, "out")})
	var fe *FailedError
	if !errors.As(err, &fe) {
		t.Fatalf("run whose producer's background writer was killed: err = %v, want a FailedError", err)
	}
	if !strings.Contains(err.Error(), `had "log.txt" open for writing`) || !strings.Contains(err.Error(), "p[0]") {
		t.Errorf("error %q does not name p[0] and log.txt", err)
	}
	if _, err := os.Stat(filepath.Join(tmp, "out", "out.txt")); !os.IsNotExist(err) {
		t.Errorf("out.txt, made from the cut log, is in --out (%v; outputs %+v)", err, rep.Outputs)
	}
}

// A failed run removes from --out what rests on what failed: a consumer's fallback result
// written because its input was never produced (its producer failed), and a file one of
// its two writing steps failed to finish. What rests on nothing that failed stays. The
// report lists what was removed and why.
func TestFailedRunRemovesResultsDerivedFromFailures(t *testing.T) {
	tmp := t.TempDir()
	wf, rules := load(t, "derived.yaml", []byte(`apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: derived}
spec:
  permanent: [result.txt, both.txt, fine.txt]
  steps:
  - name: p
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'exit 3']}]}}
    outputs:
    - {path: in.txt, commit: {rule: OnClose}}
  - name: c
    inputs: [in.txt]
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'cd "$SLUICE_DIR"; if cat in.txt >/dev/null 2>&1; then cp in.txt result.txt; else echo default > result.txt; fi']}]}}
    outputs:
    - {path: result.txt, commit: {rule: OnClose}}
  - name: a
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'echo from-a > "$SLUICE_DIR/both.txt"']}]}}
    outputs:
    - {path: both.txt, commit: {rule: OnClose, count: 2}}
  - name: b
    inputs: [fine.txt]
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'cat "$SLUICE_DIR/fine.txt" >/dev/null; echo from-b > "$SLUICE_DIR/both.txt"; exit 2']}]}}
    outputs:
    - {path: both.txt, commit: {rule: OnClose, count: 2}}
  - name: f
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'echo fine > "$SLUICE_DIR/fine.txt"']}]}}
    outputs:
    - {path: fine.txt, commit: {rule: OnClose}}
`))
	rep, err := Run(context.Background(), wf, rules, Options{WorkDir: filepath.Join(tmp, "work"), OutDir: filepath.Join(tmp, "out")})
	if err == nil {
		t.Fatal("run with failed steps p and b succeeded")
	}
	if _, err := os.Stat(filepath.Join(tmp, "out", "result.txt")); !os.IsNotExist(err) {
		t.Errorf("result.txt, c's fallback for the input p never made, is in --out: %v", err)
	}
	if _, err := os.Stat(filepath.Join(tmp, "out", "both.txt")); !os.IsNotExist(err) {
		t.Errorf("both.txt, half of which b wrote before it failed, is in --out: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(tmp, "out", "fine.txt")); err != nil || string(b) != "fine\n" {
		t.Errorf("fine.txt, made by a step that read nothing failed, = %q, %v; want it kept", b, err)
	}
	removed := map[string]string{}
	for _, o := range rep.Removed {
		removed[o.Path] = o.Reason
	}
	if why := removed["result.txt"]; !strings.Contains(why, "step c reads what step p makes") || !strings.Contains(why, "p[0] failed (exit code 3)") {
		t.Errorf("report's removed result.txt: %q, want the lineage c <- p and p's failure (removed %+v)", why, rep.Removed)
	}
	if !strings.Contains(err.Error(), "removed from the stored outputs") || !strings.Contains(err.Error(), "result.txt (made by step c") {
		t.Errorf("error %q does not list what was removed", err)
	}
	for _, o := range rep.Outputs {
		if o.Path == "result.txt" || o.Path == "both.txt" {
			t.Errorf("report still lists %s as stored", o.Path)
		}
	}
}

// An OnClose file of count 2 that a step of one instance writes is that instance's alone:
// its failed attempt's file is withdrawn (not kept as "written by several instances"),
// and the retry writes it whole.
func TestCountedOnCloseOfOneInstanceIsWithdrawn(t *testing.T) {
	tmp := t.TempDir()
	wf, rules := load(t, "two.yaml", []byte(`apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: two}
spec:
  permanent: [two.txt]
  steps:
  - name: p
    backoffLimit: 1
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'cd "$SLUICE_DIR"; m=../../tried; if [ -e $m ]; then echo a > two.txt; echo b >> two.txt; exit 0; fi; touch $m; echo half > two.txt; exit 4']}]}}
    outputs:
    - {path: two.txt, commit: {rule: OnClose, count: 2}}
`))
	var log lines
	logger := funcr.New(log.add, funcr.Options{})
	rep, err := Run(context.Background(), wf, rules, Options{WorkDir: filepath.Join(tmp, "work"), OutDir: filepath.Join(tmp, "out"), Log: logger})
	if err != nil {
		t.Fatalf("run whose retry wrote two.txt whole: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(tmp, "out", "two.txt")); err != nil || string(b) != "a\nb\n" {
		t.Errorf("two.txt = %q, %v; want the retry's a, b alone", b, err)
	}
	if len(rep.Instances) != 1 || rep.Instances[0].Attempts != 2 || len(rep.Instances[0].Withdrawn) != 1 {
		t.Errorf("instances %+v: want p[0], 2 attempts, two.txt withdrawn once", rep.Instances)
	}
	if l := log.find("several instances"); l != "" {
		t.Errorf("log says several instances write two.txt: %s", l)
	}
}

// Pod template keys match as the API server matches them, case-sensitively: `workingdir`
// and `Command` are refused at their full path with the spelling meant, not applied.
func TestTemplateKeysAreCaseSensitive(t *testing.T) {
	_, err := validation.Load(context.Background(), "case.yaml", []byte(`apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: keys}
spec:
  steps:
  - name: p
    template: {spec: {containers: [{name: c, image: x, workingdir: /tmp, Command: [pwd]}]}}
`))
	if err == nil {
		t.Fatal("a template with workingdir and Command was accepted")
	}
	for _, want := range []string{
		`spec.steps[0].template.spec.containers[0].workingdir: Invalid value: unknown field (field names are case-sensitive: did you mean "workingDir"?)`,
		`spec.steps[0].template.spec.containers[0].Command: Invalid value: unknown field (field names are case-sensitive: did you mean "command"?)`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

// An output withdrawn with a failed attempt and not written again by the attempt that
// succeeded is reported as such, not as "never created"; the report of a retried
// instance whose failed attempt wrote nothing names no empty list.
func TestWithdrawnOutputIsNotReportedAsNeverCreated(t *testing.T) {
	tmp := t.TempDir()
	wf, rules := load(t, "once.yaml", []byte(`apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: once}
spec:
  steps:
  - name: p
    backoffLimit: 1
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'm="$SLUICE_DIR/../../tried"; if [ -e "$m" ]; then exit 0; fi; touch "$m"; echo x > "$SLUICE_DIR/r.txt"; exit 1']}]}}
    outputs:
    - {path: r.txt, commit: {rule: OnClose}}
  - name: q
    backoffLimit: 1
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'm="$SLUICE_DIR/../../tried-q"; if [ -e "$m" ]; then echo y > "$SLUICE_DIR/s.txt"; exit 0; fi; touch "$m"; exit 1']}]}}
    outputs:
    - {path: s.txt, commit: {rule: OnClose}}
`))
	rep, err := Run(context.Background(), wf, rules, Options{WorkDir: filepath.Join(tmp, "work"), OutDir: filepath.Join(tmp, "out")})
	if err == nil {
		t.Fatal("run whose r.txt was withdrawn and never written again succeeded")
	}
	if len(rep.Unmet) != 1 || rep.Unmet[0].Path != "r.txt" || !strings.Contains(rep.Unmet[0].Reason, "withdrawn") {
		t.Errorf("unmet %+v, want r.txt withdrawn with the failed attempt", rep.Unmet)
	}
	var table strings.Builder
	rep.WriteTable(&table)
	if strings.Contains(table.String(), "withdrawn: \n") {
		t.Errorf("the table prints an empty list of withdrawn files:\n%s", table.String())
	}
	if !strings.Contains(table.String(), "q[0] ran 2 times; its failed attempts wrote no declared output to withdraw") {
		t.Errorf("the table does not say q's failed attempt wrote nothing:\n%s", table.String())
	}
}

// A permanent output in --out keeps its file's permission bits.
func TestStoredOutputKeepsItsMode(t *testing.T) {
	tmp := t.TempDir()
	wf, rules := load(t, "mode.yaml", []byte(`apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: mode}
spec:
  permanent: [r.txt, x.sh]
  steps:
  - name: p
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'cd "$SLUICE_DIR"; umask 022; echo x > r.txt; printf "#!/bin/sh\n" > x.sh; chmod 755 x.sh']}]}}
    outputs:
    - {path: r.txt, commit: {rule: OnClose}}
    - {path: x.sh, commit: {rule: OnTermination}}
`))
	if _, err := Run(context.Background(), wf, rules, Options{WorkDir: filepath.Join(tmp, "work"), OutDir: filepath.Join(tmp, "out")}); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]os.FileMode{"r.txt": 0o644, "x.sh": 0o755} {
		st, err := os.Stat(filepath.Join(tmp, "out", name))
		if err != nil || st.Mode().Perm() != want {
			t.Errorf("stored %s: %v, %v; want mode %v", name, st.Mode(), err, want)
		}
	}
}

// A governed directory's link count, seen by a consumer once it is committed, counts its
// subdirectories as on tmpfs (2 + one per subdirectory).
func TestCommittedDirectoryCountsItsSubdirectories(t *testing.T) {
	tmp := t.TempDir()
	wf, rules := load(t, "nlink.yaml", []byte(`apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: nlink}
spec:
  steps:
  - name: p
    inputs: [go]
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'cd "$SLUICE_DIR"; mkdir out; cat go; mkdir out/a out/b; echo x > out/a/f']}]}}
    outputs:
    - {path: out, type: Directory, commit: {rule: OnTermination}}
  - name: c
    inputs: [out]
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'cd "$SLUICE_DIR"; stat -c %h out >/dev/null; echo > go; ls out >/dev/null; stat -c %h out > "$SLUICE_DIR/../../nlink"']}]}}
    outputs:
    - {path: go, commit: {rule: OnClose}}
`))
	if _, err := Run(context.Background(), wf, rules, Options{WorkDir: filepath.Join(tmp, "work"), OutDir: filepath.Join(tmp, "out")}); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(tmp, "work", "nlink")); err != nil || strings.TrimSpace(string(b)) != "4" {
		t.Errorf("the consumer's stat of out after listing it: link count %q, %v; want 4 (2 + subdirectories a and b)", b, err)
	}
}

// A write refused by the rules fails the program with a bare errno; the run's error says
// which change was refused and what to do (an OnClose file written with two
// redirections).
func TestRefusedWriteIsExplainedInTheRunsError(t *testing.T) {
	tmp := t.TempDir()
	wf, rules := load(t, "twice.yaml", []byte(`apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: twice}
spec:
  steps:
  - name: p
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'cd "$SLUICE_DIR"; echo a > f; echo b >> f']}]}}
    outputs:
    - {path: f, commit: {rule: OnClose}}
`))
	_, err := Run(context.Background(), wf, rules, Options{WorkDir: filepath.Join(tmp, "work"), OutDir: filepath.Join(tmp, "out")})
	if err == nil {
		t.Fatal("the second redirection into a committed OnClose file succeeded")
	}
	for _, want := range []string{`the view refused a change of committed "f" (OnClose:1, Update)`, "commits at its first close", "{ echo a; echo b; } > f"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

// sluice run warns, before it runs, about what it does differently from a cluster: a
// command naming the volume's mountPath (not mounted there under sluice run), an env
// variable with valueFrom (left unset).
func TestWarningsNameMountPathAndValueFrom(t *testing.T) {
	res, err := validation.Load(context.Background(), "warn.yaml", []byte(`apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: warn}
spec:
  volume: {mountPath: /work}
  steps:
  - name: p
    template:
      spec:
        containers:
        - name: c
          image: x
          command: [sh, -c, 'echo x > /work/out.txt; echo /workspace > "$SLUICE_DIR/ok"']
          env:
          - name: POD
            valueFrom: {fieldRef: {fieldPath: metadata.name}}
  - name: q
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'ls /workspace /work-x']}]}}
`))
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(Warnings(res.Workflow), "\n")
	if !strings.Contains(got, "spec.steps[0].template.spec.containers[0]: container c of step p names the volume's mountPath /work: sluice run mounts each instance's view at $SLUICE_DIR") {
		t.Errorf("warnings %q do not name p's use of /work", got)
	}
	if !strings.Contains(got, "spec.steps[0].template.spec.containers[0].env[0]: env POD of container c of step p has valueFrom") {
		t.Errorf("warnings %q do not name the valueFrom", got)
	}
	if strings.Contains(got, "step q") {
		t.Errorf("warnings %q name q, whose /workspace and /work-x are not the mountPath", got)
	}
}

// Each node store's memory tier is a tmpfs of the run's own, whatever file system the
// work directory is on (as a cluster node's is), and it goes with the run.
func TestNodeStoreIsATmpfsOfTheRunsOwn(t *testing.T) {
	tmp := t.TempDir()
	work := filepath.Join(tmp, "work")
	wf, rules := load(t, "tier.yaml", []byte(`apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: tier}
spec:
  volume: {sizeLimit: 64Mi}
  steps:
  - name: p
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'grep " $(dirname $(dirname $SLUICE_DIR))/store " /proc/self/mountinfo > "$SLUICE_DIR/../../mounted"']}]}}
`))
	if _, err := Run(context.Background(), wf, rules, Options{WorkDir: work, OutDir: filepath.Join(tmp, "out"), Keep: true}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(work, "mounted"))
	if err != nil || !strings.Contains(string(b), " - tmpfs sluice-store ") || !strings.Contains(string(b), "size=") {
		t.Errorf("the store's mount as the step saw it: %q, %v; want a tmpfs sluice-store with a size", b, err)
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mounts), filepath.Join(work, "store")) {
		t.Errorf("the store's tmpfs is still mounted after the run")
	}
}
