package capiocl

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/sluice-io/sluice/api/v1alpha1"
)

// exportCase sets one field of a Workflow and says what export does with it.
type exportCase struct {
	set func(w *v1alpha1.Workflow)
	// warn is the one warning export must give, exactly; "" when CAPIO-CL expresses the
	// value: export then gives no warning, and import gives the Workflow back unchanged.
	warn string
}

// notDeclared lists the fields of a Workflow that are not part of what a user declares,
// with the reason export says nothing about them.
var notDeclared = map[string]string{
	"apiVersion":                          "the same for every Workflow; import sets it",
	"kind":                                "the same for every Workflow; import sets it",
	"metadata.selfLink":                   "set by the API server",
	"metadata.uid":                        "set by the API server",
	"metadata.resourceVersion":            "set by the API server",
	"metadata.generation":                 "set by the API server",
	"metadata.creationTimestamp":          "set by the API server",
	"metadata.deletionTimestamp":          "set by the API server",
	"metadata.deletionGracePeriodSeconds": "set by the API server",
	"metadata.managedFields":              "set by the API server",
	"status":                              "observed state, not a declaration",
}

func int32p(v int32) *int32 { return &v }

// out returns a pointer to the base Workflow's only output.
func out(w *v1alpha1.Workflow) *v1alpha1.Output { return &w.Spec.Steps[0].Outputs[0] }

// sourceCase sets the source field under test on a stage-in source of data/x.
func sourceCase(set func(s *v1alpha1.Source)) []exportCase {
	return []exportCase{{
		set: func(w *v1alpha1.Workflow) {
			s := v1alpha1.Source{Path: "data/x", From: "s3://bucket/x"}
			set(&s)
			w.Spec.Sources = []v1alpha1.Source{s}
		},
		warn: "spec.sources[0] (s3://bucket/x -> data/x): stage-in is not expressible in CAPIO-CL; after import, data/x has no producer",
	}}
}

// storageCase sets the storage field under test on a storage of bucket "b".
func storageCase(set func(s *v1alpha1.StorageSpec)) []exportCase {
	return []exportCase{{
		set: func(w *v1alpha1.Workflow) {
			s := v1alpha1.StorageSpec{Bucket: "b"}
			set(&s)
			w.Spec.Storage = &s
		},
		warn: `spec.storage (bucket "b"): CAPIO-CL has no object storage; left out (permanent files stay listed, not where they are stored)`,
	}}
}

