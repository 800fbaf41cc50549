package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/spf13/cobra"
	"k8s.io/klog/v2"
)

func newNATSServerCommand() *cobra.Command {
	var (
		config      string
		watch       []string
		reloadEvery time.Duration
	)
	cmd := &cobra.Command{
		Use:   "nats-server",
		Short: "Run nats-server (the one embedded in sluice) with a configuration file",
		Long: `Run the nats-server library Sluice embeds, configured by --config (as the controller
writes it: operator, accounts, JetStream, TLS). It lets one image serve every part of an
installation; a stock nats image with the same file works as well. When a file named by
--reload-on-change changes (a renewed TLS certificate the kubelet puts into the mounted
Secret), the server reloads its configuration, as on SIGHUP. In a container with a
memory limit (cgroup v2 memory.max) and no GOMEMLIMIT, the Go runtime's soft memory
limit is set to 90% of it, so that the server collects garbage before the kernel kills
it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit, ok := goMemoryLimit(os.Getenv("GOMEMLIMIT"), cgroupMemoryMax); ok {
				debug.SetMemoryLimit(limit)
			}
			loaded := digestFiles(watch) // before the server reads them
			srv, err := startNATSServer(config)
			if err != nil {
				return err
			}
			failed := make(chan error, 1)
			if len(watch) > 0 {
				go func() {
					failed <- reloadOnChange(cmd.Context(), srv, watch, loaded, reloadEvery, reloadGiveUp, nil, klog.NewKlogr().WithName("nats-server"))
				}()
			}
			srv.WaitForShutdown()
			select {
			case err := <-failed:
				return err // the container restarts with the whole configuration
			default:
				return nil
			}
		},
	}
	f := cmd.Flags()
	f.StringVar(&config, "config", "/etc/nats/nats.conf", "nats-server configuration file")
	f.StringSliceVar(&watch, "reload-on-change", nil, "files (the TLS certificate and key) whose change makes the server reload its configuration")
	f.DurationVar(&reloadEvery, "reload-check-every", 30*time.Second, "how often the files of --reload-on-change are read")
	return cmd
}

// cgroupMemoryMax is the cgroup v2 file holding the container's memory limit.
const cgroupMemoryMax = "/sys/fs/cgroup/memory.max"

// goMemoryLimit returns the Go runtime soft memory limit for a process whose GOMEMLIMIT
// is env: none (false) when env is set (the runtime applies it) or the cgroup file at
// path does not say a limit ("max", missing); else 90% of that limit, in bytes.
func goMemoryLimit(env, path string) (int64, bool) {
	if env != "" {
		return 0, false
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil || n <= 0 {
		return 0, false
	}
	return n / 10 * 9, true
}

// startNATSServer starts nats-server with the configuration file config.
func startNATSServer(config string) (*server.Server, error) {
	opts, err := server.ProcessConfigFile(config)
	if err != nil {
		return nil, fmt.Errorf("--config %s: %w", config, err)
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("nats-server: %w", err)
	}
	srv.ConfigureLogger()
	if err := server.Run(srv); err != nil {
		return nil, err
	}
	return srv, nil
}

// reloadGiveUp is how long reloadOnChange retries a reload that keeps failing before it
// shuts the server down to be restarted.
const reloadGiveUp = 5 * time.Minute

// digestFiles returns a digest of the contents of files (a missing one counts as such).
func digestFiles(files []string) []byte {
	h := sha256.New()
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			fmt.Fprintf(h, "missing %s\n", f)
			continue
		}
		h.Write(b)
	}
	return h.Sum(nil)
}

// reloadOnChange reloads srv's configuration (as SIGHUP does) whenever the content of
// one of files changes from what digestFiles gave as loaded (taken before srv read
// them), read every interval, until ctx ends (it then returns nil).
// nats-server reads its TLS certificate only when it loads its configuration, and the
// kubelet replaces a mounted Secret's files when the Secret changes: so a renewed
// certificate is served without a restart. A reload that fails (a certificate without
// its new key yet) is tried again at the next interval; one that still fails after
// giveUp (nats-server refuses to reload some changes, such as a rewritten quota or
// resolver, which the controller's nats.conf may carry by then) shuts srv down and
// returns the error, so that the container restarts with the whole configuration, as
// such a change needs anyway. reloaded, if not nil, is called after each reload that
// succeeded.
func reloadOnChange(ctx context.Context, srv *server.Server, files []string, loaded []byte, interval, giveUp time.Duration, reloaded func(), log logr.Logger) error {
	var failingSince time.Time // zero: no reload pending
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(interval):
		}
		now := digestFiles(files)
		if failingSince.IsZero() && bytes.Equal(now, loaded) {
			continue
		}
		err := srv.Reload()
		if err == nil {
			log.Info("reloaded the configuration: a watched file changed", "files", files)
			loaded, failingSince = now, time.Time{}
			if reloaded != nil {
				reloaded()
			}
			continue
		}
		if failingSince.IsZero() {
			failingSince = time.Now()
		}
		log.Error(err, "reloading the configuration after a watched file changed", "files", files, "failingFor", time.Since(failingSince).Round(time.Second).String())
		if time.Since(failingSince) >= giveUp {
			srv.Shutdown()
			return fmt.Errorf("reloading the configuration failed for %s (%w): restarting with it", giveUp, err)
		}
	}
}
