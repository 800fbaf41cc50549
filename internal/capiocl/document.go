// Package capiocl reads and writes CAPIO-CL, the reference language for the commit and
// firing rules of file-based workflows (versions 1.0 and 1.1), and converts it to and from
// a Sluice Workflow.
//
// Parse checks a document against the language's JSON schema (embedded from schema/) and a
// few rules the schema cannot express, and reports every problem with the JSON path of the
// offending value. ToWorkflow and FromWorkflow convert without loss for everything both
// sides can express; what one side cannot express is reported as a warning, never dropped
// silently.
package capiocl

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// Versions of the language this package reads and writes.
const (
	// Version10 is CAPIO-CL 1.0: no "version" or "configuration" key.
	Version10 = "1.0"
	// Version11 is CAPIO-CL 1.1: "version" is required.
	Version11 = "1.1"
)

// Document is a CAPIO-CL configuration. Field names and JSON keys follow the language.
type Document struct {
	// Version is the language version (1.1); absent in 1.0 documents.
	Version *float64 `json:"version,omitempty"`
	// Configuration is the path of a TOML file with runtime parameters (1.1).
	Configuration string `json:"configuration,omitempty"`
	// Name identifies the workflow.
	Name string `json:"name"`
	// Aliases name groups of files.
	Aliases []Alias `json:"aliases,omitempty"`
	// IOGraph lists the workflow's steps ("application modules") and their files.
	IOGraph []Step `json:"IO_Graph"`
	// Permanent lists the files kept after the workflow.
	Permanent []string `json:"permanent,omitempty"`
	// Exclude lists the files no rule applies to.
	Exclude []string `json:"exclude,omitempty"`
	// HomeNodePolicies says which node holds which files.
	HomeNodePolicies *HomeNodePolicies `json:"home_node_policies,omitempty"`
	// Storage assigns files to memory or the file system.
	Storage *Storage `json:"storage,omitempty"`
}

// Alias is a named group of files.
type Alias struct {
	GroupName string   `json:"group_name"` // the alias
	Files     []string `json:"files"`      // the files it stands for
}

// Step is one application module of the IO graph.
type Step struct {
	Name         string          `json:"name"`                // the module's name
	InputStream  []string        `json:"input_stream"`        // files it reads
	OutputStream []string        `json:"output_stream"`       // files it writes
	Streaming    []StreamingRule `json:"streaming,omitempty"` // rules of files
}

// StreamingRule gives the commit rule ("committed") and firing rule ("mode") of files
// ("name") or directories ("dirname").
type StreamingRule struct {
	Name      []string `json:"name,omitempty"`      // files the rule applies to
	Dirname   []string `json:"dirname,omitempty"`   // directories the rule applies to
	Committed string   `json:"committed,omitempty"` // on_termination, on_close[:N], on_file, on_n_files
	Mode      string   `json:"mode,omitempty"`      // update or no_update
	FileDeps  []string `json:"file_deps,omitempty"` // files on_file waits for
	NFiles    *int64   `json:"n_files,omitempty"`   // entries on_n_files waits for
}

// HomeNodePolicies lists files per home-node policy.
type HomeNodePolicies struct {
	Create  []string       `json:"create,omitempty"`  // held by the node that creates them
	Hashing []string       `json:"hashing,omitempty"` // spread by a hash of the path
	Manual  []ManualPolicy `json:"manual,omitempty"`  // pinned to a module's node
}

// ManualPolicy pins files to the node running an application module.
type ManualPolicy struct {
	Name    []string `json:"name"`     // the files pinned
	AppNode string   `json:"app_node"` // the module whose node holds them
}

// Storage assigns files to storage tiers.
type Storage struct {
	Memory []string `json:"memory,omitempty"` // files kept in memory
	FS     []string `json:"fs,omitempty"`     // files kept on the file system
}

// Problem is one thing wrong with a document: Path is the JSON path of the offending value
// (e.g. IO_Graph[0].streaming[1].committed, "" for the document itself).
type Problem struct {
	Path    string // JSON path of the offending value, "" for the document
	Message string // what is wrong
}

func (p Problem) String() string {
	if p.Path == "" {
		return p.Message
	}
	return p.Path + ": " + p.Message
}

// ParseError lists every problem found in a document.
type ParseError struct {
	// File names the document, as given to Parse.
	File string
	// Problems lists every problem, each with its JSON path.
	Problems []Problem
}

func (e *ParseError) Error() string {
	var b strings.Builder
	for i, p := range e.Problems {
		if i > 0 {
			b.WriteByte('\n')
		}
		fmt.Fprintf(&b, "%s: %s", e.File, p)
	}
	return b.String()
}

//go:embed schema/v1.json schema/v1.1.json
var schemaFS embed.FS

var schemas = map[string]*jsonschema.Schema{}

