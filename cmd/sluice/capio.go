package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/capiocl"
	"github.com/sluice-io/sluice/internal/exitcode"
	"github.com/sluice-io/sluice/internal/validation"
)

func newCapioCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "capio",
		Short: "Convert between CAPIO-CL JSON and Workflow YAML",
	}
	cmd.AddCommand(newCapioImportCommand(), newCapioExportCommand())
	return cmd
}

func newCapioImportCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "import FILE.json",
		Short: "Print the Workflow YAML for a CAPIO-CL document",
		Long: `Reads a CAPIO-CL 1.0 or 1.1 document and prints the equivalent Workflow. Steps get no pod
template: add one per step to run them with sluice run or the controller, or let external
pods join by label. The printed Workflow is validated before it is printed.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			data, err := os.ReadFile(args[0])
			if err != nil {
				return &exitcode.Error{Code: 1, Err: fmt.Errorf("reading CAPIO-CL: %w", err)}
			}
			doc, err := capiocl.Parse(args[0], data)
			if err != nil {
				return &exitcode.Error{Code: 1, Err: err}
			}
			// Warnings and errors name the file and the document's JSON paths, not the
			// converted Workflow's fields.
			wf, warnings, origins := capiocl.ToWorkflowOrigins(doc)
			warn(cmd.ErrOrStderr(), origins.Messages(args[0], warnings))
			res, err := validation.ValidateWorkflow(cmd.Context(), args[0], wf)
			if err != nil {
				var verr *validation.Error
				if errors.As(err, &verr) {
					for i := range verr.Errs {
						verr.Errs[i].Field = origins.JSONPath(verr.Errs[i].Field)
					}
				}
				return &exitcode.Error{Code: 1, Err: fmt.Errorf("the converted Workflow is not valid:\n%w", err)}
			}
			warn(cmd.ErrOrStderr(), origins.Messages(args[0], res.Warnings))
			out, err := workflowYAML(wf)
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(out)
			return err
		},
	}
}

func newCapioExportCommand() *cobra.Command {
	var version string
	cmd := &cobra.Command{
		Use:   "export FILE.yaml",
		Short: "Print the CAPIO-CL JSON for a Workflow",
		Long: `Validates a Workflow and prints its file declarations as CAPIO-CL. What CAPIO-CL cannot
express (pod templates, replicas, retries, the volume, object storage, stage-in sources,
lifetime, replication, ...) is left out with a warning per field, naming it.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			data, err := os.ReadFile(args[0])
			if err != nil {
				return &exitcode.Error{Code: 1, Err: fmt.Errorf("reading workflow: %w", err)}
			}
			res, err := validation.Load(cmd.Context(), args[0], data)
			if err != nil {
				return &exitcode.Error{Code: 1, Err: err}
			}
			if res.Format != validation.FormatWorkflow {
				return &exitcode.Error{Code: 1, Err: fmt.Errorf("%s: already CAPIO-CL; export takes a Workflow", args[0])}
			}
			// Export what the user wrote, not the defaulted copy, so defaults stay implicit.
			var wf v1alpha1.Workflow
			if err := yaml.Unmarshal(data, &wf); err != nil {
				return &exitcode.Error{Code: 1, Err: fmt.Errorf("%s: %w", args[0], err)}
			}
			doc, warnings, err := capiocl.FromWorkflow(&wf, version)
			if err != nil {
				return &exitcode.Error{Code: 2, Err: err}
			}
			// One line per field left out, naming the file and the field.
			for i, w := range warnings {
				warnings[i] = args[0] + ": " + w
			}
			warn(cmd.ErrOrStderr(), warnings)
			out, err := capiocl.Marshal(doc)
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(out)
			return err
		},
	}
	cmd.Flags().StringVar(&version, "version", capiocl.Version11, "CAPIO-CL version to write: 1.0 or 1.1")
	return cmd
}

// workflowYAML renders a Workflow as YAML without status or server-set fields.
func workflowYAML(wf *v1alpha1.Workflow) ([]byte, error) {
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(wf)
	if err != nil {
		return nil, fmt.Errorf("encoding workflow: %w", err)
	}
	delete(obj, "status")
	if md, ok := obj["metadata"].(map[string]any); ok {
		delete(md, "creationTimestamp")
	}
	pruneEmpty(obj)
	return yaml.Marshal(obj)
}

// pruneEmpty removes empty objects (e.g. "commit: {}") left by non-pointer structs.
func pruneEmpty(m map[string]any) {
	for k, v := range m {
		switch t := v.(type) {
		case map[string]any:
			pruneEmpty(t)
			if len(t) == 0 {
				delete(m, k)
			}
		case []any:
			for _, e := range t {
				if em, ok := e.(map[string]any); ok {
					pruneEmpty(em)
				}
			}
		}
	}
}
