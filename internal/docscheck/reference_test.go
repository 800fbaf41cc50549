package docscheck

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	v1alpha1 "github.com/sluice-io/sluice/api/v1alpha1"
)

// referenceSections are the sections of docs/workflow-reference.md ("## spec", ...) and
// the type each one lists the fields of; the types of nested fields are described in the
// section of the field that holds them, except these.
var referenceSections = []struct {
	heading string
	typ     reflect.Type
}{
	{"spec", reflect.TypeFor[v1alpha1.WorkflowSpec]()},
	{"steps[]", reflect.TypeFor[v1alpha1.Step]()},
	{"outputs[]", reflect.TypeFor[v1alpha1.Output]()},
	{"status", reflect.TypeFor[v1alpha1.WorkflowStatus]()},
}

var codeSpanRE = regexp.MustCompile("`([^`\n]+)`")

// docs/workflow-reference.md names every field of the Workflow types: each field of a
// section's type starts a row of its table (`volume.mountPath` counts for volume), and
// each field of a nested type of this package is named in code in the section.
func TestWorkflowReferenceNamesEveryField(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "docs", "workflow-reference.md"))
	if err != nil {
		t.Fatal(err)
	}
	sections := map[string]string{}
	for _, s := range strings.Split(string(b), "\n## ")[1:] {
		heading, text, _ := strings.Cut(s, "\n")
		sections[strings.TrimSpace(heading)] = text
	}
	own := map[reflect.Type]bool{}
	for _, s := range referenceSections {
		own[s.typ] = true
	}
	apiPkg := reflect.TypeFor[v1alpha1.Workflow]().PkgPath()
	fields := 0
	for _, s := range referenceSections {
		text, ok := sections[s.heading]
		if !ok {
			t.Errorf("docs/workflow-reference.md has no section \"## %s\"", s.heading)
			continue
		}
		rows := map[string]bool{}  // the first words of the first cells
		named := map[string]bool{} // every word in code in the section
		for _, line := range strings.Split(text, "\n") {
			if cells := strings.Split(line, "|"); len(cells) > 2 {
				if m := codeSpanRE.FindStringSubmatch(cells[1]); m != nil {
					rows[regexp.MustCompile(`^[A-Za-z0-9]+`).FindString(m[1])] = true
				}
			}
		}
		for _, m := range codeSpanRE.FindAllStringSubmatch(text, -1) {
			for _, w := range regexp.MustCompile(`[A-Za-z0-9]+`).FindAllString(m[1], -1) {
				named[w] = true
			}
		}
		var walk func(typ reflect.Type, path string, top bool)
		walk = func(typ reflect.Type, path string, top bool) {
			for i := range typ.NumField() {
				f := typ.Field(i)
				name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
				if name == "" || name == "-" {
					continue
				}
				fields++
				full := path + name
				switch {
				case top && !rows[name]:
					t.Errorf("docs/workflow-reference.md, ## %s: no row for the field %s (%s.%s)", s.heading, full, typ.Name(), f.Name)
				case !top && !named[name]:
					t.Errorf("docs/workflow-reference.md, ## %s: the field %s (%s.%s) is not named", s.heading, full, typ.Name(), f.Name)
				}
				ft := f.Type
				for ft.Kind() == reflect.Pointer || ft.Kind() == reflect.Slice {
					if ft.Kind() == reflect.Slice {
						full += "[]"
					}
					ft = ft.Elem()
				}
				if ft.Kind() == reflect.Struct && ft.PkgPath() == apiPkg && !own[ft] {
					walk(ft, full+".", false)
				}
			}
		}
		walk(s.typ, "", true)
	}
	if fields < 60 {
		t.Errorf("%d fields seen; the walk misses the Workflow types' fields", fields)
	}
}
