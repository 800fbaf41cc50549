// Command pause is the pod sandbox process of the local test cluster (hack/cluster/up.sh):
// it holds a pod's namespaces open until SIGTERM or SIGINT and reaps the orphans a shared
// PID namespace hands it. The registry's pause image cannot be pulled on machines without
// one, so the cluster script builds this into its own image.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 8)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			if pid, _ := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil); pid <= 0 {
				break
			}
		}
	}
}
