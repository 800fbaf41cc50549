// Package validation checks Workflow documents the way every entry point needs them
// checked: against the generated CRD's OpenAPI schema and CEL rules (exactly what the API
// server enforces on kubectl apply), then against the semantic rules CEL cannot express
// (semantics.Compile). `sluice validate`, `sluice run` and the admission path share it.
package validation

import (
	"context"
	"fmt"
	"sort"

	apiextensionsinternal "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/listtype"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"sigs.k8s.io/yaml"
)

// Schema validates objects against one version of a CRD: pruning of unknown fields
// (reported as errors, not dropped), structural defaulting, OpenAPI v3 validation,
// list-type (map/set) uniqueness and the x-kubernetes-validations CEL rules.
type Schema struct {
	structural *structuralschema.Structural
	openapi    apiservervalidation.SchemaValidator
	cel        *cel.Validator
}

// NewSchema builds a Schema from CRD YAML for the named version (e.g. "v1alpha1"). It
// fails if the YAML is not a CRD, has no such version, or its schema is not structural.
func NewSchema(crdYAML []byte, version string) (*Schema, error) {
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(crdYAML, &crd); err != nil {
		return nil, fmt.Errorf("decoding CRD: %w", err)
	}
	var v1props *apiextensionsv1.JSONSchemaProps
	for _, v := range crd.Spec.Versions {
		if v.Name == version && v.Schema != nil {
			v1props = v.Schema.OpenAPIV3Schema
		}
	}
	if v1props == nil {
		return nil, fmt.Errorf("CRD %s has no schema for version %s", crd.Name, version)
	}
	var props apiextensionsinternal.JSONSchemaProps
	if err := apiextensionsv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(v1props, &props, nil); err != nil {
		return nil, fmt.Errorf("converting CRD schema: %w", err)
	}
	structural, err := structuralschema.NewStructural(&props)
	if err != nil {
		return nil, fmt.Errorf("CRD %s schema is not structural: %w", crd.Name, err)
	}
	openapi, _, err := apiservervalidation.NewSchemaValidator(&props)
	if err != nil {
		return nil, fmt.Errorf("building the OpenAPI validator of CRD %s: %w", crd.Name, err)
	}
	return &Schema{
		structural: structural,
		openapi:    openapi,
		cel:        cel.NewValidator(structural, true, celconfig.PerCallLimit),
	}, nil
}

// Validate checks obj (a decoded JSON object) as the API server would on create, and
// applies the schema's defaults to it in place. Unknown fields are errors naming their
// path (the server would silently prune them, which hides typos).
func (s *Schema) Validate(ctx context.Context, obj map[string]any) field.ErrorList {
	var errs field.ErrorList
	unknown := pruning.PruneWithOptions(obj, s.structural, true, structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true})
	sort.Strings(unknown)
	for _, p := range unknown {
		errs = append(errs, field.Forbidden(field.NewPath(p), "unknown field"))
	}
	defaulting.Default(obj, s.structural)
	errs = append(errs, apiservervalidation.ValidateCustomResource(nil, obj, s.openapi)...)
	errs = append(errs, listtype.ValidateListSetsAndMaps(nil, s.structural, obj)...)
	if len(errs) > 0 {
		return errs // CEL rules assume a schema-valid object
	}
	celErrs, _ := s.cel.Validate(ctx, nil, s.structural, obj, nil, celconfig.RuntimeCELCostBudget)
	return append(errs, celErrs...)
}
