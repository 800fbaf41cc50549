package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	"github.com/sluice-io/sluice/internal/objstore"
	"github.com/sluice-io/sluice/internal/trust"
)

func newMinIOSetupCommand() *cobra.Command {
	var endpoint, bucket, caFile string
	var secure bool
	cmd := &cobra.Command{
		Use:   "minio-setup",
		Short: "Give the installation its own user in the bundled MinIO, then wait",
		Long: `Runs beside the bundled MinIO, the only place that holds MinIO's root keys
($MINIO_ROOT_USER, $MINIO_ROOT_PASSWORD). It makes the policy sluice-controller (the
--bucket bucket's objects, and creating it; administering MinIO's users, policies and
service accounts; nothing else) and the installation's user ($SLUICE_STORAGE_ACCESS_KEY,
$SLUICE_STORAGE_SECRET_KEY) with it, which the controller uses to give each namespace a
MinIO user of its own and each workflow a service account of it limited to the
workflow's prefix. It retries
until MinIO answers, then waits for SIGTERM (MinIO keeps users across its restarts in the
pod; a new pod runs this again).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := klog.NewKlogr().WithName("minio-setup")
			ctx := cmd.Context()
			env := map[string]string{}
			for _, k := range []string{"MINIO_ROOT_USER", "MINIO_ROOT_PASSWORD", "SLUICE_STORAGE_ACCESS_KEY", "SLUICE_STORAGE_SECRET_KEY"} {
				if env[k] = os.Getenv(k); env[k] == "" {
					return fmt.Errorf("$%s is required", k)
				}
			}
			root := objstore.Credentials{AccessKey: env["MINIO_ROOT_USER"], SecretKey: env["MINIO_ROOT_PASSWORD"]}
			if caFile != "" {
				if !secure {
					return fmt.Errorf("--ca-file needs --secure: MinIO is reached over TLS only")
				}
				var err error
				if root.CA, err = trust.ReadFile(caFile); err != nil {
					return fmt.Errorf("--ca-file: %w", err)
				}
			}
			wait := time.Second
			for attempt := 1; ; attempt++ {
				actx, cancel := context.WithTimeout(ctx, 10*time.Second)
				err := objstore.SetupMinIOUser(actx, endpoint, secure, root,
					env["SLUICE_STORAGE_ACCESS_KEY"], env["SLUICE_STORAGE_SECRET_KEY"], bucket)
				cancel()
				if err == nil {
					break
				}
				if ctx.Err() != nil {
					return err
				}
				if attempt%10 == 0 {
					log.Info("MinIO not set up yet; retrying", "endpoint", endpoint, "attempt", attempt, "err", err.Error())
				}
				select {
				case <-ctx.Done():
					return err
				case <-time.After(wait):
				}
				wait = min(2*wait, 5*time.Second)
			}
			log.Info("the installation's MinIO user and policy are set up", "user", env["SLUICE_STORAGE_ACCESS_KEY"],
				"policy", objstore.ControllerPolicyName, "bucket", bucket)
			<-ctx.Done()
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&endpoint, "endpoint", "127.0.0.1:9000", "MinIO's S3 endpoint host:port")
	f.BoolVar(&secure, "secure", false, "use TLS to reach MinIO")
	f.StringVar(&caFile, "ca-file", "", "with --secure: the CA certificate (PEM) MinIO's certificate must chain to, besides the system's roots (the installation's ca.crt)")
	f.StringVar(&bucket, "bucket", "sluice", "the installation's bucket (the controller's --storage-bucket)")
	addLogFlags(cmd)
	return cmd
}
