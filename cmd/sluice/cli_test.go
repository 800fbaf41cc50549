package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-io/sluice/internal/exitcode"
)

// run executes the sluice command line in-process and returns stdout, stderr and the exit
// code main would use.
func run(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := newRootCommand()
	var out, errb bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errb)
	cmd.SetArgs(args)
	if err := cmd.ExecuteContext(context.Background()); err != nil {
		errb.WriteString(err.Error())
		return out.String(), errb.String(), exitcode.Of(err)
	}
	return out.String(), errb.String(), 0
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestVersion(t *testing.T) {
	out, _, code := run(t, "version")
	if code != 0 || !strings.HasPrefix(out, "sluice ") {
		t.Errorf("version: %q, code %d", out, code)
	}
	flag, _, code := run(t, "--version")
	if code != 0 || flag != out {
		t.Errorf("sluice --version: %q, code %d; want what sluice version prints, %q", flag, code, out)
	}
}

func TestValidateReportsFileFieldAndReason(t *testing.T) {
	p := writeFile(t, "bad.yaml", `apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: bad}
spec:
  steps:
  - name: a
    outputs: [{path: x, commit: {rule: OnNFiles, count: 2}}]
`)
	out, errOut, code := run(t, "validate", p)
	if code == 0 {
		t.Fatalf("validate accepted a bad workflow: %s", out)
	}
	want := p + ": spec.steps[0].outputs[0].commit.rule: Invalid value: commit.rule OnNFiles applies only to type Directory"
	if !strings.Contains(errOut, want) {
		t.Errorf("stderr = %q\nwant it to contain %q", errOut, want)
	}
	if out != "" {
		t.Errorf("stdout = %q, want nothing on failure", out)
	}
}

// A --passthrough value other than auto, on or off is refused before anything runs, and the
// error names the flag and the value.
func TestRunRejectsUnknownPassthroughMode(t *testing.T) {
	_, errOut, code := run(t, "run", "--passthrough=yes", "/nonexistent/w.yaml")
	if code == 0 || !strings.Contains(errOut, "--passthrough") || !strings.Contains(errOut, `"yes"`) {
		t.Errorf("code %d stderr %q; want a failure naming --passthrough and \"yes\"", code, errOut)
	}
}

func TestValidateMissingFile(t *testing.T) {
	_, errOut, code := run(t, "validate", "/nonexistent/w.yaml")
	if code == 0 || !strings.Contains(errOut, "/nonexistent/w.yaml") {
		t.Errorf("code %d stderr %q", code, errOut)
	}
}

// The CAPIO paper's example imports into a Workflow that validate accepts, and exports
// back to CAPIO-CL that validate also accepts.
func TestPaperExampleImportValidateExport(t *testing.T) {
	yml, errOut, code := run(t, "capio", "import", "../../examples/capio-paper/capio-cl.json")
	if code != 0 {
		t.Fatalf("import failed: %s", errOut)
	}
	wfPath := writeFile(t, "paper.yaml", yml)
	out, errOut, code := run(t, "validate", wfPath)
	if code != 0 || !strings.Contains(out, `valid Workflow "paper-example": 3 steps`) {
		t.Fatalf("validate of the imported workflow: code %d\n%s%s", code, out, errOut)
	}
	for _, v := range []string{"1.0", "1.1"} {
		js, errOut, code := run(t, "capio", "export", "--version", v, wfPath)
		if code != 0 {
			t.Fatalf("export %s failed: %s", v, errOut)
		}
		if v == "1.0" && strings.Contains(js, `"version"`) {
			t.Errorf("a 1.0 export carries a version key:\n%s", js)
		}
		out, errOut, code := run(t, "validate", writeFile(t, "paper.json", js))
		if code != 0 || !strings.Contains(out, "valid CAPIO-CL") {
			t.Errorf("validate of the %s export: code %d\n%s%s\n%s", v, code, out, errOut, js)
		}
	}
}