// exportCases covers every field of a Workflow (by its path, "[]" for the elements of a
// list): how to set it and what export does with it.
var exportCases = map[string][]exportCase{
	"metadata.name": {{set: func(w *v1alpha1.Workflow) { w.Name = "other" }}},
	"metadata.generateName": {{set: func(w *v1alpha1.Workflow) { w.GenerateName = "w-" },
		warn: "metadata.generateName (w-): CAPIO-CL has no generated names; left out"}},
	"metadata.namespace": {{set: func(w *v1alpha1.Workflow) { w.Namespace = "team" },
		warn: "metadata.namespace (team): CAPIO-CL has no namespace; left out"}},
	"metadata.labels": {{set: func(w *v1alpha1.Workflow) { w.Labels = map[string]string{"app": "x"} },
		warn: "metadata.labels[app]: CAPIO-CL has no labels; left out"}},
	"metadata.annotations": {
		{set: func(w *v1alpha1.Workflow) { w.Annotations = map[string]string{"note": "x"} },
			warn: "metadata.annotations[note]: CAPIO-CL has no annotations; left out"},
		{set: func(w *v1alpha1.Workflow) {
			w.Name, w.Annotations = "my-flow", map[string]string{v1alpha1.AnnotationCAPIOName: "My_Flow"}
		}},
		{set: func(w *v1alpha1.Workflow) {
			w.Annotations = map[string]string{v1alpha1.AnnotationCAPIOConfiguration: "/etc/capio.toml"}
		}},
	},
	"metadata.ownerReferences": {{set: func(w *v1alpha1.Workflow) {
		w.OwnerReferences = []metav1.OwnerReference{{Kind: "Job", Name: "j"}}
	}, warn: "metadata.ownerReferences[0] (Job j): CAPIO-CL has no owners; left out"}},
	"metadata.finalizers": {{set: func(w *v1alpha1.Workflow) { w.Finalizers = []string{"x.io/f"} },
		warn: "metadata.finalizers[0] (x.io/f): CAPIO-CL has no finalizers; left out"}},

	"spec.volume.mountPath": {{set: func(w *v1alpha1.Workflow) { w.Spec.Volume.MountPath = "/work" },
		warn: "spec.volume.mountPath (/work): CAPIO-CL has no mount path; left out (after import, /data)"}},
	"spec.volume.sizeLimit": {{set: func(w *v1alpha1.Workflow) { q := resource.MustParse("1Gi"); w.Spec.Volume.SizeLimit = &q },
		warn: "spec.volume.sizeLimit (1Gi): CAPIO-CL has no size limit; left out"}},
	"spec.volume.disk": {{set: func(w *v1alpha1.Workflow) { w.Spec.Volume.Disk = &v1alpha1.DiskSpec{} },
		warn: "spec.volume.disk (a disk tier): CAPIO-CL has no disk tier to spill to; left out"}},
	"spec.volume.disk.sizeLimit": {{set: func(w *v1alpha1.Workflow) {
		q := resource.MustParse("10Gi")
		w.Spec.Volume.Disk = &v1alpha1.DiskSpec{SizeLimit: &q}
	}, warn: "spec.volume.disk (a disk tier of sizeLimit 10Gi): CAPIO-CL has no disk tier to spill to; left out"}},

	"spec.aliases[].name": {{set: func(w *v1alpha1.Workflow) {
		w.Spec.Aliases = []v1alpha1.Alias{{Name: "grp", Files: []string{"f"}}}
		w.Spec.Steps[1].Inputs = []string{"grp"}
	}}},
	"spec.aliases[].files": {{set: func(w *v1alpha1.Workflow) {
		w.Spec.Aliases = []v1alpha1.Alias{{Name: "grp", Files: []string{"f", "g"}}}
	}}},

	"spec.steps[].name": {{set: func(w *v1alpha1.Workflow) { w.Spec.Steps[0].Name = "producer" }}},
	"spec.steps[].replicas": {
		{set: func(w *v1alpha1.Workflow) { w.Spec.Steps[0].Replicas = int32p(3) },
			warn: `spec.steps[0].replicas (3): CAPIO-CL has no replica count; left out (after import, step "p" runs 1 instance)`},
	},
	"spec.steps[].template": {{set: func(w *v1alpha1.Workflow) {
		w.Spec.Steps[0].Template = &corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}}}
	}, warn: "spec.steps[0].template: CAPIO-CL has no pod template; left out"}},
	"spec.steps[].inputs": {{set: func(w *v1alpha1.Workflow) { w.Spec.Steps[1].Inputs = []string{"f", "other"} }}},
	"spec.steps[].outputs[].path": {{set: func(w *v1alpha1.Workflow) {
		out(w).Path = "g"
		w.Spec.Steps[1].Inputs = []string{"g"}
	}}},
	"spec.steps[].outputs[].type":        {{set: func(w *v1alpha1.Workflow) { out(w).Type = v1alpha1.FileTypeDirectory }}},
	"spec.steps[].outputs[].commit.rule": {{set: func(w *v1alpha1.Workflow) { out(w).Commit.Rule = v1alpha1.CommitOnClose }}},
	"spec.steps[].outputs[].commit.count": {
		{set: func(w *v1alpha1.Workflow) {
			out(w).Commit = v1alpha1.CommitSpec{Rule: v1alpha1.CommitOnClose, Count: int32p(3)}
		}},
		{set: func(w *v1alpha1.Workflow) {
			out(w).Commit = v1alpha1.CommitSpec{Rule: v1alpha1.CommitOnTermination, Count: int32p(2)}
		}, warn: "spec.steps[0].outputs[0].commit.count (2): CAPIO-CL on_termination waits for every instance; the count is left out"},
	},
	"spec.steps[].outputs[].commit.files": {{set: func(w *v1alpha1.Workflow) {
		w.Spec.Steps[0].Outputs = append(w.Spec.Steps[0].Outputs, v1alpha1.Output{Path: "g",
			Commit: v1alpha1.CommitSpec{Rule: v1alpha1.CommitOnFile, Files: []string{"f"}}})
	}}},
	"spec.steps[].outputs[].fire": {{set: func(w *v1alpha1.Workflow) { out(w).Fire = v1alpha1.FireNoUpdate }}},
	"spec.steps[].outputs[].lifetime": {{set: func(w *v1alpha1.Workflow) { out(w).Lifetime = v1alpha1.LifetimeConsumed },
		warn: "spec.steps[0].outputs[0].lifetime (Consumed): CAPIO-CL keeps every file until the workflow ends; left out"}},
	"spec.steps[].outputs[].replicate": {{set: func(w *v1alpha1.Workflow) { out(w).Replicate = v1alpha1.ReplicateStream },
		warn: "spec.steps[0].outputs[0].replicate (Stream): CAPIO-CL has no replication; left out (after import, Fetch)"}},
	"spec.steps[].placement": {{set: func(w *v1alpha1.Workflow) { w.Spec.Steps[1].Placement = v1alpha1.PlacementRequired },
		warn: "spec.steps[1].placement (Required): CAPIO-CL has no placement policy; left out (after import, Preferred)"}},
	"spec.steps[].backoffLimit": {{set: func(w *v1alpha1.Workflow) { w.Spec.Steps[0].BackoffLimit = int32p(2) },
		warn: `spec.steps[0].backoffLimit (2): CAPIO-CL has no retries; left out (after import, a failed instance of step "p" is not run again)`}},

	"spec.permanent": {{set: func(w *v1alpha1.Workflow) { w.Spec.Permanent = []string{"f"} }}},
	"spec.exclude":   {{set: func(w *v1alpha1.Workflow) { w.Spec.Exclude = []string{"*.tmp"} }}},

	"spec.homeNode.policy": {{set: func(w *v1alpha1.Workflow) {
		w.Spec.HomeNode = &v1alpha1.HomeNodeSpec{Policy: v1alpha1.HomeNodeHashing, Create: []string{"f"}}
	}, warn: "spec.homeNode.policy (Hashing): CAPIO-CL has no default policy; Hashing for unlisted files is left out"}},
	"spec.homeNode.create":  {{set: func(w *v1alpha1.Workflow) { w.Spec.HomeNode = &v1alpha1.HomeNodeSpec{Create: []string{"f"}} }}},
	"spec.homeNode.hashing": {{set: func(w *v1alpha1.Workflow) { w.Spec.HomeNode = &v1alpha1.HomeNodeSpec{Hashing: []string{"f"}} }}},
	"spec.homeNode.manual[].files": {{set: func(w *v1alpha1.Workflow) {
		w.Spec.HomeNode = &v1alpha1.HomeNodeSpec{Manual: []v1alpha1.ManualHomeNode{{Files: []string{"f"}, Step: "c"}}}
	}}},
	"spec.homeNode.manual[].step": {{set: func(w *v1alpha1.Workflow) {
		w.Spec.HomeNode = &v1alpha1.HomeNodeSpec{Manual: []v1alpha1.ManualHomeNode{{Files: []string{"f"}, Step: "p"}}}
	}}},
	"spec.homeNode.manual[].instance": {{set: func(w *v1alpha1.Workflow) {
		w.Spec.HomeNode = &v1alpha1.HomeNodeSpec{Manual: []v1alpha1.ManualHomeNode{{Files: []string{"f"}, Step: "c", Instance: int32p(1)}}}
	}, warn: `spec.homeNode.manual[0].instance (1): CAPIO-CL names a step, not an instance; left out (after import, instance 0 of step "c" holds the files)`}},

	"spec.tiers.memory": {{set: func(w *v1alpha1.Workflow) { w.Spec.Tiers = &v1alpha1.TierSpec{Memory: []string{"f"}} }}},
	"spec.tiers.fs":     {{set: func(w *v1alpha1.Workflow) { w.Spec.Tiers = &v1alpha1.TierSpec{FS: []string{"f"}} }}},

	"spec.storage.bucket":    storageCase(func(*v1alpha1.StorageSpec) {}),
	"spec.storage.prefix":    storageCase(func(s *v1alpha1.StorageSpec) { s.Prefix = "run/" }),
	"spec.storage.endpoint":  storageCase(func(s *v1alpha1.StorageSpec) { s.Endpoint = "minio:9000" }),
	"spec.storage.secretRef": storageCase(func(s *v1alpha1.StorageSpec) { s.SecretRef = &corev1.LocalObjectReference{Name: "keys"} }),

	"spec.sources[].path":        sourceCase(func(*v1alpha1.Source) {}),
	"spec.sources[].from":        sourceCase(func(*v1alpha1.Source) {}),
	"spec.sources[].type":        sourceCase(func(s *v1alpha1.Source) { s.Type = v1alpha1.FileTypeFile }),
	"spec.sources[].commit.rule": sourceCase(func(s *v1alpha1.Source) { s.Commit.Rule = v1alpha1.CommitOnClose }),
	"spec.sources[].commit.count": sourceCase(func(s *v1alpha1.Source) {
		s.Commit = v1alpha1.CommitSpec{Rule: v1alpha1.CommitOnClose, Count: int32p(1)}
	}),
	"spec.sources[].commit.files": sourceCase(func(s *v1alpha1.Source) {
		s.Commit = v1alpha1.CommitSpec{Rule: v1alpha1.CommitOnFile, Files: []string{"f"}}
	}),
	"spec.sources[].fire": sourceCase(func(s *v1alpha1.Source) { s.Fire = v1alpha1.FireUpdate }),

	"spec.waitTimeout": {{set: func(w *v1alpha1.Workflow) { w.Spec.WaitTimeout = &metav1.Duration{Duration: 5 * time.Minute} },
		warn: "spec.waitTimeout (5m0s): CAPIO-CL has no wait timeout; left out (after import, the default of 1h applies)"}},
	"spec.ttlSecondsAfterFinished": {{set: func(w *v1alpha1.Workflow) { w.Spec.TTLSecondsAfterFinished = int32p(60) },
		warn: "spec.ttlSecondsAfterFinished (60): CAPIO-CL has no time to keep data after the end; left out (after import, data is kept until the Workflow is deleted)"}},
}

