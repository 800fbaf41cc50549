package validation

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	utilvalidation "k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/crds"
	"github.com/sluice-io/sluice/internal/capiocl"
	"github.com/sluice-io/sluice/internal/semantics"
)

// Format says what kind of document was loaded.
type Format string

const (
	// FormatWorkflow is a sluice.io/v1alpha1 Workflow in YAML or JSON.
	FormatWorkflow Format = "Workflow"
	// FormatCAPIOCL is a CAPIO-CL JSON document, converted to a Workflow.
	FormatCAPIOCL Format = "CAPIO-CL"
)

// Result is a loaded, defaulted and valid Workflow with its compiled rules.
type Result struct {
	Workflow *v1alpha1.Workflow // defaulted as the API server would
	Rules    *semantics.RuleSet // compiled file rules
	Format   Format             // what the document was
	// Warnings are legal but suspicious declarations, and what a CAPIO-CL import could
	// not carry over.
	Warnings []string
}

// Error lists every problem found in one document. Error() prints one line per problem:
// "FILE: FIELD.PATH: what is wrong".
type Error struct {
	File string          // the document's name
	Errs field.ErrorList // every problem, with its field path
}

func (e *Error) Error() string {
	lines := make([]string, len(e.Errs))
	for i, fe := range e.Errs {
		if fe.Field == "" || fe.Field == "<nil>" {
			// A problem with the document as a whole: no field path to name.
			lines[i] = e.File + ": " + fe.Detail
			continue
		}
		lines[i] = e.File + ": " + fe.Error()
	}
	return strings.Join(lines, "\n")
}

var workflowSchema = sync.OnceValues(func() (*Schema, error) {
	return NewSchema(crds.Workflow, v1alpha1.GroupVersion.Version)
})

// LoadFile reads and validates the Workflow YAML/JSON or CAPIO-CL JSON document at path
// (see Load).
func LoadFile(ctx context.Context, path string) (*Result, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading workflow: %w", err)
	}
	return Load(ctx, path, data)
}

// Load validates a document named file: a Workflow (YAML or JSON) or a CAPIO-CL JSON
// document, which is converted first. It returns a *Error listing every problem with its
// field path, or a *capiocl.ParseError for a malformed CAPIO-CL document.
func Load(ctx context.Context, file string, data []byte) (*Result, error) {
	trimmed := bytes.TrimSpace(data)
	if isCAPIOCL(trimmed) {
		doc, err := capiocl.Parse(file, trimmed)
		if err != nil {
			return nil, err
		}
		// What is said about the converted Workflow names the document's JSON paths.
		wf, warnings, origins := capiocl.ToWorkflowOrigins(doc)
		res, err := ValidateWorkflow(ctx, file, wf)
		if res != nil {
			res.Format = FormatCAPIOCL
			res.Warnings = origins.Messages(file, append(warnings, res.Warnings...))
		}
		var verr *Error
		if errors.As(err, &verr) {
			for i := range verr.Errs {
				verr.Errs[i].Field = origins.JSONPath(verr.Errs[i].Field)
			}
		}
		return res, err
	}
	if docs := splitYAML(data); len(docs) > 1 {
		return nil, &Error{File: file, Errs: field.ErrorList{field.Invalid(nil, field.OmitValueType{}, fmt.Sprintf("a file must hold exactly one Workflow document, found %d", len(docs)))}}
	}
	jsonData, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, &Error{File: file, Errs: field.ErrorList{field.Invalid(nil, field.OmitValueType{}, "not valid YAML: "+err.Error())}}
	}
	var obj map[string]any
	// utiljson keeps integers as int64, as the API server does (CEL rules need it).
	if err := utiljson.Unmarshal(jsonData, &obj); err != nil || obj == nil {
		return nil, &Error{File: file, Errs: field.ErrorList{field.Invalid(nil, field.OmitValueType{}, "a Workflow document must be a YAML or JSON object")}}
	}
	return validateObject(ctx, file, obj)
}

// ValidateWorkflow checks a typed Workflow (from an import, or an admission request) as
// Load checks a document. The returned Result holds a defaulted copy.
func ValidateWorkflow(ctx context.Context, file string, wf *v1alpha1.Workflow) (*Result, error) {
	raw, err := runtime.DefaultUnstructuredConverter.ToUnstructured(wf)
	if err != nil {
		return nil, fmt.Errorf("converting workflow %s: %w", wf.Name, err)
	}
	delete(raw, "status")
	if md, ok := raw["metadata"].(map[string]any); ok {
		delete(md, "creationTimestamp")
	}
	return validateObject(ctx, file, raw)
}

