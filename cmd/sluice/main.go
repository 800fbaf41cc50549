// Command sluice is the one binary of Sluice. Its subcommands are the parts of the system
// (see `sluice --help`): validate and convert workflows, run them on one machine, and,
// in a cluster, the controller, CSI driver and sidecar.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRootCommand().ExecuteContext(ctx)
	stop()
	if err != nil {
		if msg := err.Error(); msg != "" {
			fmt.Fprintln(os.Stderr, msg)
		}
		os.Exit(exitCode(err))
	}
}
