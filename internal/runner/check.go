package runner

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/sluice-io/sluice/api/v1alpha1"
)

// Check returns what keeps sluice run from running wf, every problem at its field: a step
// without a pod template (its programs are unknown here) and the problems CheckCommands
// finds. Run refuses such a workflow before it creates anything.
func Check(wf *v1alpha1.Workflow) field.ErrorList {
	var errs field.ErrorList
	for i, s := range wf.Spec.Steps {
		if s.Template == nil {
			errs = append(errs, field.Required(field.NewPath("spec", "steps").Index(i).Child("template"),
				fmt.Sprintf("step %s has no pod template: sluice run needs the programs to run", s.Name)))
		}
	}
	return append(errs, CheckCommands(wf)...)
}

// CheckCommands returns the containers and init containers without a command: sluice run
// runs a container's command as a local process and cannot use its image's entrypoint
// (on a cluster, the image's entrypoint runs, so such a Workflow is valid there).
func CheckCommands(wf *v1alpha1.Workflow) field.ErrorList {
	var errs field.ErrorList
	for i, s := range wf.Spec.Steps {
		if s.Template == nil {
			continue
		}
		sp := field.NewPath("spec", "steps").Index(i).Child("template", "spec")
		check := func(kind string, cs []corev1.Container) {
			for j, c := range cs {
				if len(c.Command) == 0 {
					errs = append(errs, field.Required(sp.Child(kind).Index(j).Child("command"),
						fmt.Sprintf("container %s of step %s has no command: sluice run runs it as a local process and cannot use the image's entrypoint", c.Name, s.Name)))
				}
			}
		}
		check("initContainers", s.Template.Spec.InitContainers)
		check("containers", s.Template.Spec.Containers)
	}
	return errs
}

// Warnings returns what sluice run does differently from a cluster for wf, each naming its
// field: a container whose command, args or env names the volume's mountPath
// (sluice run mounts each instance's view at $SLUICE_DIR, nothing at the mountPath, so
// such a path is the machine's own directory), and an env variable with valueFrom, which
// sluice run leaves unset.
func Warnings(wf *v1alpha1.Workflow) []string {
	mp := strings.TrimSuffix(wf.Spec.Volume.MountPath, "/")
	if mp == "" {
		mp = "/data"
	}
	namesMountPath := func(s string) bool {
		for i := strings.Index(s, mp); i >= 0; {
			end := i + len(mp)
			before := i == 0 || strings.ContainsRune(" \t\n'\"=:;(", rune(s[i-1]))
			after := end == len(s) || strings.ContainsRune("/ \t\n'\";)", rune(s[end]))
			if before && after {
				return true
			}
			next := strings.Index(s[i+1:], mp)
			if next < 0 {
				break
			}
			i += 1 + next
		}
		return false
	}
	var out []string
	for i, s := range wf.Spec.Steps {
		if s.Template == nil {
			continue
		}
		sp := field.NewPath("spec", "steps").Index(i).Child("template", "spec")
		check := func(kind string, cs []corev1.Container) {
			for j, c := range cs {
				cp := sp.Child(kind).Index(j)
				// (a workingDir under the mountPath is mapped into the view, runContainer)
				words := append(append([]string{}, c.Command...), c.Args...)
				for _, e := range c.Env {
					words = append(words, e.Value)
				}
				if slices.ContainsFunc(words, namesMountPath) {
					out = append(out, fmt.Sprintf("%s: container %s of step %s names the volume's mountPath %s: sluice run mounts each instance's view at $SLUICE_DIR, not there, so paths under %s are this machine's own; write them as $SLUICE_DIR/... to run the same way here and on a cluster",
						cp, c.Name, s.Name, mp, mp))
				}
				for k, e := range c.Env {
					if e.ValueFrom != nil {
						out = append(out, fmt.Sprintf("%s: env %s of container %s of step %s has valueFrom, which sluice run does not support: the variable is left unset",
							cp.Child("env").Index(k), e.Name, c.Name, s.Name))
					}
				}
			}
		}
		check("initContainers", s.Template.Spec.InitContainers)
		check("containers", s.Template.Spec.Containers)
	}
	return out
}
