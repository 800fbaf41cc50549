package validation

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	utilvalidation "k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	k8sjson "sigs.k8s.io/json"
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
	// Case-sensitive, as the API server decodes: a misspelt key is never applied.
	if err := k8sjson.UnmarshalCaseSensitivePreserveInts(data, &wf); err != nil && len(errs) == 0 {
		errs = append(errs, field.Invalid(nil, field.OmitValueType{}, err.Error()))
	}
	errs = append(errs, withoutFields(checkPaths(&wf.Spec), errs)...)
	rs, cerrs, warnings := semantics.Compile(ctx, &wf.Spec)
	errs = append(errs, withoutFields(cerrs, errs)...)
	if len(errs) > 0 {
		return nil, &Error{File: file, Errs: errs}
	}
	return &Result{Workflow: &wf, Rules: rs, Format: FormatWorkflow, Warnings: warnings}, nil
}

// TemplateErrors returns what is wrong with the steps' pod templates of a Workflow object
// as the API server holds it (unstructured: the CRD keeps templates schemaless, so a
// typed Workflow has dropped what did not decode): each unknown, misspelt or duplicate
// field and each value of the wrong type, at its full path
// (spec.steps[0].template.spec.containers[0].workingdir). The controller reports them
// as an invalid spec, as `sluice validate` does. On a cluster a template may not share
// its pod's process namespace either (the sidecar holds the workflow's credentials):
// that is refused too.
func TemplateErrors(obj map[string]any) field.ErrorList {
	errs, _ := strictTemplates(obj)
	spec, _ := obj["spec"].(map[string]any)
	steps, _ := spec["steps"].([]any)
	for i, s := range steps {
		step, _ := s.(map[string]any)
		tmpl, _ := step["template"].(map[string]any)
		pod, _ := tmpl["spec"].(map[string]any)
		if share, _ := pod["shareProcessNamespace"].(bool); share {
			errs = append(errs, field.Forbidden(field.NewPath("spec", "steps").Index(i).Child("template", "spec", "shareProcessNamespace"),
				"a pod with Sluice's sidecar does not share its process namespace (the sidecar holds the workflow's credentials)"))
		}
	}
	return errs
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
		tp := field.NewPath("spec", "steps").Index(i).Child("template")
		var pt corev1.PodTemplateSpec
		// As the API server decodes a Pod: field names match case-sensitively (encoding/json
		// would apply "Command" as command), unknown and duplicate fields are errors.
		strict, err := k8sjson.UnmarshalStrict(data, &pt)
		if err != nil {
			errs = append(errs, templateError(tp, tmpl, err))
			bad = append(bad, i)
			continue
		}
		for _, serr := range strict {
			errs = append(errs, strictFieldError(tp, serr))
		}
		if len(strict) > 0 {
			bad = append(bad, i)
		}
	}
	return errs, bad
}

// strictFieldError describes an unknown or duplicate field of a template at its full path
// (spec.steps[0].template.spec.containers[0].workingdir), suggesting the field name it
// differs from only in case, if there is one.
func strictFieldError(tp *field.Path, err error) *field.Error {
	var fe k8sjson.FieldError
	if !errors.As(err, &fe) {
		return field.Invalid(tp, field.OmitValueType{}, err.Error())
	}
	path := fe.FieldPath()
	fp := tp
	for _, part := range strings.Split(path, ".") {
		name, rest, _ := strings.Cut(part, "[")
		fp = fp.Child(name)
		for rest != "" {
			idx, after, _ := strings.Cut(rest, "]")
			n, convErr := strconv.Atoi(idx)
			if convErr != nil {
				break
			}
			fp = fp.Index(n)
			rest = strings.TrimPrefix(after, "[")
		}
	}
	msg := strings.TrimPrefix(err.Error(), "json: ")
	msg = strings.Replace(msg, fmt.Sprintf(" %q", path), "", 1)
	last := path
	if i := strings.LastIndexByte(last, '.'); i >= 0 {
		last = last[i+1:]
	}
	if name, _, _ := strings.Cut(last, "["); name != "" {
		if known, ok := podFieldNames()[strings.ToLower(name)]; ok && known != name {
			msg += fmt.Sprintf(" (field names are case-sensitive: did you mean %q?)", known)
		}
	}
	return field.Invalid(fp, field.OmitValueType{}, msg)
}

// podFieldNames maps the lower-cased JSON names of every field of a PodTemplateSpec and
// the types it holds to their spelling, for strictFieldError's suggestions.
var podFieldNames = sync.OnceValue(func() map[string]string {
	names := map[string]string{}
	seen := map[reflect.Type]bool{}
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Map || t.Kind() == reflect.Array {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct || seen[t] {
			return
		}
		seen[t] = true
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name != "" && name != "-" {
				if _, ok := names[strings.ToLower(name)]; !ok {
					names[strings.ToLower(name)] = name
				}
			}
			walk(f.Type)
		}
	}
	walk(reflect.TypeOf(corev1.PodTemplateSpec{}))
	return names
})

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
