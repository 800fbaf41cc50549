package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"os"
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
Secret), the server reloads its configuration, as on SIGHUP.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			srv, err := startNATSServer(config)
			if err != nil {
				return err
			}
			if len(watch) > 0 {
				go reloadOnChange(cmd.Context(), srv, watch, reloadEvery, klog.NewKlogr().WithName("nats-server"))
			}
			srv.WaitForShutdown()
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&config, "config", "/etc/nats/nats.conf", "nats-server configuration file")
	f.StringSliceVar(&watch, "reload-on-change", nil, "files (the TLS certificate and key) whose change makes the server reload its configuration")
	f.DurationVar(&reloadEvery, "reload-check-every", 30*time.Second, "how often the files of --reload-on-change are read")
	return cmd
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

// reloadOnChange reloads srv's configuration (as SIGHUP does) whenever the content of
// one of files changes, read every interval, until ctx ends. nats-server reads its TLS
// certificate only when it loads its configuration, and the kubelet replaces a mounted
// Secret's files when the Secret changes: so a renewed certificate is served without a
// restart. A reload that fails (a certificate without its new key yet) is tried again at
// the next change or interval.
func reloadOnChange(ctx context.Context, srv *server.Server, files []string, interval time.Duration, log logr.Logger) {
	digest := func() []byte {
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
	loaded := digest()
	pending := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
		now := digest()
		if !pending && bytes.Equal(now, loaded) {
			continue
		}
		if err := srv.Reload(); err != nil {
			log.Error(err, "reloading the configuration after a watched file changed", "files", files)
			pending = true
			continue
		}
		log.Info("reloaded the configuration: a watched file changed", "files", files)
		loaded, pending = now, false
	}
}
