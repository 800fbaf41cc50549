package validation

import (
	"reflect"
	"regexp"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// schemaTypeError matches the OpenAPI validator's message for a value of the wrong type:
// `spec.steps[0].outputs[0].path in body must be of type string: "boolean"`.
var schemaTypeError = regexp.MustCompile(`in body must be of type (\w+): "(\w+)"$`)

// readableTypeErrors rewrites the schema's type errors, which show the type's name as the
// value (Invalid value: "boolean"), to show the value and say what was expected, with a
// hint for YAML's unquoted booleans and numbers. Other errors are kept as they are.
func readableTypeErrors(obj map[string]any, errs field.ErrorList) field.ErrorList {
	for _, e := range errs {
		if e.Type != field.ErrorTypeInvalid && e.Type != field.ErrorTypeTypeInvalid {
			continue
		}
		m := schemaTypeError.FindStringSubmatch(e.Detail)
		if m == nil {
			continue
		}
		e.Detail = typeMessage(m[1], m[2])
		if v, ok := valueAt(obj, e.Field); ok {
			e.BadValue = v
		} else {
			e.BadValue = field.OmitValueType{}
		}
	}
	return errs
}

// typeMessage says that a value of JSON type got was found where one of type want belongs.
func typeMessage(want, got string) string {
	msg := "must be " + article(want) + ", not " + article(got)
	if want == "string" {
		switch got {
		case "boolean":
			msg += ` (YAML reads an unquoted yes, no, on, off, true or false as a boolean: quote it, e.g. "yes")`
		case "integer", "number":
			msg += ` (quote it, e.g. "10")`
		}
	}
	return msg
}

func article(kind string) string {
	switch kind {
	case "array", "integer", "object":
		return "an " + kind
	case "":
		return "a value of another type"
	}
	return "a " + kind
}

// jsonKind names the JSON type encoding/json reports in an UnmarshalTypeError's Value
// ("bool", "number", "number 1.5", "string", "array", "object") as the schema does.
func jsonKind(v string) string {
	v, _, _ = strings.Cut(v, " ")
	switch v {
	case "bool":
		return "boolean"
	case "number", "string", "array", "object":
		return v
	}
	return ""
}

// goKind names the JSON type a Go type decodes from.
func goKind(t reflect.Type) string {
	if t == nil {
		return ""
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "integer"
	case reflect.Float32, reflect.Float64:
		return "number"
	case reflect.Slice, reflect.Array:
		return "array"
	case reflect.Map, reflect.Struct:
		return "object"
	}
	return ""
}

// kindOf names the JSON type of a decoded JSON value.
func kindOf(v any) string {
	switch v.(type) {
	case bool:
		return "boolean"
	case string:
		return "string"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	case nil:
		return "null"
	}
	return "number"
}

// locate finds, below v at fp, the first value of JSON type kind along the dotted field
// names of keys (as encoding/json reports them: no list indexes), descending into every
// element of a list, and returns its full path and value.
func locate(fp *field.Path, v any, keys []string, kind string) (*field.Path, any, bool) {
	if len(keys) > 0 && keys[0] == "" {
		keys = keys[1:]
	}
	if len(keys) == 0 && kindOf(v) == kind {
		return fp, v, true
	}
	if list, ok := v.([]any); ok {
		for i, e := range list {
			if p, x, ok := locate(fp.Index(i), e, keys, kind); ok {
				return p, x, true
			}
		}
		return nil, nil, false
	}
	if len(keys) == 0 {
		return nil, nil, false
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, nil, false
	}
	child, ok := m[keys[0]]
	if !ok {
		return nil, nil, false
	}
	return locate(fp.Child(keys[0]), child, keys[1:], kind)
}

// valueAt returns the value of obj at a field path as field.Path prints it
// (spec.steps[0].outputs[1].path).
func valueAt(obj map[string]any, path string) (any, bool) {
	var v any = obj
	for _, part := range strings.Split(path, ".") {
		name, rest, _ := strings.Cut(part, "[")
		if name != "" {
			m, ok := v.(map[string]any)
			if !ok {
				return nil, false
			}
			if v, ok = m[name]; !ok {
				return nil, false
			}
		}
		for rest != "" {
			idx, after, ok := strings.Cut(rest, "]")
			if !ok {
				return nil, false
			}
			i, err := strconv.Atoi(idx)
			list, isList := v.([]any)
			if err != nil || !isList || i < 0 || i >= len(list) {
				return nil, false
			}
			v = list[i]
			rest = strings.TrimPrefix(after, "[")
		}
	}
	return v, true
}
