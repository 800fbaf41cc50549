package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	buildversion "github.com/sluice-io/sluice/internal/version"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = ""

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "sluice",
		Short: "Stream files between the steps of a workflow, with CAPIO-CL commit and firing rules",
		Long: `Sluice lets file-based workflow steps stream to each other without changing their code:
a consumer's open() and read() wait exactly as the declared commit and firing rules say.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newVersionCommand(), newValidateCommand(), newCapioCommand(), newRunCommand(),
		newCSICommand(), newSidecarCommand(), newControllerCommand(), newNATSServerCommand())
	return root
}

func versionString() string { return buildversion.Of(version) }

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version of sluice",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintln(cmd.OutOrStdout(), "sluice", versionString())
		},
	}
}

// warn prints warnings to w, one per line.
func warn(w io.Writer, warnings []string) {
	for _, s := range warnings {
		fmt.Fprintln(w, "warning:", s)
	}
}
