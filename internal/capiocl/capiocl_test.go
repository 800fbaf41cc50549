package capiocl

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/yaml"

	"github.com/sluice-io/sluice/api/v1alpha1"
)

// fixtureDir holds the CAPIO-CL fixtures, schemas and EXPECTED.tsv (see its ORIGIN.md).
const fixtureDir = "testdata/capio-cl"

// expected reads testdata/capio-cl/EXPECTED.tsv: fixture path -> "valid" | "invalid".
func expected(t *testing.T) (dir string, want map[string]string) {
	t.Helper()
	dir = fixtureDir
	f, err := os.Open(filepath.Join(dir, "EXPECTED.tsv"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want = map[string]string{}
	sc := bufio.NewScanner(f)
	for first := true; sc.Scan(); first = false {
		cols := strings.Split(sc.Text(), "\t")
		if first || len(cols) < 2 {
			continue
		}
		want[cols[0]] = cols[1]
	}
	if len(want) == 0 {
		t.Fatal("EXPECTED.tsv lists no fixtures")
	}
	return dir, want
}

// Every fixture is accepted or rejected exactly as EXPECTED.tsv says, and every fixture
// on disk is listed there.
func TestFixturesAsExpected(t *testing.T) {
	dir, want := expected(t)
	onDisk, _ := filepath.Glob(filepath.Join(dir, "tests/jsons/*/*.json"))
	for _, p := range onDisk {
		rel, _ := filepath.Rel(dir, p)
		if _, ok := want[rel]; !ok {
			t.Errorf("%s is not listed in EXPECTED.tsv", rel)
		}
	}
	for rel, verdict := range want {
		t.Run(rel, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(dir, rel))
			if err != nil {
				t.Fatal(err)
			}
			_, err = Parse(rel, data)
			switch {
			case verdict == "valid" && err != nil:
				t.Errorf("rejected a valid document:\n%v", err)
			case verdict == "invalid" && err == nil:
				t.Error("accepted an invalid document")
			case verdict == "invalid":
				// every problem names the file
				for _, line := range strings.Split(err.Error(), "\n") {
					if !strings.HasPrefix(line, rel+": ") {
						t.Errorf("error line does not name the file: %q", line)
					}
				}
			}
		})
	}
}

// For the valid fixtures, import then export then import is stable.
func TestFixturesRoundTrip(t *testing.T) {
	dir, want := expected(t)
	for rel, verdict := range want {
		if verdict != "valid" {
			continue
		}
		t.Run(rel, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(dir, rel))
			if err != nil {
				t.Fatal(err)
			}
			doc, err := Parse(rel, data)
			if err != nil {
				t.Fatal(err)
			}
			wf1, _ := ToWorkflow(doc)
			version := Version11
			if doc.Version == nil {
				version = Version10
			}
			wf2 := reimport(t, wf1, version)
			if !equality.Semantic.DeepEqual(wf1, wf2) {
				t.Errorf("import/export/import changed the workflow:\nfirst:  %s\nsecond: %s", dump(wf1), dump(wf2))
			}
		})
	}
}

// reimport exports wf, checks the output against the schema by parsing it, and imports it.
func reimport(t *testing.T, wf *v1alpha1.Workflow, version string) *v1alpha1.Workflow {
	t.Helper()
	doc, _, err := FromWorkflow(wf, version)
	if err != nil {
		t.Fatal(err)
	}
	out, err := Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	doc2, err := Parse("exported", out)
	if err != nil {
		t.Fatalf("export produced an invalid document: %v\n%s", err, out)
	}
	wf2, _ := ToWorkflow(doc2)
	return wf2
}

