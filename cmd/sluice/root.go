package main

import (
	"errors"
	"fmt"
	"io"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = ""

// exitError carries a process exit code; its message may be empty when the command has
// already printed what went wrong.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return ""
	}
	return e.err.Error()
}

func (e *exitError) Unwrap() error { return e.err }

func exitCode(err error) int {
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	return 1
}

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "sluice",
		Short: "Stream files between the steps of a workflow, with CAPIO-CL commit and firing rules",
		Long: `Sluice lets file-based workflow steps stream to each other without changing their code:
a consumer's open() and read() wait exactly as the declared commit and firing rules say.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newVersionCommand(), newValidateCommand(), newCapioCommand(), newRunCommand(), newBenchCommand(),
		newCSICommand(), newSidecarCommand(), newControllerCommand(), newNATSServerCommand())
	return root
}

func versionString() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				return "dev-" + s.Value[:12]
			}
		}
		if bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			return bi.Main.Version
		}
	}
	return "dev"
}

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
