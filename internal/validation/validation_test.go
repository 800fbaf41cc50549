package validation

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/semantics"
)

const header = "apiVersion: sluice.io/v1alpha1\nkind: Workflow\nmetadata: {name: w}\n"

func TestBadWorkflows(t *testing.T) {
	for _, tc := range []struct {
		name string
		spec string
		want string
		// byCRD: the CRD schema or CEL rejects it; the Go semantic check must agree.
		byCRD bool
	}{
		{"OnNFiles on a file", `
spec:
  steps: [{name: a, outputs: [{path: x, commit: {rule: OnNFiles, count: 2}}]}]`,
			`spec.steps[0].outputs[0].commit.rule: Invalid value: commit.rule OnNFiles applies only to type Directory`, true},
		{"OnNFiles without count", `
spec:
  steps: [{name: a, outputs: [{path: x, type: Directory, commit: {rule: OnNFiles}}]}]`,
			`spec.steps[0].outputs[0].commit.count: Invalid value: commit.count is required with rule OnNFiles`, true},
		{"OnFile without files", `
spec:
  steps: [{name: a, outputs: [{path: x, commit: {rule: OnFile}}]}]`,
			`spec.steps[0].outputs[0].commit.files: Invalid value: commit.files must name at least one file with rule OnFile`, true},
		{"files without OnFile", `
spec:
  steps: [{name: a, outputs: [{path: x, commit: {rule: OnClose, files: [z]}}, {path: z}]}]`,
			`spec.steps[0].outputs[0].commit.files: Invalid value: commit.files is allowed only with rule OnFile`, true},
		{"count zero", `
spec:
  steps: [{name: a, outputs: [{path: x, commit: {rule: OnClose, count: 0}}]}]`,
			`spec.steps[0].outputs[0].commit.count: Invalid value: 0: spec.steps[0].outputs[0].commit.count in body should be greater than or equal to 1`, true},
		{"replicas zero", `
spec:
  steps: [{name: a, replicas: 0}]`,
			`spec.steps[0].replicas: Invalid value: 0: spec.steps[0].replicas in body should be greater than or equal to 1`, true},
		{"duplicate step names", `
spec:
  steps: [{name: a}, {name: a}]`,
			`spec.steps[1]: Duplicate value: {"name":"a"}`, true},
		{"no steps", `
spec:
  steps: []`,
			`spec.steps: Invalid value: 0: spec.steps in body should have at least 1 items`, true},
		{"bad firing rule", `
spec:
  steps: [{name: a, outputs: [{path: x, fire: Sometimes}]}]`,
			`spec.steps[0].outputs[0].fire: Unsupported value: "Sometimes": supported values: "Update", "NoUpdate"`, false},
		{"bad step name", `
spec:
  steps: [{name: "a b"}]`,
			`spec.steps[0].name: Invalid value: "a b": spec.steps[0].name in body should match`, false},
		{"Manual policy without pins", `
spec:
  steps: [{name: a}]
  homeNode: {policy: Manual}`,
			`spec.homeNode.manual: Invalid value: homeNode.manual must pin at least one group of files with policy Manual`, true},
		{"unknown field", `
spec:
  steps: [{name: a, outputs: [{path: x, comit: {rule: OnClose}}]}]`,
			`spec.steps[0].outputs[0].comit: Forbidden: unknown field`, false},
		{"misspelt template field", `
spec:
  steps: [{name: a, template: {spec: {contaners: []}}}]`,
			`spec.steps[0].template.spec.contaners: Invalid value: unknown field`, false},
		{"overlapping patterns (Go only)", `
spec:
  steps:
  - {name: a, outputs: [{path: "*.dat", commit: {rule: OnClose}}]}
  - {name: b, outputs: [{path: "file_*"}]}`,
			`spec.steps[1].outputs[0].path: Invalid value: "file_*": overlaps "*.dat" declared at spec.steps[0].outputs[0]`, false},
		{"Consumed directory", `
spec:
  steps:
  - {name: a, outputs: [{path: d, type: Directory, lifetime: Consumed}]}
  - {name: b, inputs: [d]}`,
			`spec.steps[0].outputs[0].lifetime: Invalid value: lifetime Consumed applies to files, not to type Directory`, true},
		{"Consumed that nobody reads (Go only)", `
spec:
  steps:
  - {name: a, outputs: [{path: tmp, lifetime: Consumed}]}`,
			`spec.steps[0].outputs[0].lifetime: Invalid value: "Consumed": no step declares "tmp" as an input`, false},
		{"relative mount path", `
spec:
  volume: {mountPath: data}
  steps: [{name: a}]`,
			`spec.volume.mountPath: Invalid value: "data": spec.volume.mountPath in body should match '^/'`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(context.Background(), "w.yaml", []byte(header+tc.spec))
			var ve *Error
			if !errors.As(err, &ve) {
				t.Fatalf("Load: err = %v, want a validation error containing %q", err, tc.want)
			}
			if !strings.Contains(err.Error(), "w.yaml: "+tc.want) {
				t.Errorf("error:\n%v\nwant it to contain:\n%s", err, tc.want)
			}
			if tc.byCRD {
				// The Go check used where there is no API server must agree with the CRD.
				var wf v1alpha1.Workflow
				if err := yaml.Unmarshal([]byte(header+tc.spec), &wf); err != nil {
					t.Fatal(err)
				}
				if _, errs, _ := semantics.Compile(context.Background(), &wf.Spec); len(errs) == 0 {
					t.Error("the CRD rejects it but semantics.Compile accepts it")
				}
			}
		})
	}
}

