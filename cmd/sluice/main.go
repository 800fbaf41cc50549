// Command sluice is the one binary of Sluice. Its subcommands are the parts of the system
// (see `sluice --help`): validate and convert workflows, run them on one machine, and,
// in a cluster, the controller, CSI driver and sidecar.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/sluice-io/sluice/internal/exitcode"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRootCommand().ExecuteContext(ctx)
	stop()
	exitcode.Exit(err)
}
