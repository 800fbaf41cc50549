package capiocl

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/sluice-io/sluice/api/v1alpha1"
)

// ToWorkflow converts a parsed CAPIO-CL document into a Workflow:
//   - IO_Graph steps become steps (one replica, no pod template: supply one, or let
//     external pods join by label); input_stream becomes inputs;
//   - every output_stream name becomes an output carrying the streaming rule that names
//     it (CAPIO-CL rules are per file: a rule in any step applies); a streaming rule for a
//     member of an alias or a file inside a directory the step lists in output_stream
//     becomes an output of that step too, refining the group's rule; a streaming rule for
//     any other name no step outputs becomes an output of the step that declares it, with
//     a warning, since in Sluice only declared outputs may be written;
//   - committed/mode map to commit/fire (on_close:N to OnClose count N, on_n_files with
//     n_files to OnNFiles), dirname rules to type Directory;
//   - aliases, permanent, exclude, home_node_policies and storage map to the fields of the
//     same meaning; name, version and configuration are kept in annotations when a field
//     cannot hold them;
//   - absolute file names ("/tmp/file", as CAPIO-CL documents often write them) become
//     relative to the volume root ("tmp/file"): a Workflow names files relative to the
//     volume and refuses absolute names.
func ToWorkflow(doc *Document) (*v1alpha1.Workflow, []string) {
	doc = volumeRelative(doc)
	var warnings []string
	wf := &v1alpha1.Workflow{
		TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "Workflow"},
	}
	wf.Name = kubeName(doc.Name)
	ann := map[string]string{}
	if wf.Name != doc.Name {
		ann[v1alpha1.AnnotationCAPIOName] = doc.Name
	}
	if doc.Version != nil {
		ann[v1alpha1.AnnotationCAPIOVersion] = strconv.FormatFloat(*doc.Version, 'f', -1, 64)
	}
	if doc.Configuration != "" {
		ann[v1alpha1.AnnotationCAPIOConfiguration] = doc.Configuration
	}
	if len(ann) > 0 {
		wf.Annotations = ann
	}
	spec := &wf.Spec
	for _, a := range doc.Aliases {
		spec.Aliases = append(spec.Aliases, v1alpha1.Alias{Name: a.GroupName, Files: a.Files})
	}

	// Rules are per file: collect them all first, remembering who declared them.
	type declared struct {
		out  v1alpha1.Output
		step int
		used bool
	}
	rules := map[string]*declared{}
	var order []string
	for i, st := range doc.IOGraph {
		for j, r := range st.Streaming {
			out, w := ruleToOutput(r, fmt.Sprintf("IO_Graph[%d].streaming[%d]", i, j))
			warnings = append(warnings, w...)
			names := r.Name
			if len(r.Dirname) > 0 {
				names = r.Dirname
			}
			for _, n := range names {
				o := out
				o.Path = n
				if prev, dup := rules[n]; dup {
					if equality.Semantic.DeepEqual(prev.out, o) {
						continue
					}
					warnings = append(warnings, fmt.Sprintf("IO_Graph[%d].streaming[%d]: %q has a rule already; the first one is kept", i, j, n))
					continue
				}
				rules[n] = &declared{out: o, step: i}
				order = append(order, n)
			}
		}
	}
	aliases := map[string][]string{}
	for _, a := range doc.Aliases {
		aliases[a.GroupName] = a.Files
	}
	for _, st := range doc.IOGraph {
		for _, n := range st.OutputStream {
			if d, ok := rules[n]; ok {
				d.used = true
			}
		}
	}
	// A rule for a member of an alias, or for a file inside a directory, that the declaring
	// step lists in output_stream refines that entry's rule (CAPIO-CL's own way to give the
	// members of a group rules of their own): it follows the entry in the step's outputs.
	members := map[int]map[string][]v1alpha1.Output{} // step -> entry -> member outputs
	for _, n := range order {
		d := rules[n]
		if d.used {
			continue
		}
		if e, ok := memberOf(n, doc.IOGraph[d.step].OutputStream, aliases); ok {
			if members[d.step] == nil {
				members[d.step] = map[string][]v1alpha1.Output{}
			}
			members[d.step][e] = append(members[d.step][e], d.out)
			d.used = true
		}
	}
	for i, st := range doc.IOGraph {
		step := v1alpha1.Step{Name: st.Name, Inputs: st.InputStream}
		for _, n := range st.OutputStream {
			o := v1alpha1.Output{Path: n}
			if d, ok := rules[n]; ok {
				o = d.out
			}
			step.Outputs = append(step.Outputs, o)
			step.Outputs = append(step.Outputs, members[i][n]...)
		}
		spec.Steps = append(spec.Steps, step)
	}
	for _, n := range order {
		d := rules[n]
		if d.used {
			continue
		}
		warnings = append(warnings, fmt.Sprintf("IO_Graph[%d]: the streaming rule for %q names no output_stream entry; it becomes an output of step %q", d.step, n, doc.IOGraph[d.step].Name))
		spec.Steps[d.step].Outputs = append(spec.Steps[d.step].Outputs, d.out)
	}
	spec.Permanent = doc.Permanent
	spec.Exclude = doc.Exclude
	if hp := doc.HomeNodePolicies; hp != nil && (len(hp.Create)+len(hp.Hashing)+len(hp.Manual) > 0) {
		hn := &v1alpha1.HomeNodeSpec{Create: hp.Create, Hashing: hp.Hashing}
		for _, m := range hp.Manual {
			hn.Manual = append(hn.Manual, v1alpha1.ManualHomeNode{Files: m.Name, Step: m.AppNode})
		}
		spec.HomeNode = hn
	}
	if s := doc.Storage; s != nil && len(s.Memory)+len(s.FS) > 0 {
		spec.Tiers = &v1alpha1.TierSpec{Memory: s.Memory, FS: s.FS}
	}
	return wf, warnings
}