func TestDefaultsMatchTheCRD(t *testing.T) {
	res, err := Load(context.Background(), "w.yaml", []byte(header+`
spec:
  steps: [{name: a, outputs: [{path: x}]}]
  homeNode: {}`))
	if err != nil {
		t.Fatal(err)
	}
	wf := res.Workflow
	s := wf.Spec.Steps[0]
	o := s.Outputs[0]
	if *s.Replicas != 1 || o.Type != v1alpha1.FileTypeFile || o.Fire != v1alpha1.FireUpdate || o.Commit.Rule != v1alpha1.CommitOnTermination {
		t.Errorf("defaults: replicas %d type %q fire %q commit %q", *s.Replicas, o.Type, o.Fire, o.Commit.Rule)
	}
	if wf.Spec.Volume.MountPath != "/data" || wf.Spec.HomeNode.Policy != v1alpha1.HomeNodeCreate {
		t.Errorf("defaults: mountPath %q homeNode %q", wf.Spec.Volume.MountPath, wf.Spec.HomeNode.Policy)
	}
}

func TestGoodWorkflowsAndExamples(t *testing.T) {
	files, _ := filepath.Glob("../../examples/*/*.yaml")
	recipes, _ := filepath.Glob("../../examples/recipes/*/workflow.yaml")
	files = append(files, recipes...)
	files = append(files, "../../examples/capio-paper/capio-cl.json")
	if len(files) < 2 {
		t.Fatalf("found only %v under examples/", files)
	}
	for _, f := range files {
		t.Run(f, func(t *testing.T) {
			res, err := LoadFile(context.Background(), f)
			if err != nil {
				t.Fatal(err)
			}
			if res.Rules == nil || len(res.Workflow.Spec.Steps) == 0 {
				t.Error("no rules or steps")
			}
		})
	}
	res, err := Load(context.Background(), "full.yaml", []byte(header+`
spec:
  volume: {mountPath: /work, sizeLimit: 2Gi}
  aliases: [{name: chunks, files: ["chunks/*"]}]
  steps:
  - name: split
    template: {spec: {containers: [{name: c, image: busybox, command: [sh, -c, "true"]}]}}
    outputs:
    - {path: chunks, type: Directory, commit: {rule: OnNFiles, count: 8}, fire: NoUpdate}
    - {path: "chunks/*", commit: {rule: OnClose}}
  - name: count
    replicas: 4
    inputs: [chunks, missing.txt]
    outputs: [{path: "counts/*", commit: {rule: OnClose}}]
  permanent: ["counts/*"]
  exclude: ["*.tmp"]
  homeNode: {policy: Manual, manual: [{files: ["counts/*"], step: count, instance: 3}]}
  storage: {bucket: results, prefix: wordcount/, secretRef: {name: s3}}
  waitTimeout: 10m`))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], `"missing.txt" is not declared by any output`) {
		t.Errorf("warnings = %q", res.Warnings)
	}
}

