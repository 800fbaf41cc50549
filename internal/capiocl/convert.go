package capiocl

import (
	"fmt"
	"maps"
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
//
// Warnings begin with the JSON path of the value they are about, e.g.
// "IO_Graph[0].streaming[1].n_files: ignored: ...".
func ToWorkflow(doc *Document) (*v1alpha1.Workflow, []string) {
	wf, warnings, _ := ToWorkflowOrigins(doc)
	return wf, warnings
}

// ToWorkflowOrigins is ToWorkflow that also returns where in the document each field of
// the Workflow came from, so that what is said about the Workflow (its validation errors
// and warnings) can name the document's JSON paths instead.
func ToWorkflowOrigins(doc *Document) (*v1alpha1.Workflow, []string, Origins) {
	doc = volumeRelative(doc)
	var warnings []string
	org := Origins{"spec": "", "metadata": "", "metadata.name": "name", "spec.steps": "IO_Graph"}
	wf := &v1alpha1.Workflow{
		TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "Workflow"},
	}
	wf.Name = kubeName(doc.Name)
	ann := map[string]string{}
	if wf.Name != doc.Name {
		ann[v1alpha1.AnnotationCAPIOName] = doc.Name
	}
	if doc.Version != nil {
		org["metadata.annotations["+v1alpha1.AnnotationCAPIOVersion+"]"] = "version"
		ann[v1alpha1.AnnotationCAPIOVersion] = strconv.FormatFloat(*doc.Version, 'f', -1, 64)
	}
	if doc.Configuration != "" {
		org["metadata.annotations["+v1alpha1.AnnotationCAPIOConfiguration+"]"] = "configuration"
		ann[v1alpha1.AnnotationCAPIOConfiguration] = doc.Configuration
	}
	if len(ann) > 0 {
		wf.Annotations = ann
	}
	spec := &wf.Spec
	for i, a := range doc.Aliases {
		spec.Aliases = append(spec.Aliases, v1alpha1.Alias{Name: a.GroupName, Files: a.Files})
		at, fp := fmt.Sprintf("aliases[%d]", i), fmt.Sprintf("spec.aliases[%d]", i)
		org[fp], org[fp+".name"], org[fp+".files"] = at, at+".group_name", at+".files"
		for j := range a.Files {
			org[fmt.Sprintf("%s.files[%d]", fp, j)] = fmt.Sprintf("%s.files[%d]", at, j)
		}
	}
	org.list("spec.aliases", "aliases", len(doc.Aliases))

	// Rules are per file: collect them all first, remembering who declared them and where.
	type declared struct {
		out    v1alpha1.Output
		rule   StreamingRule
		step   int
		used   bool
		at     string // the rule's JSON path: IO_Graph[i].streaming[j]
		nameAt string // the name's: IO_Graph[i].streaming[j].name[k] (or dirname[k])
	}
	rules := map[string]*declared{}
	var order []string
	for i, st := range doc.IOGraph {
		for j, r := range st.Streaming {
			out, w := ruleToOutput(r, fmt.Sprintf("IO_Graph[%d].streaming[%d]", i, j))
			warnings = append(warnings, w...)
			names, key := r.Name, "name"
			if len(r.Dirname) > 0 {
				names, key = r.Dirname, "dirname"
			}
			at := fmt.Sprintf("IO_Graph[%d].streaming[%d]", i, j)
			for k, n := range names {
				o := out
				o.Path = n
				if prev, dup := rules[n]; dup {
					if equality.Semantic.DeepEqual(prev.out, o) {
						continue
					}
					warnings = append(warnings, fmt.Sprintf("%s.%s[%d]: %q has a rule already (%s); the first one is kept", at, key, k, n, prev.at))
					continue
				}
				rules[n] = &declared{out: o, rule: r, step: i, at: at, nameAt: fmt.Sprintf("%s.%s[%d]", at, key, k)}
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
	// output records where output j of step i came from: the name (an output_stream entry,
	// or the rule's name) and, if it has one, its rule.
	output := func(i, j int, nameAt string, d *declared) {
		fp := fmt.Sprintf("spec.steps[%d].outputs[%d]", i, j)
		org[fp], org[fp+".path"] = nameAt, nameAt
		if d == nil {
			return
		}
		org[fp+".type"] = d.nameAt
		if d.rule.Committed != "" {
			org[fp+".commit"], org[fp+".commit.rule"], org[fp+".commit.count"] = d.at+".committed", d.at+".committed", d.at+".committed"
		}
		if d.rule.NFiles != nil {
			if d.rule.Committed == "" {
				org[fp+".commit"], org[fp+".commit.rule"] = d.at+".n_files", d.at+".n_files"
			}
			org[fp+".commit.count"] = d.at + ".n_files"
		}
		if len(d.rule.FileDeps) > 0 {
			org.list(fp+".commit.files", d.at+".file_deps", len(d.rule.FileDeps))
		}
		if d.rule.Mode != "" {
			org[fp+".fire"] = d.at + ".mode"
		}
	}
	for i, st := range doc.IOGraph {
		step := v1alpha1.Step{Name: st.Name, Inputs: st.InputStream}
		at, fp := fmt.Sprintf("IO_Graph[%d]", i), fmt.Sprintf("spec.steps[%d]", i)
		org[fp], org[fp+".name"], org[fp+".inputs"], org[fp+".outputs"] = at, at+".name", at+".input_stream", at+".output_stream"
		for j := range st.InputStream {
			org[fmt.Sprintf("%s.inputs[%d]", fp, j)] = fmt.Sprintf("%s.input_stream[%d]", at, j)
		}
		for m, n := range st.OutputStream {
			o := v1alpha1.Output{Path: n}
			d := rules[n]
			if d != nil {
				o = d.out
			}
			output(i, len(step.Outputs), fmt.Sprintf("%s.output_stream[%d]", at, m), d)
			step.Outputs = append(step.Outputs, o)
			for _, mo := range members[i][n] {
				md := rules[mo.Path]
				output(i, len(step.Outputs), md.nameAt, md)
				step.Outputs = append(step.Outputs, mo)
			}
		}
		spec.Steps = append(spec.Steps, step)
	}
	for _, n := range order {
		d := rules[n]
		if d.used {
			continue
		}
		warnings = append(warnings, fmt.Sprintf("%s: the streaming rule for %q names no output_stream entry; it becomes an output of step %q", d.nameAt, n, doc.IOGraph[d.step].Name))
		output(d.step, len(spec.Steps[d.step].Outputs), d.nameAt, d)
		spec.Steps[d.step].Outputs = append(spec.Steps[d.step].Outputs, d.out)
	}
	spec.Permanent = doc.Permanent
	org.list("spec.permanent", "permanent", len(doc.Permanent))
	spec.Exclude = doc.Exclude
	org.list("spec.exclude", "exclude", len(doc.Exclude))
	if hp := doc.HomeNodePolicies; hp != nil && (len(hp.Create)+len(hp.Hashing)+len(hp.Manual) > 0) {
		hn := &v1alpha1.HomeNodeSpec{Create: hp.Create, Hashing: hp.Hashing}
		org["spec.homeNode"] = "home_node_policies"
		org.list("spec.homeNode.create", "home_node_policies.create", len(hp.Create))
		org.list("spec.homeNode.hashing", "home_node_policies.hashing", len(hp.Hashing))
		org.list("spec.homeNode.manual", "home_node_policies.manual", len(hp.Manual))
		for i, m := range hp.Manual {
			hn.Manual = append(hn.Manual, v1alpha1.ManualHomeNode{Files: m.Name, Step: m.AppNode})
			at, fp := fmt.Sprintf("home_node_policies.manual[%d]", i), fmt.Sprintf("spec.homeNode.manual[%d]", i)
			org[fp], org[fp+".step"] = at, at+".app_node"
			org.list(fp+".files", at+".name", len(m.Name))
		}
		spec.HomeNode = hn
	}
	if s := doc.Storage; s != nil && len(s.Memory)+len(s.FS) > 0 {
		spec.Tiers = &v1alpha1.TierSpec{Memory: s.Memory, FS: s.FS}
		org["spec.tiers"] = "storage"
		org.list("spec.tiers.memory", "storage.memory", len(s.Memory))
		org.list("spec.tiers.fs", "storage.fs", len(s.FS))
	}
	return wf, warnings, org
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
// given version (Version10 or Version11). Everything CAPIO-CL cannot express is left out
// with one warning per thing left out, naming its field path and value and, where it
// matters, what that means after an import of the document: metadata other than the name,
// the volume, replica counts, pod templates, placement and retries, OnTermination with a
// count, an output's lifetime and replication, a default home-node policy other than
// Create, a manual home node's instance, object storage, every stage-in source (its files
// have no producer in the document), the wait timeout and ttlSecondsAfterFinished.
// A field set to its default value is not left out: an import gives the default back.
func FromWorkflow(wf *v1alpha1.Workflow, version string) (*Document, []string, error) {
	if version != Version10 && version != Version11 {
		return nil, nil, fmt.Errorf("unsupported CAPIO-CL version %q: use %s or %s", version, Version10, Version11)
	}
	doc := &Document{Name: wf.Name, IOGraph: []Step{}}
	if n := wf.Annotations[v1alpha1.AnnotationCAPIOName]; n != "" {
		doc.Name = n
	}
	warnings := metadataLeftOut(&wf.ObjectMeta)
	if version == Version11 {
		v := 1.1
		doc.Version = &v
		doc.Configuration = wf.Annotations[v1alpha1.AnnotationCAPIOConfiguration]
	} else if wf.Annotations[v1alpha1.AnnotationCAPIOConfiguration] != "" {
		warnings = append(warnings, "metadata.annotations["+v1alpha1.AnnotationCAPIOConfiguration+"]: CAPIO-CL 1.0 has no configuration; left out")
	}
	spec := &wf.Spec
	warnings = append(warnings, volumeLeftOut(&spec.Volume)...)
	aliases := map[string][]string{}
	for _, a := range spec.Aliases {
		doc.Aliases = append(doc.Aliases, Alias{GroupName: a.Name, Files: nonNil(a.Files)})
		aliases[a.Name] = a.Files
	}
	for i, s := range spec.Steps {
		st := Step{Name: s.Name, InputStream: nonNil(s.Inputs), OutputStream: []string{}}
		warnings = append(warnings, stepLeftOut(s, fmt.Sprintf("spec.steps[%d]", i))...)
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
	doc.Permanent = spec.Permanent
	doc.Exclude = spec.Exclude
	if hn := spec.HomeNode; hn != nil {
		if hn.Policy != "" && hn.Policy != v1alpha1.HomeNodeCreate {
			warnings = append(warnings, fmt.Sprintf("spec.homeNode.policy (%s): CAPIO-CL has no default policy; %s for unlisted files is left out", hn.Policy, hn.Policy))
		}
		hp := &HomeNodePolicies{Create: hn.Create, Hashing: hn.Hashing}
		for i, m := range hn.Manual {
			if m.Instance != nil && *m.Instance != 0 {
				warnings = append(warnings, fmt.Sprintf("spec.homeNode.manual[%d].instance (%d): CAPIO-CL names a step, not an instance; left out (after import, instance 0 of step %q holds the files)", i, *m.Instance, m.Step))
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
	if st := spec.Storage; st != nil {
		warnings = append(warnings, fmt.Sprintf("spec.storage (bucket %q): CAPIO-CL has no object storage; left out (permanent files stay listed, not where they are stored)", st.Bucket))
	}
	for i, src := range spec.Sources {
		warnings = append(warnings, fmt.Sprintf("spec.sources[%d] (%s -> %s): stage-in is not expressible in CAPIO-CL; after import, %s has no producer", i, src.From, src.Path, src.Path))
	}
	if spec.WaitTimeout != nil {
		warnings = append(warnings, fmt.Sprintf("spec.waitTimeout (%s): CAPIO-CL has no wait timeout; left out (after import, the default of 1h applies)", spec.WaitTimeout.Duration))
	}
	if spec.TTLSecondsAfterFinished != nil {
		warnings = append(warnings, fmt.Sprintf("spec.ttlSecondsAfterFinished (%d): CAPIO-CL has no time to keep data after the end; left out (after import, data is kept until the Workflow is deleted)", *spec.TTLSecondsAfterFinished))
	}
	return doc, warnings, nil
}

// metadataLeftOut warns about the metadata a CAPIO-CL document has no place for: all but
// the name and the annotations that carry CAPIO-CL's own keys. Fields the API server sets
// (uid, resourceVersion, ...) are not declarations and are left out without a word.
func metadataLeftOut(md *metav1.ObjectMeta) []string {
	var w []string
	if md.Namespace != "" {
		w = append(w, fmt.Sprintf("metadata.namespace (%s): CAPIO-CL has no namespace; left out", md.Namespace))
	}
	if md.GenerateName != "" {
		w = append(w, fmt.Sprintf("metadata.generateName (%s): CAPIO-CL has no generated names; left out", md.GenerateName))
	}
	for _, k := range slices.Sorted(maps.Keys(md.Labels)) {
		w = append(w, fmt.Sprintf("metadata.labels[%s]: CAPIO-CL has no labels; left out", k))
	}
	for _, k := range slices.Sorted(maps.Keys(md.Annotations)) {
		switch k {
		case v1alpha1.AnnotationCAPIOName, v1alpha1.AnnotationCAPIOVersion, v1alpha1.AnnotationCAPIOConfiguration:
			continue // CAPIO-CL's name, version and configuration
		}
		w = append(w, fmt.Sprintf("metadata.annotations[%s]: CAPIO-CL has no annotations; left out", k))
	}
	for i, r := range md.OwnerReferences {
		w = append(w, fmt.Sprintf("metadata.ownerReferences[%d] (%s %s): CAPIO-CL has no owners; left out", i, r.Kind, r.Name))
	}
	for i, f := range md.Finalizers {
		w = append(w, fmt.Sprintf("metadata.finalizers[%d] (%s): CAPIO-CL has no finalizers; left out", i, f))
	}
	return w
}

// defaultMountPath is spec.volume.mountPath's default (the CRD's).
const defaultMountPath = "/data"

// volumeLeftOut warns about the volume's settings: CAPIO-CL has none.
func volumeLeftOut(v *v1alpha1.VolumeSpec) []string {
	var w []string
	if v.MountPath != "" && v.MountPath != defaultMountPath {
		w = append(w, fmt.Sprintf("spec.volume.mountPath (%s): CAPIO-CL has no mount path; left out (after import, %s)", v.MountPath, defaultMountPath))
	}
	if v.SizeLimit != nil {
		w = append(w, fmt.Sprintf("spec.volume.sizeLimit (%s): CAPIO-CL has no size limit; left out", v.SizeLimit))
	}
	if d := v.Disk; d != nil {
		what := "a disk tier"
		if d.SizeLimit != nil {
			what = "a disk tier of sizeLimit " + d.SizeLimit.String()
		}
		w = append(w, fmt.Sprintf("spec.volume.disk (%s): CAPIO-CL has no disk tier to spill to; left out", what))
	}
	return w
}

// stepLeftOut warns about what a step has besides its name and files.
func stepLeftOut(s v1alpha1.Step, at string) []string {
	var w []string
	if s.Replicas != nil && *s.Replicas != 1 {
		w = append(w, fmt.Sprintf("%s.replicas (%d): CAPIO-CL has no replica count; left out (after import, step %q runs 1 instance)", at, *s.Replicas, s.Name))
	}
	if s.Template != nil {
		w = append(w, fmt.Sprintf("%s.template: CAPIO-CL has no pod template; left out", at))
	}
	if s.Placement != "" && s.Placement != v1alpha1.PlacementPreferred {
		w = append(w, fmt.Sprintf("%s.placement (%s): CAPIO-CL has no placement policy; left out (after import, %s)", at, s.Placement, v1alpha1.PlacementPreferred))
	}
	if s.BackoffLimit != nil && *s.BackoffLimit != 0 {
		w = append(w, fmt.Sprintf("%s.backoffLimit (%d): CAPIO-CL has no retries; left out (after import, a failed instance of step %q is not run again)", at, *s.BackoffLimit, s.Name))
	}
	return w
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
			warnings = append(warnings, fmt.Sprintf("%s.commit.count (%d): CAPIO-CL on_termination waits for every instance; the count is left out", at, *o.Commit.Count))
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
	if o.Lifetime != "" && o.Lifetime != v1alpha1.LifetimeWorkflow {
		warnings = append(warnings, fmt.Sprintf("%s.lifetime (%s): CAPIO-CL keeps every file until the workflow ends; left out", at, o.Lifetime))
	}
	if o.Replicate != "" && o.Replicate != v1alpha1.ReplicateFetch {
		warnings = append(warnings, fmt.Sprintf("%s.replicate (%s): CAPIO-CL has no replication; left out (after import, %s)", at, o.Replicate, v1alpha1.ReplicateFetch))
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