// workflowFields lists the paths of the fields of t: its leaves (fields export must say
// something about) and the structs above them. It descends into the structs of the API
// package, into embedded ones and into the object metadata; any other type is a leaf.
func workflowFields(t reflect.Type, prefix string, leaves, parents *[]string) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	elem, list := t, ""
	if t.Kind() == reflect.Slice {
		elem, list = t.Elem(), "[]"
		for elem.Kind() == reflect.Pointer {
			elem = elem.Elem()
		}
	}
	descend := elem.Kind() == reflect.Struct && prefix != "status" &&
		(prefix == "" || elem.PkgPath() == reflect.TypeFor[v1alpha1.Workflow]().PkgPath() || elem == reflect.TypeFor[metav1.ObjectMeta]())
	if !descend {
		*leaves = append(*leaves, prefix)
		return
	}
	if prefix != "" {
		*parents = append(*parents, prefix)
	}
	for i := range elem.NumField() {
		f := elem.Field(i)
		if !f.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if f.Anonymous && (name == "" || strings.Contains(opts, "inline")) {
			inner := f.Type
			for inner.Kind() == reflect.Pointer {
				inner = inner.Elem()
			}
			for j := range inner.NumField() {
				g := inner.Field(j)
				n, _, _ := strings.Cut(g.Tag.Get("json"), ",")
				if g.IsExported() && n != "" && n != "-" {
					workflowFields(g.Type, join(prefix+list, n), leaves, parents)
				}
			}
			continue
		}
		workflowFields(f.Type, join(prefix+list, name), leaves, parents)
	}
}

