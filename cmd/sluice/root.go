package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/sluice-io/sluice/internal/exitcode"
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
		Version:       versionString(),
	}
	// `sluice --version` prints what `sluice version` prints.
	root.SetVersionTemplate("sluice {{.Version}}\n")
	root.AddCommand(newVersionCommand(), newValidateCommand(), newCapioCommand(), newRunCommand(),
		newCSICommand(), newSidecarCommand(), newControllerCommand(), newNATSServerCommand(),
		newMinIOSetupCommand())
	usageErrorsExit2(root)
	return root
}

// usageErrorsExit2 makes every usage error of cmd and its subcommands (a wrong number of
// arguments, an unknown flag or command) an exit status of 2 with the error and the
// command's usage line, as bad flag values already are: cobra's own errors would exit 1,
// and with SilenceUsage print no usage.
func usageErrorsExit2(cmd *cobra.Command) {
	cmd.SetFlagErrorFunc(usageError)
	if cmd.HasSubCommands() && cmd.Run == nil && cmd.RunE == nil {
		// A command group: with arguments they name an unknown subcommand (cobra would
		// print the help and exit 0 for a group under the root); without, the help.
		cmd.SuggestionsMinimumDistance = 2
		cmd.Args = func(c *cobra.Command, args []string) error {
			if len(args) > 0 {
				msg := fmt.Sprintf("unknown command %q for %q", args[0], c.CommandPath())
				if s := c.SuggestionsFor(args[0]); len(s) > 0 {
					msg += fmt.Sprintf(" (did you mean %q?)", s[0])
				}
				return usageError(c, errors.New(msg))
			}
			return nil
		}
		cmd.RunE = func(c *cobra.Command, _ []string) error { return c.Help() }
	} else if check := cmd.Args; check != nil {
		cmd.Args = func(c *cobra.Command, args []string) error {
			if err := check(c, args); err != nil {
				return usageError(c, err)
			}
			return nil
		}
	}
	for _, sub := range cmd.Commands() {
		usageErrorsExit2(sub)
	}
}

// usageError is a usage error of c: exit status 2, the error and c's usage line.
func usageError(c *cobra.Command, err error) error {
	use := c.UseLine()
	if c.HasSubCommands() {
		use = c.CommandPath() + " COMMAND"
	}
	return &exitcode.Error{Code: exitcode.Usage, Err: fmt.Errorf("%s: %w\nusage: %s (see %s --help)", c.CommandPath(), err, use, c.CommandPath())}
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

// plural is n and the noun, in the plural unless n is 1: "1 step", "3 steps".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