func TestCAPIOCLDocumentsAreConvertedAndChecked(t *testing.T) {
	res, err := Load(context.Background(), "c.json", []byte(`{"name": "Bad Name!", "IO_Graph": [
	  {"name": "s", "input_stream": [], "output_stream": ["a"],
	   "streaming": [{"name": ["a"], "committed": "on_file", "file_deps": ["a"]}]}]}`))
	if err == nil {
		t.Fatalf("accepted an on_file self-dependency: %+v", res)
	}
	if !strings.Contains(err.Error(), "OnFile dependency cycle: a -> a") {
		t.Errorf("err = %v", err)
	}
}

func TestOneDocumentPerFile(t *testing.T) {
	_, err := Load(context.Background(), "two.yaml", []byte(header+"spec: {steps: [{name: a}]}\n---\n"+header+"spec: {steps: [{name: b}]}\n"))
	if err == nil || !strings.Contains(err.Error(), "exactly one Workflow document") {
		t.Errorf("err = %v", err)
	}
}

func TestMain(m *testing.M) {
	// Validation must not depend on the working directory beyond the examples it reads.
	os.Exit(m.Run())
}

// A problem with the document as a whole (not YAML, not an object, several documents) is
// reported against the file's name, not against a field path that does not exist.
func TestDocumentErrorsNameTheFile(t *testing.T) {
	for doc, want := range map[string]string{
		"steps: [\n  - name: a\n bad": "wf.yaml: not valid YAML: ",
		"- a\n- b\n":                  "wf.yaml: a Workflow document must be a YAML or JSON object",
		header + "---\n" + header:     "wf.yaml: a file must hold exactly one Workflow document, found 2",
	} {
		_, err := Load(context.Background(), "wf.yaml", []byte(doc))
		if err == nil || !strings.HasPrefix(err.Error(), want) || strings.Contains(err.Error(), "<nil>") {
			t.Errorf("Load(%q) = %v, want an error starting %q", doc, err, want)
		}
	}
}

// A Workflow names files relative to the volume: an absolute name (which a new user means
// as a path of the machine, and whose step then writes outside the volume) and a name
// with ".." are refused, each at its field, saying what to write instead.
func TestPathsOutsideTheVolumeAreRefused(t *testing.T) {
	_, err := Load(context.Background(), "abs.yaml", []byte(header+`
spec:
  steps:
  - {name: p, outputs: [{path: /tmp/x.txt}, {path: /data/y.txt}, {path: z, commit: {rule: OnFile, files: [/tmp/x.txt]}}]}
  - {name: q, inputs: [/tmp/x.txt, ../up.txt]}
  permanent: [/tmp/x.txt]`))
	if err == nil {
		t.Fatal("accepted absolute paths")
	}
	for _, want := range []string{
		`abs.yaml: spec.steps[0].outputs[0].path: Invalid value: "/tmp/x.txt": is absolute: paths are relative to the volume ($SLUICE_DIR, mounted at /data); write "tmp/x.txt" for /data/tmp/x.txt`,
		`abs.yaml: spec.steps[0].outputs[1].path: Invalid value: "/data/y.txt": is absolute: paths are relative to the volume ($SLUICE_DIR, mounted at /data); write "y.txt" for /data/y.txt`,
		`abs.yaml: spec.steps[0].outputs[2].commit.files[0]: Invalid value: "/tmp/x.txt": is absolute`,
		`abs.yaml: spec.steps[1].inputs[0]: Invalid value: "/tmp/x.txt": is absolute`,
		`abs.yaml: spec.steps[1].inputs[1]: Invalid value: "../up.txt": has a ".." segment: paths are relative to the volume ($SLUICE_DIR) and cannot leave it`,
		`abs.yaml: spec.permanent[0]: Invalid value: "/tmp/x.txt": is absolute`,
	} {
		if !strings.Contains(err.Error()+"\n", want) {
			t.Errorf("error:\n%v\nwant a line containing:\n%s", err, want)
		}
	}
	if n := strings.Count(err.Error(), "\n") + 1; n != 6 {
		t.Errorf("%d errors, want 6 (one per field):\n%v", n, err)
	}
	// CAPIO-CL documents write absolute names; they mean the volume root.
	res, err := Load(context.Background(), "c.json", []byte(`{"name": "c", "IO_Graph": [
	  {"name": "s", "input_stream": ["/in.txt"], "output_stream": ["/tmp/file"],
	   "streaming": [{"name": ["/tmp/file"], "committed": "on_close"}]}], "permanent": ["/tmp/file"]}`))
	if err != nil {
		t.Fatalf("a CAPIO-CL document with absolute names: %v", err)
	}
	s := res.Workflow.Spec
	if s.Steps[0].Outputs[0].Path != "tmp/file" || s.Steps[0].Inputs[0] != "in.txt" || s.Permanent[0] != "tmp/file" {
		t.Errorf("imported paths: outputs %+v inputs %q permanent %q", s.Steps[0].Outputs, s.Steps[0].Inputs, s.Permanent)
	}
}

