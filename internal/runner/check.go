package runner

import (
	"fmt"

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