func dump(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// Any Workflow CAPIO-CL can express survives export then import unchanged.
func TestWorkflowRoundTrip(t *testing.T) {
	for _, tc := range []struct{ name, yaml string }{
		{"every rule", `
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: every-rule, annotations: {capio-cl.sluice.io/configuration: /etc/capio.toml}}
spec:
  aliases: [{name: grp, files: [a.dat, "out/*"]}]
  steps:
  - name: split
    outputs:
    - {path: chunks, type: Directory, commit: {rule: OnNFiles, count: 8}, fire: NoUpdate}
    - {path: "chunks/*", commit: {rule: OnClose}}
    - {path: a.dat, commit: {rule: OnClose, count: 3}, fire: NoUpdate}
    - {path: b.dat, commit: {rule: OnFile, files: [a.dat]}, fire: Update}
    - {path: t.dat, commit: {rule: OnTermination}}
    - {path: plain.dat}
  - name: count
    inputs: [chunks, grp]
    outputs: [{path: "out/*", commit: {rule: OnClose, count: 1}}]
  permanent: ["out/*"]
  exclude: ["*.tmp"]
  homeNode:
    create: [a.dat]
    hashing: ["out/*"]
    manual: [{files: [grp], step: count}]
  tiers: {memory: [chunks], fs: ["out/*"]}`},
		{"Name needing an annotation", `
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: my-flow, annotations: {capio-cl.sluice.io/name: My_Flow}}
spec:
  steps: [{name: A, outputs: [{path: x}]}]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var wf v1alpha1.Workflow
			if err := yaml.UnmarshalStrict([]byte(tc.yaml), &wf); err != nil {
				t.Fatal(err)
			}
			wf2 := reimport(t, &wf, Version11)
			// the version annotation records where wf2 came from; wf had none
			delete(wf2.Annotations, v1alpha1.AnnotationCAPIOVersion)
			if !equality.Semantic.DeepEqual(&wf, wf2) {
				t.Errorf("export/import changed the workflow:\nbefore: %s\nafter:  %s", dump(&wf), dump(wf2))
			}
		})
	}
}

func TestExportWarnsAboutWhatCAPIOCLCannotExpress(t *testing.T) {
	var wf v1alpha1.Workflow
	if err := yaml.UnmarshalStrict([]byte(`
metadata: {name: w}
spec:
  steps:
  - name: p
    replicas: 3
    template: {spec: {containers: [{name: c, image: x}]}}
    outputs: [{path: f, commit: {rule: OnTermination, count: 2}}]`), &wf); err != nil {
		t.Fatal(err)
	}
	_, warnings, err := FromWorkflow(&wf, Version10)
	if err != nil {
		t.Fatal(err)
	}
	joined := strings.Join(warnings, "\n")
	for _, want := range []string{
		"spec.steps[0].outputs[0].commit.count (2): CAPIO-CL on_termination waits for every instance",
		"spec.steps[0].replicas (3): CAPIO-CL has no replica count",
		"spec.steps[0].template: CAPIO-CL has no pod template",
	} {
		if !strings.Contains(joined, want) {
			t.Errorf("warnings %q lack %q", joined, want)
		}
	}
	if _, _, err := FromWorkflow(&wf, "2.0"); err == nil || !strings.Contains(err.Error(), `unsupported CAPIO-CL version "2.0"`) {
		t.Errorf("export to version 2.0: err = %v", err)
	}
}

func TestParseErrorsNameThePath(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		{`{"version": 1.1, "name": "x", "IO_Graph": [{"name": "s", "input_stream": [], "output_stream": "f"}]}`,
			`f.json: IO_Graph[0].output_stream: got string, want array`},
		{`{"version": 1.1, "name": "x", "IO_Graph": [{"name": "s", "input_stream": [], "output_stream": [], "streaming": [{"dirname": ["d"], "committed": "n_files:3"}]}]}`,
			`f.json: IO_Graph[0].streaming[0].committed: 'n_files:3' does not match pattern`},
		{`{"version": 1.1, "name": "x", "IO_Graph": [{"name": "s", "input_stream": [], "output_stream": [], "streaming": [{"name": ["f"], "committed": "on_close:0"}]}]}`,
			`f.json: IO_Graph[0].streaming[0].committed: "on_close:0": the number of closes must be at least 1`},
		{`{"version": 2.5, "name": "x", "IO_Graph": []}`,
			`f.json: version: unsupported CAPIO-CL version 2.5; Sluice reads 1.0 and 1.1`},
		{`{"name": "x", "IO_Graph": [], "bogus": 1}`,
			`f.json: additional properties 'bogus' not allowed`},
		{`[1, 2]`, `f.json: a CAPIO-CL document must be a JSON object`},
		{`{"name": `, `f.json: not valid JSON`},
	} {
		_, err := Parse("f.json", []byte(tc.doc))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%s)\n err = %v\nwant it to contain %q", tc.doc, err, tc.want)
		}
	}
}

// The CAPIO paper's example, written as the language's authors write it (an alias in
// output_stream whose members have rules of their own, a directory with a rule for one
// file inside it): it imports without a warning, each member with its own rule, and
// import -> export -> import gives the same Workflow and export gives the document back.
func TestPaperExample(t *testing.T) {
	orig := mustRead(t, "../../examples/capio-paper/capio-cl.json")
	doc, err := Parse("paper", orig)
	if err != nil {
		t.Fatal(err)
	}
	wf, warnings := ToWorkflow(doc)
	if len(warnings) != 0 {
		t.Errorf("unexpected warnings: %q", warnings)
	}
	outs := map[string]v1alpha1.Output{}
	for _, st := range wf.Spec.Steps {
		for _, o := range st.Outputs {
			outs[st.Name+":"+o.Path] = o
		}
	}
	for key, want := range map[string]func(o v1alpha1.Output) bool{
		"appA:file_A.dat": func(o v1alpha1.Output) bool {
			return o.Commit.Rule == v1alpha1.CommitOnClose && *o.Commit.Count == 3 && o.Fire == v1alpha1.FireNoUpdate
		},
		"appB:group0": func(o v1alpha1.Output) bool { return o.Commit.Rule == "" },
		"appB:file_B.dat": func(o v1alpha1.Output) bool {
			return o.Commit.Rule == v1alpha1.CommitOnFile && slices.Equal(o.Commit.Files, []string{"file_A.dat"}) && o.Fire == v1alpha1.FireUpdate
		},
		"appB:file_C.dat": func(o v1alpha1.Output) bool {
			return o.Commit.Rule == v1alpha1.CommitOnClose && o.Fire == v1alpha1.FireNoUpdate
		},
		"appB:dir": func(o v1alpha1.Output) bool {
			return o.Type == v1alpha1.FileTypeDirectory && o.Commit.Rule == v1alpha1.CommitOnNFiles && *o.Commit.Count == 100
		},
		"appB:dir/summary.dat": func(o v1alpha1.Output) bool {
			return o.Commit.Rule == v1alpha1.CommitOnClose && o.Fire == v1alpha1.FireUpdate
		},
	} {
		if o, ok := outs[key]; !ok || !want(o) {
			t.Errorf("output %s = %+v (declared %v)", key, o, ok)
		}
	}
	if m := wf.Spec.HomeNode.Manual; len(m) != 1 || m[0].Step != "appC" || m[0].Files[0] != "group0" {
		t.Errorf("home node = %+v, want group0 on appC", wf.Spec.HomeNode)
	}
	back, warnings, err := FromWorkflow(wf, Version11)
	if err != nil || len(warnings) != 0 {
		t.Fatalf("export: %v %q", err, warnings)
	}
	b, err := Marshal(back)
	if err != nil {
		t.Fatal(err)
	}
	var a1, a2 any
	if err := json.Unmarshal(orig, &a1); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &a2); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a1, a2) {
		t.Errorf("export of the import differs from the document:\n%s", b)
	}
	doc2, err := Parse("re-exported", b)
	if err != nil {
		t.Fatal(err)
	}
	if wf2, _ := ToWorkflow(doc2); !equality.Semantic.DeepEqual(wf, wf2) {
		t.Errorf("import -> export -> import changed the Workflow:\n%+v\n%+v", wf.Spec, wf2.Spec)
	}
}

// A rule for a name that is neither an output_stream entry nor a member of one is still
// warned about (it becomes an output of its step).
func TestRuleOutsideOutputStreamWarns(t *testing.T) {
	doc, err := Parse("d.json", []byte(`{"name": "w", "IO_Graph": [{"name": "a", "input_stream": [], "output_stream": ["dir"],
		"streaming": [{"name": ["other/x"], "committed": "on_close"}, {"name": ["dir/y"], "committed": "on_close"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	_, warnings := ToWorkflow(doc)
	if len(warnings) != 1 || !strings.Contains(warnings[0], `"other/x" names no output_stream entry`) {
		t.Errorf("warnings %q, want one for other/x only", warnings)
	}
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// FuzzParse feeds arbitrary bytes to the parser and the converters: they must never
// panic, and whatever parses must convert to a Workflow that exports to a document the
// parser accepts again.
func FuzzParse(f *testing.F) {
	if dir, want := expectedForFuzz(); dir != "" {
		for rel := range want {
			if b, err := os.ReadFile(filepath.Join(dir, rel)); err == nil {
				f.Add(b)
			}
		}
	}
	if b, err := os.ReadFile("../../examples/capio-paper/capio-cl.json"); err == nil {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		doc, err := Parse("fuzz.json", data)
		if err != nil {
			return
		}
		wf, _ := ToWorkflow(doc)
		for _, v := range []string{Version10, Version11} {
			out, _, err := FromWorkflow(wf, v)
			if err != nil {
				t.Fatal(err)
			}
			b, err := Marshal(out)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := Parse("re-exported.json", b); err != nil {
				t.Fatalf("export of a parsed document does not parse: %v\n%s", err, b)
			}
		}
	})
}

func expectedForFuzz() (string, map[string]string) {
	dir := fixtureDir
	b, err := os.ReadFile(filepath.Join(dir, "EXPECTED.tsv"))
	if err != nil {
		return "", nil
	}
	want := map[string]string{}
	for _, line := range strings.Split(string(b), "\n")[1:] {
		if cols := strings.Split(line, "\t"); len(cols) >= 2 {
			want[cols[0]] = cols[1]
		}
	}
	return dir, want
}
