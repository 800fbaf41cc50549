// Command sluice-bench runs Sluice's benchmarks: CAPIO's patterns in every mode, against
// the batch baselines of the same run, and the micro-benchmarks of a view against tmpfs
// and of the transport against NATS and TCP (docs/benchmarks.md). It serves the views and
// the transport in its own process, as a sidecar does.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/sluice-io/sluice/internal/exitcode"
	buildversion "github.com/sluice-io/sluice/internal/version"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = ""

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newBenchCommand().ExecuteContext(ctx)
	stop()
	exitcode.Exit(err)
}

// versionString is the version set at build time, else the VCS revision Go recorded.
func versionString() string { return buildversion.Of(version) }