func validateObject(ctx context.Context, file string, obj map[string]any) (*Result, error) {
	// Every problem is reported at once: the checks below go on after one of them fails,
	// as far as each can, and a field that one check reported is not reported again by a
	// later one (the CRD's rules and semantics.Compile check some things twice).
	var errs field.ErrorList
	if av, _ := obj["apiVersion"].(string); av != v1alpha1.GroupVersion.String() {
		errs = append(errs, field.Invalid(field.NewPath("apiVersion"), obj["apiVersion"], "must be "+v1alpha1.GroupVersion.String()))
	}
	if k, _ := obj["kind"].(string); k != "Workflow" {
		errs = append(errs, field.Invalid(field.NewPath("kind"), obj["kind"], "must be Workflow"))
	}
	md, _ := obj["metadata"].(map[string]any)
	name, _ := md["name"].(string)
	if name == "" {
		errs = append(errs, field.Required(field.NewPath("metadata", "name"), "a Workflow needs a name"))
	} else {
		for _, msg := range utilvalidation.IsDNS1123Subdomain(name) {
			errs = append(errs, field.Invalid(field.NewPath("metadata", "name"), name, msg))
		}
	}
	schema, err := workflowSchema()
	if err != nil {
		return nil, fmt.Errorf("loading the embedded Workflow CRD: %w", err)
	}
	errs = append(errs, readableTypeErrors(obj, schema.Validate(ctx, obj))...)
	terrs, badTemplates := strictTemplates(obj)
	errs = append(errs, terrs...)
	// The typed Workflow is decoded even from an object with errors (without the templates
	// that did not decode, and with what does not fit left zero), so that the rules are
	// checked too.
	for _, i := range badTemplates {
		obj["spec"].(map[string]any)["steps"].([]any)[i].(map[string]any)["template"] = nil
	}
	data, err := json.Marshal(obj)
	if err != nil {
		return nil, fmt.Errorf("re-encoding %s: %w", file, err)
	}
	var wf v1alpha1.Workflow
	if err := json.Unmarshal(data, &wf); err != nil && len(errs) == 0 {
		errs = append(errs, field.Invalid(nil, field.OmitValueType{}, err.Error()))
	}
	errs = append(errs, withoutFields(checkPaths(&wf.Spec), errs)...)
	rs, cerrs, warnings := semantics.Compile(&wf.Spec)
	errs = append(errs, withoutFields(cerrs, errs)...)
	if len(errs) > 0 {
		return nil, &Error{File: file, Errs: errs}
	}
	return &Result{Workflow: &wf, Rules: rs, Format: FormatWorkflow, Warnings: warnings}, nil
}

// strictTemplates decodes each step's pod template strictly: the CRD keeps templates
// schemaless (a full PodTemplateSpec schema makes the CRD too large for client-side
// apply), so a misspelt container field would otherwise pass unnoticed. It returns the
// problems and the indexes of the steps whose template did not decode.
func strictTemplates(obj map[string]any) (field.ErrorList, []int) {
	var errs field.ErrorList
	var bad []int
	spec, _ := obj["spec"].(map[string]any)
	steps, _ := spec["steps"].([]any)
	for i, s := range steps {
		step, _ := s.(map[string]any)
		tmpl, ok := step["template"]
		if !ok || tmpl == nil {
			continue
		}
		data, _ := json.Marshal(tmpl)
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		var pt corev1.PodTemplateSpec
		if err := dec.Decode(&pt); err != nil {
			errs = append(errs, templateError(field.NewPath("spec", "steps").Index(i).Child("template"), tmpl, err))
			bad = append(bad, i)
		}
	}
	return errs, bad
}

// templateError describes a template's decoding error at the field it is about: a value
// of the wrong type is named by its full path (spec.steps[0].template.spec.containers[0].command[0]).
func templateError(tp *field.Path, tmpl any, err error) *field.Error {
	var ute *json.UnmarshalTypeError
	if errors.As(err, &ute) {
		got := jsonKind(ute.Value)
		want := goKind(ute.Type)
		if fp, v, ok := locate(tp, tmpl, strings.Split(ute.Field, "."), got); ok {
			return field.Invalid(fp, v, typeMessage(want, got))
		}
		return field.Invalid(tp.Child(ute.Field), field.OmitValueType{}, typeMessage(want, got))
	}
	return field.Invalid(tp, field.OmitValueType{}, strings.TrimPrefix(err.Error(), "json: "))
}

// isCAPIOCL reports whether a document is CAPIO-CL JSON: a JSON object without apiVersion.
func isCAPIOCL(data []byte) bool {
	if len(data) == 0 || data[0] != '{' {
		return false
	}
	var probe struct {
		APIVersion *string         `json:"apiVersion"`
		IOGraph    json.RawMessage `json:"IO_Graph"`
	}
	if err := json.Unmarshal(data, &probe); err != nil {
		return true // let the CAPIO-CL parser report the JSON error
	}
	return probe.APIVersion == nil
}

// splitYAML returns the non-empty documents of a YAML stream.
func splitYAML(data []byte) []string {
	var docs []string
	for _, d := range strings.Split("\n"+string(data), "\n---") {
		if strings.TrimSpace(stripComments(d)) != "" {
			docs = append(docs, d)
		}
	}
	return docs
}

func stripComments(s string) string {
	var b strings.Builder
	for _, line := range strings.Split(s, "\n") {
		if t := strings.TrimSpace(line); t != "" && !strings.HasPrefix(t, "#") {
			b.WriteString(line)
			b.WriteByte('\n')
		}
	}
	return b.String()
}