// volumeRelative returns a copy of doc whose file names are relative to the volume root:
// a leading "/" means the volume root (docs/semantics.md), and a Workflow writes no "/".
func volumeRelative(doc *Document) *Document {
	rel := func(names []string) []string {
		if names == nil {
			return nil
		}
		out := make([]string, len(names))
		for i, n := range names {
			out[i] = n
			if strings.HasPrefix(n, "/") {
				if out[i] = strings.TrimLeft(n, "/"); out[i] == "" {
					out[i] = "."
				}
			}
		}
		return out
	}
	d := *doc
	d.Aliases = nil
	for _, a := range doc.Aliases {
		d.Aliases = append(d.Aliases, Alias{GroupName: a.GroupName, Files: rel(a.Files)})
	}
	d.IOGraph = nil
	for _, st := range doc.IOGraph {
		s := Step{Name: st.Name, InputStream: rel(st.InputStream), OutputStream: rel(st.OutputStream)}
		for _, r := range st.Streaming {
			r.Name, r.Dirname, r.FileDeps = rel(r.Name), rel(r.Dirname), rel(r.FileDeps)
			s.Streaming = append(s.Streaming, r)
		}
		d.IOGraph = append(d.IOGraph, s)
	}
	d.Permanent, d.Exclude = rel(doc.Permanent), rel(doc.Exclude)
	if hp := doc.HomeNodePolicies; hp != nil {
		h := &HomeNodePolicies{Create: rel(hp.Create), Hashing: rel(hp.Hashing)}
		for _, m := range hp.Manual {
			h.Manual = append(h.Manual, ManualPolicy{Name: rel(m.Name), AppNode: m.AppNode})
		}
		d.HomeNodePolicies = h
	}
	if s := doc.Storage; s != nil {
		d.Storage = &Storage{Memory: rel(s.Memory), FS: rel(s.FS)}
	}
	return &d
}

// memberOf returns the entry of entries that name belongs to: an alias naming it, or a
// directory it lies inside (an entry that is a path prefix of it).
func memberOf(name string, entries []string, aliases map[string][]string) (string, bool) {
	for _, e := range entries {
		if slices.Contains(aliases[e], name) || strings.HasPrefix(name, strings.TrimSuffix(e, "/")+"/") {
			return e, true
		}
	}
	return "", false
}