func init() {
	c := jsonschema.NewCompiler()
	for v, f := range map[string]string{Version10: "schema/v1.json", Version11: "schema/v1.1.json"} {
		data, err := schemaFS.ReadFile(f)
		if err != nil {
			panic(err)
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
		if err != nil {
			panic(fmt.Sprintf("embedded %s: %v", f, err))
		}
		url := "capio-cl-" + v + ".json"
		if err := c.AddResource(url, doc); err != nil {
			panic(err)
		}
		schemas[v] = c.MustCompile(url)
	}
}

var onClosePattern = regexp.MustCompile(`^on_close(?::([0-9]+))?$`)

// Parse decodes a CAPIO-CL document. file names it in errors. A document with a "version"
// key is checked against the 1.1 schema (and its version must be 1.0 or 1.1), one without
// against the 1.0 schema. It returns a *ParseError listing every problem with its JSON path.
func Parse(file string, data []byte) (*Document, error) {
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		return nil, &ParseError{File: file, Problems: []Problem{{Message: "not valid JSON: " + err.Error()}}}
	}
	obj, ok := inst.(map[string]any)
	if !ok {
		return nil, &ParseError{File: file, Problems: []Problem{{Message: "a CAPIO-CL document must be a JSON object"}}}
	}
	version := Version10
	if _, has := obj["version"]; has {
		version = Version11
	}
	if err := schemas[version].Validate(inst); err != nil {
		var ve *jsonschema.ValidationError
		if errors.As(err, &ve) {
			return nil, &ParseError{File: file, Problems: schemaProblems(ve)}
		}
		return nil, &ParseError{File: file, Problems: []Problem{{Message: err.Error()}}}
	}
	var doc Document
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&doc); err != nil {
		return nil, &ParseError{File: file, Problems: []Problem{{Message: err.Error()}}}
	}
	if probs := semanticProblems(&doc); len(probs) > 0 {
		return nil, &ParseError{File: file, Problems: probs}
	}
	return &doc, nil
}

// schemaProblems flattens a schema validation error into its leaf problems.
func schemaProblems(ve *jsonschema.ValidationError) []Problem {
	p := message.NewPrinter(language.English)
	seen := map[string]bool{}
	var out []Problem
	var walk func(e *jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		causes := e.Causes
		switch e.ErrorKind.(type) {
		case *kind.OneOf, *kind.AnyOf:
			causes = closestBranches(causes)
		}
		if len(causes) == 0 {
			pr := Problem{Path: jsonPath(e.InstanceLocation), Message: e.ErrorKind.LocalizedString(p)}
			if !seen[pr.String()] {
				seen[pr.String()] = true
				out = append(out, pr)
			}
			return
		}
		for _, c := range causes {
			walk(c)
		}
	}
	walk(ve)
	sort.SliceStable(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

// closestBranches keeps, of the failed branches of a oneOf/anyOf, those the value came
// closest to: the fewest missing or unexpected properties. A "dirname" rule with a bad
// "committed" is then reported against the dirname branch only.
func closestBranches(branches []*jsonschema.ValidationError) []*jsonschema.ValidationError {
	best, bestScore := []*jsonschema.ValidationError(nil), -1
	for _, b := range branches {
		score := structuralMisfits(b)
		switch {
		case bestScore < 0 || score < bestScore:
			best, bestScore = []*jsonschema.ValidationError{b}, score
		case score == bestScore:
			best = append(best, b)
		}
	}
	return best
}

func structuralMisfits(e *jsonschema.ValidationError) int {
	n := 0
	switch e.ErrorKind.(type) {
	case *kind.Required, *kind.AdditionalProperties:
		n++
	}
	for _, c := range e.Causes {
		n += structuralMisfits(c)
	}
	return n
}

// jsonPath renders instance location tokens as a JSON path: IO_Graph[0].name.
func jsonPath(tokens []string) string {
	var b strings.Builder
	for _, t := range tokens {
		if _, err := strconv.Atoi(t); err == nil {
			b.WriteString("[" + t + "]")
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(t)
	}
	return b.String()
}

// semanticProblems checks what the schema cannot: the version number, counts that must be
// positive, and n_files where on_n_files needs it.
func semanticProblems(doc *Document) []Problem {
	var out []Problem
	if doc.Version != nil && *doc.Version != 1.0 && *doc.Version != 1.1 {
		out = append(out, Problem{"version", fmt.Sprintf("unsupported CAPIO-CL version %v; Sluice reads 1.0 and 1.1", *doc.Version)})
	}
	if strings.TrimSpace(doc.Name) == "" {
		out = append(out, Problem{"name", "must not be empty"})
	}
	for i, st := range doc.IOGraph {
		sp := fmt.Sprintf("IO_Graph[%d]", i)
		if strings.TrimSpace(st.Name) == "" {
			out = append(out, Problem{sp + ".name", "must not be empty"})
		}
		for j, r := range st.Streaming {
			rp := fmt.Sprintf("%s.streaming[%d]", sp, j)
			if m := onClosePattern.FindStringSubmatch(r.Committed); m != nil && m[1] != "" {
				if n, err := strconv.Atoi(m[1]); err != nil || n < 1 {
					out = append(out, Problem{rp + ".committed", fmt.Sprintf("%q: the number of closes must be at least 1", r.Committed)})
				}
			}
			if r.Committed == "on_file" && len(r.FileDeps) == 0 {
				out = append(out, Problem{rp + ".file_deps", "on_file needs at least one file"})
			}
			if r.NFiles != nil && *r.NFiles < 1 {
				out = append(out, Problem{rp + ".n_files", "must be at least 1"})
			}
			if len(r.Name)+len(r.Dirname) == 0 {
				out = append(out, Problem{rp, "names no file or directory"})
			}
		}
	}
	return out
}

// Marshal encodes doc as indented JSON, as version says ("1.0" drops version and
// configuration).
func Marshal(doc *Document) ([]byte, error) {
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encoding CAPIO-CL: %w", err)
	}
	return append(b, '\n'), nil
}
