package validation

import (
	"fmt"
	"path"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/sluice-io/sluice/api/v1alpha1"
)

// checkPaths refuses the file names of a Workflow that a new user means as paths of the
// machine or the container, not of the volume: absolute names ("/tmp/x.txt", or
// "/data/x.txt" with the volume mounted at /data) and names with a ".." segment, which
// would lie outside the volume. Every field that names files is checked; the error names
// the field and says what to write instead.
//
// CAPIO-CL documents name files with absolute paths; their import makes them relative to
// the volume root (capiocl.ToWorkflow), so a converted document passes.
func checkPaths(spec *v1alpha1.WorkflowSpec) field.ErrorList {
	mp := spec.Volume.MountPath
	if mp == "" {
		mp = "/data"
	}
	var errs field.ErrorList
	check := func(fp *field.Path, p string) {
		if msg := pathProblem(p, mp); msg != "" {
			errs = append(errs, field.Invalid(fp, p, msg))
		}
	}
	list := func(fp *field.Path, ps []string) {
		for i, p := range ps {
			check(fp.Index(i), p)
		}
	}
	sp := field.NewPath("spec")
	for i, a := range spec.Aliases {
		list(sp.Child("aliases").Index(i).Child("files"), a.Files)
	}
	for i, s := range spec.Steps {
		stp := sp.Child("steps").Index(i)
		list(stp.Child("inputs"), s.Inputs)
		for j, o := range s.Outputs {
			op := stp.Child("outputs").Index(j)
			check(op.Child("path"), o.Path)
			list(op.Child("commit", "files"), o.Commit.Files)
		}
	}
	for i, src := range spec.Sources {
		check(sp.Child("sources").Index(i).Child("path"), src.Path)
	}
	list(sp.Child("permanent"), spec.Permanent)
	list(sp.Child("exclude"), spec.Exclude)
	if hn := spec.HomeNode; hn != nil {
		list(sp.Child("homeNode", "create"), hn.Create)
		list(sp.Child("homeNode", "hashing"), hn.Hashing)
		for i, m := range hn.Manual {
			list(sp.Child("homeNode", "manual").Index(i).Child("files"), m.Files)
		}
	}
	if t := spec.Tiers; t != nil {
		list(sp.Child("tiers", "memory"), t.Memory)
		list(sp.Child("tiers", "fs"), t.FS)
	}
	return errs
}

// pathProblem says what is wrong with the file name p of a Workflow whose volume is
// mounted at mountPath, or "" when nothing is.
func pathProblem(p, mountPath string) string {
	if strings.HasPrefix(p, "/") {
		rel := ""
		if mp := strings.TrimSuffix(mountPath, "/"); p == mp || strings.HasPrefix(p, mp+"/") {
			rel = strings.TrimPrefix(strings.TrimPrefix(p, mp), "/")
		} else {
			rel = strings.TrimLeft(p, "/")
		}
		if rel == "" {
			rel = "."
		}
		return fmt.Sprintf("is absolute: paths are relative to the volume ($SLUICE_DIR, mounted at %s); write %q for %s",
			mountPath, rel, path.Join(mountPath, rel))
	}
	for _, seg := range strings.Split(p, "/") {
		if seg == ".." {
			return `has a ".." segment: paths are relative to the volume ($SLUICE_DIR) and cannot leave it`
		}
	}
	return ""
}

// withoutFields returns the errors of errs whose field is not one of seen's, nor inside
// one of them: a problem already reported for a field is not reported twice.
func withoutFields(errs field.ErrorList, seen field.ErrorList) field.ErrorList {
	var out field.ErrorList
	for _, e := range errs {
		dup := false
		for _, s := range seen {
			if s.Field == e.Field || strings.HasPrefix(e.Field, s.Field+".") || strings.HasPrefix(e.Field, s.Field+"[") {
				dup = true
				break
			}
		}
		if !dup {
			out = append(out, e)
		}
	}
	return out
}
