package controller

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/sluice-io/sluice/api/v1alpha1"
)

// ReasonSizeNotPermitted says that spec.volume.sizeLimit or spec.volume.disk.sizeLimit
// exceeds the installation's maximum (WorkflowReconciler.WorkflowMemoryMax,
// WorkflowDiskMax): the Workflow is not provisioned and gets no pods until its spec asks
// for less.
const ReasonSizeNotPermitted = "SizeNotPermitted"

// sizeNotPermitted returns why wf's tiers exceed the installation's maxima (memMax and
// diskMax bytes, 0: none), or "" when they do not.
func sizeNotPermitted(wf *v1alpha1.Workflow, memMax, diskMax int64) string {
	v := wf.Spec.Volume
	if q := v.SizeLimit; q != nil && memMax > 0 && q.Value() > memMax {
		return fmt.Sprintf("spec.volume.sizeLimit %s exceeds the installation's maximum memory tier of a workflow on a node, %s", q, quantityOf(memMax))
	}
	if v.Disk != nil && v.Disk.SizeLimit != nil && diskMax > 0 && v.Disk.SizeLimit.Value() > diskMax {
		return fmt.Sprintf("spec.volume.disk.sizeLimit %s exceeds the installation's maximum disk tier of a workflow on a node, %s", v.Disk.SizeLimit, quantityOf(diskMax))
	}
	return ""
}

// quantityOf formats bytes as a Kubernetes quantity ("2Gi").
func quantityOf(bytes int64) string { return resource.NewQuantity(bytes, resource.BinarySI).String() }