// A value of the wrong type (YAML's unquoted yes is a boolean) is shown with the value and
// what was expected, at its full path, also inside a pod template, and only once.
func TestWrongTypesNameTheFieldAndTheValue(t *testing.T) {
	_, err := Load(context.Background(), "t.yaml", []byte(header+`
spec:
  steps:
  - name: p
    template: {spec: {containers: [{name: c, image: busybox, command: [true]}]}}
    outputs: [{path: yes}, {path: 10}]`))
	if err == nil {
		t.Fatal("accepted booleans for strings")
	}
	for _, want := range []string{
		`t.yaml: spec.steps[0].outputs[0].path: Invalid value: true: must be a string, not a boolean (YAML reads an unquoted yes, no, on, off, true or false as a boolean: quote it, e.g. "yes")`,
		`t.yaml: spec.steps[0].outputs[1].path: Invalid value: 10: must be a string, not an integer (quote it, e.g. "10")`,
		`t.yaml: spec.steps[0].template.spec.containers[0].command[0]: Invalid value: true: must be a string, not a boolean`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error:\n%v\nwant it to contain:\n%s", err, want)
		}
	}
	if strings.Contains(err.Error(), "cannot unmarshal") || strings.Contains(err.Error(), `"boolean"`) {
		t.Errorf("error shows a decoder's message or a type name as the value:\n%v", err)
	}
}

// Every problem of a document is reported at once: the name, the schema, the templates,
// the paths and the rules (an OnFile cycle too), each once, with the file and the field.
func TestEveryErrorAtOnce(t *testing.T) {
	_, err := Load(context.Background(), "all.yaml", []byte(`apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: Bad_Name}
spec:
  steps:
  - name: p
    template: {spec: {contaners: []}}
    outputs:
    - {path: a, commit: {rule: OnFile, files: [b]}}
    - {path: b, commit: {rule: OnFile, files: [a]}}
    - {path: c, fire: Sometimes}
    - {path: d, commit: {rule: OnNFiles, count: 2}}
    - {path: /e}
`))
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{
		"all.yaml: metadata.name: Invalid value: \"Bad_Name\"",
		"all.yaml: spec.steps[0].template.spec.contaners: Invalid value: unknown field",
		"all.yaml: spec.steps[0].outputs[2].fire: Unsupported value: \"Sometimes\"",
		"all.yaml: spec.steps[0].outputs[3].commit.rule: Invalid value: \"OnNFiles\": OnNFiles applies only to type Directory",
		"all.yaml: spec.steps[0].outputs[4].path: Invalid value: \"/e\": is absolute",
		"OnFile dependency cycle: a -> b -> a",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error:\n%v\nwant it to contain:\n%s", err, want)
		}
	}
	if n := strings.Count(err.Error(), "\n") + 1; n != 6 {
		t.Errorf("%d errors, want 6:\n%v", n, err)
	}
}