// ruleToOutput maps one streaming rule (its names aside) to an Output.
func ruleToOutput(r StreamingRule, at string) (v1alpha1.Output, []string) {
	var warnings []string
	var o v1alpha1.Output
	if len(r.Dirname) > 0 {
		o.Type = v1alpha1.FileTypeDirectory
	}
	switch r.Committed {
	case "":
	case "on_termination":
		o.Commit.Rule = v1alpha1.CommitOnTermination
	case "on_file":
		o.Commit.Rule = v1alpha1.CommitOnFile
		o.Commit.Files = r.FileDeps
	case "on_n_files":
		o.Commit.Rule = v1alpha1.CommitOnNFiles
	default:
		if m := onClosePattern.FindStringSubmatch(r.Committed); m != nil {
			o.Commit.Rule = v1alpha1.CommitOnClose
			if m[1] != "" {
				n, _ := strconv.Atoi(m[1]) // Parse checked it
				o.Commit.Count = int32Ptr(int32(n))
			}
		}
	}
	if r.NFiles != nil {
		switch {
		case o.Commit.Rule == v1alpha1.CommitOnNFiles || o.Commit.Rule == "" && o.Type == v1alpha1.FileTypeDirectory:
			o.Commit.Rule = v1alpha1.CommitOnNFiles
			o.Commit.Count = int32Ptr(int32(*r.NFiles))
		default:
			warnings = append(warnings, fmt.Sprintf("%s.n_files: ignored: it applies to directories with committed on_n_files", at))
		}
	}
	switch r.Mode {
	case "update":
		o.Fire = v1alpha1.FireUpdate
	case "no_update":
		o.Fire = v1alpha1.FireNoUpdate
	}
	if len(r.FileDeps) > 0 && o.Commit.Rule != v1alpha1.CommitOnFile {
		warnings = append(warnings, fmt.Sprintf("%s.file_deps: ignored: it applies to committed on_file", at))
	}
	return o, warnings
}

func int32Ptr(v int32) *int32 { return &v }

// kubeName turns a CAPIO-CL workflow name into a valid Kubernetes object name (a DNS-1123
// subdomain): lower case, anything else than [a-z0-9.-] becomes "-".
func kubeName(s string) string {
	if len(validation.IsDNS1123Subdomain(s)) == 0 {
		return s
	}
	b := []byte(strings.ToLower(s))
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
			b[i] = '-'
		}
	}
	out := strings.Trim(string(b), "-.")
	if len(out) > 253 {
		out = strings.Trim(out[:253], "-.")
	}
	if out == "" {
		out = "capio-workflow"
	}
	return out
}