func join(prefix, name string) string {
	if prefix == "" {
		return name
	}
	return prefix + "." + name
}

func baseWorkflow() *v1alpha1.Workflow {
	return &v1alpha1.Workflow{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "Workflow"},
		ObjectMeta: metav1.ObjectMeta{Name: "w"},
		Spec: v1alpha1.WorkflowSpec{Steps: []v1alpha1.Step{
			{Name: "p", Outputs: []v1alpha1.Output{{Path: "f"}}},
			{Name: "c", Inputs: []string{"f"}},
		}},
	}
}

// Export says, one line per field, everything it leaves out: every field of a Workflow is
// either expressed in CAPIO-CL (export then import gives it back) or left out with a
// warning that names the field and its value. The fields are enumerated from the API
// types, so a new field fails this test until it is given one or the other.
func TestExportWarnsForEveryFieldItLeavesOut(t *testing.T) {
	var leaves, parents []string
	workflowFields(reflect.TypeFor[v1alpha1.Workflow](), "", &leaves, &parents)
	for _, f := range leaves {
		_, declared := exportCases[f]
		if _, not := notDeclared[f]; !declared && !not {
			t.Errorf("field %s: export neither expresses it nor warns about it (add a case to exportCases, and a warning to FromWorkflow if CAPIO-CL cannot express it)", f)
		}
	}
	for f := range exportCases {
		if !slices.Contains(leaves, f) && !slices.Contains(parents, f) {
			t.Errorf("exportCases names %s, which is not a Workflow field", f)
		}
	}
	if _, warnings, _ := FromWorkflow(baseWorkflow(), Version11); len(warnings) != 0 {
		t.Fatalf("the base workflow exports with warnings %q", warnings)
	}
	for f, cases := range exportCases {
		for i, c := range cases {
			w := baseWorkflow()
			c.set(w)
			_, warnings, err := FromWorkflow(w, Version11)
			if err != nil {
				t.Fatalf("%s #%d: %v", f, i, err)
			}
			if c.warn != "" {
				if len(warnings) != 1 || warnings[0] != c.warn {
					t.Errorf("%s #%d: warnings\n %q\nwant exactly\n %q", f, i, warnings, c.warn)
				}
				continue
			}
			if len(warnings) != 0 {
				t.Errorf("%s #%d: CAPIO-CL expresses it, yet export warns %q", f, i, warnings)
			}
			back := reimport(t, w, Version11)
			delete(back.Annotations, v1alpha1.AnnotationCAPIOVersion)
			if len(back.Annotations) == 0 {
				back.Annotations = nil
			}
			if !equality.Semantic.DeepEqual(w, back) {
				t.Errorf("%s #%d: export/import changed the workflow:\nbefore: %s\nafter:  %s", f, i, dump(w), dump(back))
			}
		}
	}
}

