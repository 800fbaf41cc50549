// Command sluice is the one binary of Sluice. Its subcommands are the parts of the system
// (see `sluice --help`): validate and convert workflows, run them on one machine, and,
// in a cluster, the controller, CSI driver and sidecar.
package main

import (
	"context"
	"os"
	"os/signal"
	"runtime"
	"syscall"

	"github.com/sluice-io/sluice/internal/exitcode"
)

// init keeps the main goroutine on the process's main thread, so that no other goroutine
// runs there: the CSI plugin changes threads for good (a store server child's forking
// thread drops its capabilities; isolate enters a child's mount namespace) and discards
// them by ending their goroutines locked, which Go does by ending the thread, except the
// main thread, which it parks with what was done to it (internal/storeserver).
func init() {
	runtime.LockOSThread()
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRootCommand().ExecuteContext(ctx)
	stop()
	exitcode.Exit(err)
}
