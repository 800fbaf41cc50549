package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/sluice-io/sluice/sidecar"
)

func newSidecarCommand() *cobra.Command {
	var opts sidecar.Options
	cmd := &cobra.Command{
		Use:   "sidecar",
		Short: "Serve a pod's streaming volume (native sidecar, injected by the webhook)",
		Long: `Serve the pod's streaming volume on the /dev/fuse descriptor the CSI node plugin
hands over, with the workflow's commit and firing rules, stream it to the workflow's
other pods over NATS and store its permanent outputs. On SIGTERM, after the app
containers have exited, record the instance's termination (unless the controller
records that they failed), publish and upload
everything, and exit.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := notDumpable(); err != nil {
				return err
			}
			opts.Log = klog.NewKlogr().WithName("sidecar")
			s, err := sidecar.Start(cmd.Context(), opts)
			if err != nil {
				return err
			}
			<-cmd.Context().Done()
			opts.Log.Info("terminating: draining")
			return s.Drain()
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.ControlDir, "control-dir", "/sluice", "where the pod's control volume is mounted")
	f.StringVar(&opts.ConfigDir, "config-dir", "/etc/sluice", "where the workflow's Secret is mounted")
	f.StringVar(&opts.MetricsAddr, "metrics-addr", ":9090", "address of /metrics, /readyz and /healthz (empty: none)")
	f.DurationVar(&opts.AttachWait, "attach-wait", 0, "how long to wait for the CSI node plugin's hand-off (default 2m)")
	f.DurationVar(&opts.CatchUpWait, "catch-up-wait", 0, "bound on applying the workflow's recorded events before serving the volume (default 4m; Start fails when it runs out)")
	f.Var(&opts.Passthrough, "passthrough", "FUSE passthrough for reads of committed files (Linux >= 6.9, needs CAP_SYS_ADMIN): auto uses it where allowed, on fails where it is not, off serves every read in the sidecar")
	f.DurationVar(&opts.DrainTimeout, "drain-timeout", 0, "bound on the work after SIGTERM (default 10m)")
	f.DurationVar(&opts.OutcomeWait, "outcome-wait", 10*time.Second, "on SIGTERM, how long to wait for the controller to record whether the app containers succeeded before recording the instance's termination anyway (0: do not wait)")
	addLogFlags(cmd)
	return cmd
}

// notDumpable makes this process not dumpable before it reads a credential: the kernel
// then owns its /proc/<pid> entries as root and lets no process without CAP_SYS_PTRACE
// read its memory, environment, descriptors or root (/proc/<pid>/root, where the
// workflow's Secret is mounted) or ptrace it, not even one of the same user in a pod
// that shares its process namespace or an ephemeral container that targets it (issue
// 43, finding 5). The sidecar never executes anything, which would reset it.
func notDumpable() error {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("making the sidecar not dumpable: %w", err)
	}
	return nil
}