// A Workflow that stages in its input exports to a document in which that input has no
// producer, and the import of it says so, naming the file and the JSON path.
func TestStageInLeftOutIsNamedOnBothSides(t *testing.T) {
	w := baseWorkflow()
	w.Spec.Sources = []v1alpha1.Source{{Path: "data/x", From: "s3://bucket/x"}}
	w.Spec.Steps[1].Inputs = []string{"f", "data/x"}
	doc, warnings, err := FromWorkflow(w, Version11)
	if err != nil {
		t.Fatal(err)
	}
	if want := "spec.sources[0] (s3://bucket/x -> data/x): stage-in is not expressible in CAPIO-CL; after import, data/x has no producer"; !slices.Contains(warnings, want) {
		t.Errorf("export warnings %q lack %q", warnings, want)
	}
	_, _, org := ToWorkflowOrigins(doc)
	got := org.Message("wf.json", `spec.steps[1].inputs[1]: "data/x" is not declared by any output`)
	if want := `wf.json: IO_Graph[1].input_stream[1]: "data/x" is not declared by any output`; got != want {
		t.Errorf("import message = %q, want %q", got, want)
	}
}

// resolve reports whether the JSON path at (IO_Graph[1].streaming[0].name[2]) names a
// value of the JSON document v.
func resolve(v any, at string) bool {
	for at != "" {
		var key string
		if strings.HasPrefix(at, "[") {
			end := strings.IndexByte(at, ']')
			i, err := strconv.Atoi(at[1:end])
			l, ok := v.([]any)
			if err != nil || !ok || i >= len(l) {
				return false
			}
			v, at = l[i], at[end+1:]
			continue
		}
		at = strings.TrimPrefix(at, ".")
		end := strings.IndexAny(at, ".[")
		if end < 0 {
			end = len(at)
		}
		key, at = at[:end], at[end:]
		m, ok := v.(map[string]any)
		if !ok {
			return false
		}
		if v, ok = m[key]; !ok {
			return false
		}
	}
	return true
}