// FromWorkflow converts a Workflow's file declarations into a CAPIO-CL document of the
// given version (Version10 or Version11). What CAPIO-CL cannot express (pod templates,
// replica counts, OnTermination with a count, the volume, object storage, a default
// home-node policy other than Create) is left out with a warning naming the field.
func FromWorkflow(wf *v1alpha1.Workflow, version string) (*Document, []string, error) {
	if version != Version10 && version != Version11 {
		return nil, nil, fmt.Errorf("unsupported CAPIO-CL version %q: use %s or %s", version, Version10, Version11)
	}
	var warnings []string
	doc := &Document{Name: wf.Name, IOGraph: []Step{}}
	if n := wf.Annotations[v1alpha1.AnnotationCAPIOName]; n != "" {
		doc.Name = n
	}
	if version == Version11 {
		v := 1.1
		doc.Version = &v
		doc.Configuration = wf.Annotations[v1alpha1.AnnotationCAPIOConfiguration]
	} else if wf.Annotations[v1alpha1.AnnotationCAPIOConfiguration] != "" {
		warnings = append(warnings, "metadata.annotations["+v1alpha1.AnnotationCAPIOConfiguration+"]: CAPIO-CL 1.0 has no configuration; left out")
	}
	spec := &wf.Spec
	aliases := map[string][]string{}
	for _, a := range spec.Aliases {
		doc.Aliases = append(doc.Aliases, Alias{GroupName: a.Name, Files: nonNil(a.Files)})
		aliases[a.Name] = a.Files
	}
	dropped := false
	for i, s := range spec.Steps {
		st := Step{Name: s.Name, InputStream: nonNil(s.Inputs), OutputStream: []string{}}
		if s.Template != nil || s.Replicas != nil && *s.Replicas != 1 {
			dropped = true
		}
		var entries []string
		for _, o := range s.Outputs {
			entries = append(entries, o.Path)
		}
		for j, o := range s.Outputs {
			// A member of an alias or directory the step outputs appears in streaming only,
			// as CAPIO-CL writes the rules of a group's members.
			if _, member := memberOf(o.Path, entries, aliases); !member {
				st.OutputStream = append(st.OutputStream, o.Path)
			}
			r, ok, w := outputToRule(o, fmt.Sprintf("spec.steps[%d].outputs[%d]", i, j))
			warnings = append(warnings, w...)
			if ok {
				st.Streaming = append(st.Streaming, r)
			}
		}
		doc.IOGraph = append(doc.IOGraph, st)
	}
	if dropped {
		warnings = append(warnings, "spec.steps: pod templates and replica counts are not part of CAPIO-CL; left out")
	}
	if spec.Volume.SizeLimit != nil || spec.Storage != nil || spec.WaitTimeout != nil {
		warnings = append(warnings, "spec.volume, spec.storage and spec.waitTimeout are not part of CAPIO-CL; left out")
	}
	doc.Permanent = spec.Permanent
	doc.Exclude = spec.Exclude
	if hn := spec.HomeNode; hn != nil {
		if hn.Policy != "" && hn.Policy != v1alpha1.HomeNodeCreate {
			warnings = append(warnings, fmt.Sprintf("spec.homeNode.policy: CAPIO-CL has no default policy; %s for unlisted files is left out", hn.Policy))
		}
		hp := &HomeNodePolicies{Create: hn.Create, Hashing: hn.Hashing}
		for i, m := range hn.Manual {
			if m.Instance != nil && *m.Instance != 0 {
				warnings = append(warnings, fmt.Sprintf("spec.homeNode.manual[%d].instance: CAPIO-CL names a step, not an instance; left out", i))
			}
			hp.Manual = append(hp.Manual, ManualPolicy{Name: nonNil(m.Files), AppNode: m.Step})
		}
		if len(hp.Create)+len(hp.Hashing)+len(hp.Manual) > 0 {
			doc.HomeNodePolicies = hp
		}
	}
	if t := spec.Tiers; t != nil && len(t.Memory)+len(t.FS) > 0 {
		doc.Storage = &Storage{Memory: t.Memory, FS: t.FS}
	}
	return doc, warnings, nil
}

// outputToRule maps an Output to a streaming rule; ok is false when the output has only
// default settings and needs no rule.
func outputToRule(o v1alpha1.Output, at string) (r StreamingRule, ok bool, warnings []string) {
	if o.Type == v1alpha1.FileTypeDirectory {
		r.Dirname = []string{o.Path}
	} else {
		r.Name = []string{o.Path}
	}
	switch o.Commit.Rule {
	case v1alpha1.CommitOnTermination:
		r.Committed = "on_termination"
		if o.Commit.Count != nil {
			warnings = append(warnings, at+".commit.count: CAPIO-CL on_termination waits for every instance; the count is left out")
		}
	case v1alpha1.CommitOnClose:
		r.Committed = "on_close"
		if o.Commit.Count != nil {
			r.Committed = fmt.Sprintf("on_close:%d", *o.Commit.Count)
		}
	case v1alpha1.CommitOnFile:
		r.Committed = "on_file"
		r.FileDeps = o.Commit.Files
	case v1alpha1.CommitOnNFiles:
		r.Committed = "on_n_files"
		if o.Commit.Count != nil {
			n := int64(*o.Commit.Count)
			r.NFiles = &n
		}
	}
	switch o.Fire {
	case v1alpha1.FireUpdate:
		r.Mode = "update"
	case v1alpha1.FireNoUpdate:
		r.Mode = "no_update"
	}
	ok = r.Committed != "" || r.Mode != "" || len(r.Dirname) > 0
	return r, ok, warnings
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
