// Package v1alpha1 holds the sluice.io/v1alpha1 API: the namespaced Workflow kind that
// declares steps, the files they exchange and the CAPIO-CL commit and firing rules of
// those files.
//
// +kubebuilder:object:generate=true
// +groupName=sluice.io
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the API group and version of every kind in this package.
	GroupVersion = schema.GroupVersion{Group: "sluice.io", Version: "v1alpha1"}

	// SchemeBuilder registers this package's kinds with a runtime.Scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds this package's kinds to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
