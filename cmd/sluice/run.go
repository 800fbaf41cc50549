package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"
	"k8s.io/klog/v2"

	"github.com/sluice-io/sluice/internal/exitcode"
	"github.com/sluice-io/sluice/internal/objstore"
	"github.com/sluice-io/sluice/internal/runner"
	"github.com/sluice-io/sluice/internal/validation"
)

func newRunCommand() *cobra.Command {
	var opts runner.Options
	var jsonReport string
	var quiet bool
	var privateMounts bool
	var objURL string
	cmd := &cobra.Command{
		Use:   "run WORKFLOW.yaml",
		Short: "Run a Workflow on this machine, steps as local processes streaming through FUSE",
		Long: `Runs every step instance of a Workflow as local processes: the containers of its pod template
(init containers first), with the same SLUICE_* environment the controller gives pods. Each
instance sees the streaming volume at its own FUSE mount, $SLUICE_DIR; all steps start
together and the filesystem makes consumers wait as the commit and firing rules say.
Container images are ignored. Needs root (or CAP_SYS_ADMIN) and /dev/fuse.

Permanent outputs are copied to --out. The work directory (node store, mounts, per-instance
logs) is removed after a successful run unless --keep, and kept after a failure; a reused
--work is cleared of the earlier run first. The views are mounted in a mount namespace of
the run's own (--private-mounts): they are not visible to other processes of the machine,
and a killed run leaves none behind.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			// Bad flag values are usage errors, refused before anything is read or started.
			if opts.Nodes < 1 {
				return usageError(cmd, fmt.Errorf("--nodes %d: the number of node stores must be at least 1", opts.Nodes))
			}
			if objURL != "" {
				if err := objstore.CheckURL(objURL); err != nil {
					return usageError(cmd, fmt.Errorf("--objstore: %w", err))
				}
			}
			res, err := validation.LoadFile(cmd.Context(), args[0])
			if err != nil {
				return &exitcode.Error{Code: 1, Err: err}
			}
			// What sluice run cannot run is refused before anything starts.
			if errs := runner.Check(res.Workflow); len(errs) > 0 {
				return &exitcode.Error{Code: 1, Err: &validation.Error{File: args[0], Errs: errs}}
			}
			if err := runner.CheckPrivileges(); err != nil {
				return &exitcode.Error{Code: 2, Err: err}
			}
			if privateMounts && !inPrivateMountNS() {
				return runInPrivateMountNS(cmd.Context())
			}
			if inPrivateMountNS() {
				if err := makeMountsPrivate(); err != nil {
					return &exitcode.Error{Code: 2, Err: err}
				}
			}
			stderr := cmd.ErrOrStderr()
			warn(stderr, append(res.Warnings, runner.Warnings(res.Workflow)...))
			if !quiet {
				fmt.Fprintf(stderr, "sluice run: %s (%s); container images are ignored, steps run as local processes\n", res.Workflow.Name, plural(len(res.Workflow.Spec.Steps), "step"))
				isTerm := false
				if f, ok := stderr.(*os.File); ok {
					isTerm = term.IsTerminal(int(f.Fd()))
				}
				opts.Progress = runner.NewProgress(stderr, isTerm, 10*time.Second)
				if lw := runner.LogWriter(opts.Progress); lw != nil {
					// log lines above the live view, never through it
					klog.LogToStderr(false)
					klog.SetOutput(lw)
				}
			}
			opts.Log = klog.NewKlogr().WithName("run")
			opts.Credentials = objstore.CredentialsFromEnv()
			if objURL != "" {
				st, err := objstore.Open(cmd.Context(), objURL, objstore.CredentialsFromEnv())
				if err != nil {
					return &exitcode.Error{Code: 2, Err: err}
				}
				opts.ObjStore = st
			}
			rep, runErr := runner.Run(cmd.Context(), res.Workflow, res.Rules, opts)
			if rep == nil {
				return &exitcode.Error{Code: 1, Err: runErr}
			}
			out := cmd.OutOrStdout()
			if !quiet {
				rep.WriteTable(out)
			}
			if jsonReport != "" {
				if err := rep.WriteJSON(jsonReport); err != nil {
					return &exitcode.Error{Code: 1, Err: err}
				}
			}
			for _, o := range rep.Outputs {
				fmt.Fprintf(out, "output %s -> %s (%s, sha256 %s)\n", o.Path, o.URI, runner.HumanBytes(o.Size), o.SHA256[:16])
			}
			for _, o := range rep.Removed {
				fmt.Fprintf(out, "removed %s from %s: %s\n", o.Path, o.URI, o.Reason)
			}
			if rep.WorkDir != "" {
				fmt.Fprintf(out, "work directory kept: %s (logs in %s)\n", rep.WorkDir, filepath.Join(rep.WorkDir, "logs"))
			}
			if runErr != nil {
				return &exitcode.Error{Code: 1, Err: runErr}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.WorkDir, "work", "", "work directory for the node store, mounts and logs (default: a new temporary directory)")
	f.BoolVar(&opts.Keep, "keep", false, "keep the work directory after a successful run")
	f.StringVar(&opts.OutDir, "out", "", "directory for permanent outputs (default ./sluice-out/<workflow>)")
	f.StringVar(&objURL, "objstore", "", "object storage for permanent outputs instead of --out: file:///dir or s3://bucket/prefix?endpoint=host:port (keys from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)")
	f.DurationVar(&opts.Timeout, "timeout", 0, "stop the whole run after this long (0: no limit)")
	f.DurationVar(&opts.WaitTimeout, "wait-timeout", 0, "bound of each wait on one file (default: spec.waitTimeout, or 1h)")
	f.DurationVar(&opts.SpaceWait, "space-wait", 10*time.Second, "how long a write waits for space in a full store before ENOSPC")
	f.Var(&opts.Passthrough, "passthrough", "FUSE passthrough (Linux >= 6.9): auto uses it where the kernel offers it, on fails the run where it does not, off serves every read and write in sluice")
	f.StringVar(&jsonReport, "json", "", "also write the report as JSON to this file")
	f.IntVar(&opts.Nodes, "nodes", 1, "number of node stores; instances are spread over them round-robin and all traffic between them goes through NATS")
	f.StringVar(&opts.NATSURL, "nats", "", "NATS server URL (default: an embedded server with JetStream on disk under the work directory, when --nodes > 1)")
	f.BoolVar(&quiet, "quiet", false, "no progress view and no report table")
	f.BoolVar(&privateMounts, "private-mounts", true, "mount the views in a mount namespace of the run's own, so that they never appear outside it and go with the run even when it is killed")
	return cmd
}