// fieldPaths lists the paths of the values in a Workflow object, as validation names them
// (spec.steps[0].outputs[1].commit.rule, metadata.annotations[key]).
func fieldPaths(v any, prefix string, out *[]string) {
	switch t := v.(type) {
	case map[string]any:
		for k, e := range t {
			p := join(prefix, k)
			if prefix == "metadata.annotations" {
				p = prefix + "[" + k + "]"
			}
			fieldPaths(e, p, out)
		}
	case []any:
		for i, e := range t {
			fieldPaths(e, fmt.Sprintf("%s[%d]", prefix, i), out)
		}
	default:
		*out = append(*out, prefix)
	}
}

// Every field of a Workflow imported from CAPIO-CL is traced to the value of the document
// it came from, so that its warnings and errors can name the document's JSON path.
func TestImportTracesEveryFieldToTheDocument(t *testing.T) {
	docs := map[string][]byte{"paper": mustRead(t, "../../examples/capio-paper/capio-cl.json")}
	dir, want := expected(t)
	for rel, verdict := range want {
		if verdict == "valid" {
			docs[rel] = mustRead(t, filepath.Join(dir, rel))
		}
	}
	for name, data := range docs {
		doc, err := Parse(name, data)
		if err != nil {
			t.Fatal(err)
		}
		var raw any
		if err := json.Unmarshal(data, &raw); err != nil {
			t.Fatal(err)
		}
		wf, _, org := ToWorkflowOrigins(doc)
		obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(wf)
		if err != nil {
			t.Fatal(err)
		}
		delete(obj, "status")
		var paths []string
		fieldPaths(obj, "", &paths)
		for _, p := range paths {
			switch p {
			case "apiVersion", "kind", "metadata.creationTimestamp":
				continue
			}
			at := org.JSONPath(p)
			if at == "" || !resolve(raw, at) {
				t.Errorf("%s: %s comes from %q, which is no value of the document", name, p, at)
			}
		}
		for p, at := range org {
			if at != "" && !resolve(raw, at) {
				t.Errorf("%s: origin of %s is %q, which is no value of the document", name, p, at)
			}
		}
	}
}

// A message about an imported Workflow names the file and the document's JSON path.
func TestOriginsMessage(t *testing.T) {
	doc, err := Parse("wf.json", []byte(`{"name": "w", "IO_Graph": [
		{"name": "a", "input_stream": [], "output_stream": ["x", "y"],
		 "streaming": [{"name": ["y"], "committed": "on_file", "file_deps": ["x"]}]},
		{"name": "b", "input_stream": ["x", "z"], "output_stream": []}]}`))
	if err != nil {
		t.Fatal(err)
	}
	_, _, org := ToWorkflowOrigins(doc)
	for msg, want := range map[string]string{
		`spec.steps[1].inputs[1]: "z" is not declared by any output`:          `wf.json: IO_Graph[1].input_stream[1]: "z" is not declared by any output`,
		`spec.steps[0].outputs[1].commit.files[0]: Invalid value: "x": cycle`: `wf.json: IO_Graph[0].streaming[0].file_deps[0]: Invalid value: "x": cycle`,
		`spec.steps[0].outputs[1].commit.rule: bad`:                           `wf.json: IO_Graph[0].streaming[0].committed: bad`,
		`spec.steps[0].outputs[0].fire: bad`:                                  `wf.json: IO_Graph[0].output_stream[0]: bad`,
		`spec.steps[0].outputs[1]: bad`:                                       `wf.json: IO_Graph[0].output_stream[1]: bad`,
		`spec: bad`:                                                           `wf.json: bad`,
		`IO_Graph[0].streaming[0].n_files: ignored`:                           `wf.json: IO_Graph[0].streaming[0].n_files: ignored`,
		`no path here`: `wf.json: no path here`,
	} {
		if got := org.Message("wf.json", msg); got != want {
			t.Errorf("Message(%q) = %q, want %q", msg, got, want)
		}
	}
}
