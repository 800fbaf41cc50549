package main

import (
	"fmt"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/spf13/cobra"
)

func newNATSServerCommand() *cobra.Command {
	var config string
	cmd := &cobra.Command{
		Use:   "nats-server",
		Short: "Run nats-server (the one embedded in sluice) with a configuration file",
		Long: `Run the nats-server library Sluice embeds, configured by --config (as the controller
writes it: operator, accounts, JetStream). It lets one image serve every part of an
installation; a stock nats image with the same file works as well.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts, err := server.ProcessConfigFile(config)
			if err != nil {
				return fmt.Errorf("--config %s: %w", config, err)
			}
			srv, err := server.NewServer(opts)
			if err != nil {
				return fmt.Errorf("nats-server: %w", err)
			}
			srv.ConfigureLogger()
			if err := server.Run(srv); err != nil {
				return err
			}
			srv.WaitForShutdown()
			return nil
		},
	}
	cmd.Flags().StringVar(&config, "config", "/etc/nats/nats.conf", "nats-server configuration file")
	return cmd
}