func TestImportOfInvalidDocumentNamesThePath(t *testing.T) {
	p := writeFile(t, "x.json", `{"name": "x", "IO_Graph": [{"name": "s", "input_stream": "oops", "output_stream": []}]}`)
	_, errOut, code := run(t, "capio", "import", p)
	if code == 0 || !strings.Contains(errOut, p+": IO_Graph[0].input_stream: got string, want array") {
		t.Errorf("code %d stderr %q", code, errOut)
	}
}

func TestExportRejectsUnknownVersion(t *testing.T) {
	_, errOut, code := run(t, "capio", "export", "--version", "3", "../../examples/wordcount/workflow.yaml")
	if code == 0 || !strings.Contains(errOut, `unsupported CAPIO-CL version "3"`) {
		t.Errorf("code %d stderr %q", code, errOut)
	}
}

// Every usage error (a missing or extra argument, an unknown flag or command, a bad flag
// value) exits 2 and prints the command's usage line; cobra's own would exit 1 (or, for
// an unknown subcommand of a group, print the help and exit 0).
func TestUsageErrorsExit2WithTheUsageLine(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"validate"}, "sluice validate: accepts 1 arg(s), received 0\nusage: sluice validate FILE"},
		{[]string{"validate", "a.yaml", "b.yaml"}, "usage: sluice validate FILE"},
		{[]string{"validate", "--strict", "a.yaml"}, "sluice validate: unknown flag: --strict\nusage: sluice validate FILE"},
		{[]string{"run"}, "usage: sluice run WORKFLOW.yaml"},
		{[]string{"capio", "import"}, "usage: sluice capio import FILE.json"},
		{[]string{"capio", "imprt", "x.json"}, `sluice capio: unknown command "imprt" for "sluice capio" (did you mean "import"?)`},
		{[]string{"valdate", "x.yaml"}, `sluice: unknown command "valdate" for "sluice" (did you mean "validate"?)`},
		{[]string{"version", "extra"}, "usage: sluice version"},
		{[]string{"run", "--passthrough=yes", "x.yaml"}, "usage: sluice run WORKFLOW.yaml"},
		{[]string{"run", "--nodes", "0", "x.yaml"}, "sluice run: --nodes 0: the number of node stores must be at least 1\nusage: sluice run WORKFLOW.yaml"},
		{[]string{"run", "--nodes=-2", "x.yaml"}, "sluice run: --nodes -2: the number of node stores must be at least 1\nusage: sluice run WORKFLOW.yaml"},
		{[]string{"run", "--objstore", "/dir", "x.yaml"}, `sluice run: --objstore: object store URL "/dir": no scheme: write file:///dir for a local directory`},
	} {
		_, errOut, code := run(t, tc.args...)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("sluice %s: code %d, stderr %q; want 2 and %q", strings.Join(tc.args, " "), code, errOut, tc.want)
		}
	}
}

// validate counts in the singular where there is one; a container without a command is a
// warning for validate (a cluster runs the image's entrypoint) and an error for run, which
// refuses it before anything starts.
func TestValidateWarnsAndRunRefusesAContainerWithoutCommand(t *testing.T) {
	p := writeFile(t, "nocmd.yaml", `apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: nocmd}
spec:
  steps:
  - name: p
    template: {spec: {containers: [{name: c, image: busybox}]}}
    outputs: [{path: x}]
`)
	field := p + ": spec.steps[0].template.spec.containers[0].command: Required value: container c of step p has no command"
	out, errOut, code := run(t, "validate", p)
	if code != 0 || out != p+": valid Workflow \"nocmd\": 1 step, 1 rule\n" {
		t.Errorf("validate: code %d, stdout %q", code, out)
	}
	if !strings.Contains(errOut, "warning: "+field) || !strings.Contains(errOut, "on a cluster the image's entrypoint runs") {
		t.Errorf("validate: stderr %q, want a warning naming %q", errOut, field)
	}
	_, errOut, code = run(t, "run", "--out", t.TempDir(), p)
	if code != 1 || !strings.HasPrefix(errOut, field) {
		t.Errorf("run: code %d, stderr %q; want 1 and %q", code, errOut, field)
	}
}
