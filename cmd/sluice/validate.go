package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/sluice-io/sluice/internal/exitcode"
	"github.com/sluice-io/sluice/internal/runner"
	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/validation"
)

func newValidateCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "validate FILE",
		Short: "Check a Workflow (YAML) or CAPIO-CL (JSON) document",
		Long: `Checks a Workflow against the CRD's schema and CEL rules, exactly as the API server would,
and against the rules CEL cannot express: overlapping patterns, OnFile cycles and undeclared
dependencies. A container without a command is a warning: sluice run refuses it (it cannot
use the image's entrypoint), a cluster runs the image's entrypoint. CAPIO-CL JSON is checked against the language's schema, then converted and
checked the same way. Every problem is printed with the file and the path of the field.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			res, err := validation.LoadFile(cmd.Context(), args[0])
			if err != nil {
				return &exitcode.Error{Code: 1, Err: err}
			}
			warn(cmd.ErrOrStderr(), res.Warnings)
			wf := res.Workflow
			// Valid on a cluster, where the image's entrypoint runs, but not for sluice run.
			for _, e := range runner.CheckCommands(wf) {
				warn(cmd.ErrOrStderr(), []string{fmt.Sprintf("%s: %s (sluice run refuses it; on a cluster the image's entrypoint runs)", args[0], e.Error())})
			}
			for _, n := range semantics.ListingNotes(&wf.Spec, res.Rules) {
				fmt.Fprintln(cmd.ErrOrStderr(), "note:", n)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: valid %s %q: %s, %s\n",
				args[0], res.Format, wf.Name, plural(len(wf.Spec.Steps), "step"), plural(len(res.Rules.Rules()), "rule"))
			return nil
		},
	}
}
