package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/controller"
	"github.com/sluice-io/sluice/controller/certs"
	"github.com/sluice-io/sluice/controller/inject"
	"github.com/sluice-io/sluice/controller/podwebhook"
	"github.com/sluice-io/sluice/internal/natsauth"
	"github.com/sluice-io/sluice/internal/objstore"
	"github.com/sluice-io/sluice/internal/podconfig"
	"github.com/sluice-io/sluice/internal/volumemark"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

func newControllerCommand() *cobra.Command {
	var (
		namespace, natsURL, natsSecret, agentNamespace string
		agentUserRange                                 string
		storageEndpoint, storageSecret, storageBucket  string
		storageAccounts, storageAdminEndpoint          string
		storageSecure                                  bool
		webhookPort                                    int
		certDir, certSecret, webhookSvc, webhookConfig string
		metricsAddr, healthAddr                        string
		leaderElect, manageCerts                       bool
		injectOpts                                     inject.Options
		pullPolicy                                     string
		deadlockGrace                                  time.Duration
		nodeLostGrace                                  time.Duration
		markSecret                                     string
		workers                                        int
		natsStorage, wfStreamBytes, wfBucketBytes      string
		natsStreams, nsWorkflows, nsConns, nsConsumers int64
		wfMaxAge                                       time.Duration
		memoryMax, diskMax                             string
		tlsOpts                                        installationTLS
	)
	cmd := &cobra.Command{
		Use:   "controller",
		Short: "Run the Workflow controller and the pod injection webhook",
		Long: `Reconcile Workflows (streams, sidecar configuration, step pods, placement, status,
cleanup) and serve the mutating webhook that injects pods labelled sluice.io/inject=true.
On first start it creates the installation's NATS identities (Secret --nats-secret) and the
webhook's certificates (Secret --cert-secret), and keeps the webhook's caBundle current;
with --manage-certs=false it serves the certificate another issuer (cert-manager) writes
into --cert-dir instead.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := klog.NewKlogr().WithName("controller")
			ctrl.SetLogger(log)
			ctx := cmd.Context()
			if namespace == "" {
				return fmt.Errorf("--namespace (or $POD_NAMESPACE) is required")
			}
			if injectOpts.Image == "" {
				return fmt.Errorf("--sidecar-image (or $SLUICE_IMAGE) is required")
			}
			agentUsers, err := controller.ParseAgentUsers(agentUserRange)
			if err != nil {
				return err
			}
			var tierMax [2]int64
			for i, f := range []struct{ flag, v string }{{"--workflow-memory-max", memoryMax}, {"--workflow-disk-max", diskMax}} {
				n, err := parseSize(f.flag, f.v)
				if err != nil {
					return err
				}
				tierMax[i] = n
			}
			quota, limits, err := natsBounds(natsStorage, natsStreams, wfStreamBytes, wfBucketBytes, wfMaxAge)
			if err != nil {
				return err
			}
			nsQuota := natsauth.NamespaceQuota{Workflows: nsWorkflows, Connections: nsConns, ConsumersPerStream: nsConsumers}
			if err := nsQuota.Validate(); err != nil {
				return fmt.Errorf("--nats-namespace-workflows, --nats-namespace-connections, --nats-namespace-consumers-per-stream: %w", err)
			}
			// Each workflow's streams get the consumers its pods need, within what its
			// namespace account allows a stream; unused consumers go after a minute.
			limits.MaxConsumers, limits.ConsumerInactive = int(nsQuota.Consumers()), wfmeta.ConsumerInactive
			injectOpts.ImagePullPolicy = corev1.PullPolicy(pullPolicy)
			cfg, err := ctrl.GetConfig()
			if err != nil {
				return fmt.Errorf("kubeconfig: %w", err)
			}
			direct, err := client.New(cfg, client.Options{Scheme: scheme()})
			if err != nil {
				return err
			}
			keys, rewrote, err := natsauth.Bootstrap(ctx, direct, namespace, natsSecret, quota, tlsOpts.natsDir)
			if err != nil {
				return err
			}
			if rewrote {
				log.Info("the NATS server's configuration was rewritten (the installation account's quota changed, or it predates namespace accounts); it applies when the NATS server restarts",
					"secret", natsSecret, "storage", quota.Storage, "streams", quota.Streams)
			}
			if markSecret != "" {
				if injectOpts.MarkKey, err = volumemark.Bootstrap(ctx, direct, namespace, markSecret); err != nil {
					return fmt.Errorf("the volume mark key: %w", err)
				}
			}
			// After the NATS configuration: a NATS pod waiting for this Secret starts with
			// the configuration that serves TLS.
			ca, tlsCerts, err := tlsOpts.ensure(ctx, direct, namespace, log)
			if err != nil {
				return err
			}
			jwtTok, seed, err := keys.User("sluice-controller", nil)
			if err != nil {
				return err
			}
			natsOpts, err := natsTLS(ca)
			if err != nil {
				return err
			}
			nc, err := nats.Connect(natsURL, append(natsOpts, nats.UserJWTAndSeed(jwtTok, seed), nats.Name("sluice-controller"),
				nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1), nats.ReconnectWait(time.Second))...)
			if err != nil {
				return fmt.Errorf("connecting to NATS at %s: %w", natsURL, err)
			}
			defer nc.Close()
			js, err := jetstream.New(nc)
			if err != nil {
				return err
			}
			// Each namespace's workflows are in an account of their own, pushed to the
			// server through the system account; nc's account keeps the workflows made
			// before, until they are removed.
			accounts, err := natsauth.NewAccounts(natsURL, keys, nsQuota, limits.MaxAge, log.WithName("nats-accounts"), natsOpts...)
			if err != nil {
				return err
			}
			defer accounts.Close()

			var storage *podconfig.Storage
			if storageEndpoint != "" {
				var sec corev1.Secret
				if err := direct.Get(ctx, types.NamespacedName{Namespace: namespace, Name: storageSecret}, &sec); err != nil {
					return fmt.Errorf("--storage-secret %s/%s: %w", namespace, storageSecret, err)
				}
				storage = &podconfig.Storage{Endpoint: storageEndpoint, Secure: storageSecure, Bucket: storageBucket,
					AccessKey: string(sec.Data["accessKey"]), SecretKey: string(sec.Data["secretKey"])}
				if storage.AccessKey == "" || storage.SecretKey == "" {
					return fmt.Errorf("--storage-secret %s/%s must hold keys accessKey and secretKey", namespace, storageSecret)
				}
			}

			// Each workflow gets keys of its own that reach only the workflow's prefix (a
			// MinIO service account, a versitygw account); the installation's keys stay here.
			var storageCA []byte // the installation's CA, when its storage serves TLS
			if storage != nil && storage.Secure {
				storageCA = ca
			}
			workflowAccounts, err := newStorageAccounts(storageAccounts, storage, storageAdminEndpoint, storageCA)
			if err != nil {
				return err
			}

			var bucketReady atomic.Bool
			if storage != nil {
				go func() {
					if ensureBucket(ctx, log, storage, storageCA) {
						bucketReady.Store(true)
					}
				}()
			}
			certs := &certs.Certs{Client: direct, Namespace: namespace, SecretName: certSecret, Services: []string{webhookSvc},
				WebhookConfig: webhookConfig, CertDir: certDir, Log: log.WithName("certs")}
			if manageCerts {
				if _, err := certs.Ensure(ctx); err != nil {
					return err
				}
			} else if err := certsPresent(certDir); err != nil {
				return err
			}

			mgr, err := ctrl.NewManager(cfg, ctrl.Options{
				Scheme:                  scheme(),
				Metrics:                 metricsserver.Options{BindAddress: metricsAddr},
				HealthProbeBindAddress:  healthAddr,
				LeaderElection:          leaderElect,
				LeaderElectionID:        "sluice-controller.sluice.io",
				LeaderElectionNamespace: namespace,
				WebhookServer:           controller.NewWebhookServer(webhook.Options{Port: webhookPort, CertDir: certDir}),
				// Secrets are read uncached: the controller needs no list or watch of them.
				Client: controller.ManagerClientOptions(),
			})
			if err != nil {
				return fmt.Errorf("controller manager: %w", err)
			}
			r := &controller.WorkflowReconciler{
				Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(),
				// The core/v1 Events the e2e suite and `kubectl describe` read; moving to
				// the events.k8s.io recorder is a change of API for users, not a refactor.
				Recorder: mgr.GetEventRecorderFor("sluice-controller"), //nolint:staticcheck // SA1019, see above
				Streams:  &controller.JetStreams{JS: js, Keys: keys, Accounts: accounts, Limits: limits},
				Inject:   injectOpts, NATSURL: natsURL, CA: ca, Storage: storage, AgentNamespace: agentNamespace, AgentUsers: agentUsers,
				StorageReady: bucketReady.Load, StorageAccounts: workflowAccounts,
				DeadlockGrace: deadlockGrace, NodeLostGrace: nodeLostGrace, Workers: workers,
				WorkflowMemoryMax: tierMax[0], WorkflowDiskMax: tierMax[1],
			}
			if err := r.SetupWithManager(mgr); err != nil {
				return err
			}
			if manageCerts {
				if err := certs.SetupWithManager(mgr); err != nil {
					return err
				}
			}
			if tlsCerts != nil { // renews the bundled servers' certificate
				if err := tlsCerts.SetupWithManager(mgr); err != nil {
					return err
				}
			}
			mgr.GetWebhookServer().Register(podwebhook.InjectPath, &webhook.Admission{Handler: &podwebhook.PodInjector{
				Reader: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Decoder: admission.NewDecoder(mgr.GetScheme()), Options: injectOpts,
				Recorder: mgr.GetEventRecorderFor("sluice-webhook"), AgentUser: r.EnsureAgentUser}}) //nolint:staticcheck // SA1019: core/v1 Events, as the reconciler's
			if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
				return err
			}
			if err := mgr.AddReadyzCheck("webhook", mgr.GetWebhookServer().StartedChecker()); err != nil {
				return err
			}
			log.Info("starting", "namespace", namespace, "nats", natsURL, "sidecarImage", injectOpts.Image)
			return mgr.Start(ctx)
		},
	}
	f := cmd.Flags()
	f.StringVar(&namespace, "namespace", envOr("POD_NAMESPACE", ""), "namespace Sluice runs in (default $POD_NAMESPACE)")
	f.StringVar(&natsURL, "nats-url", "nats://sluice-nats:4222", "NATS URL, as the sidecars reach it")
	f.StringVar(&agentUserRange, "agent-users", "2100000000-2100065535", "FIRST-LAST: the user IDs the workflows' sidecars and store servers run as, a different one for each workflow (status.agentUser), so that no two share the kernel's per-user limits; no other process of the nodes should run as one (empty: all run as 65532)")
	f.StringVar(&agentNamespace, "agent-namespace", v1alpha1.DefaultAgentNamespace, "namespace of the workflows' agent Secrets (the NATS connection of each workflow's store servers), which the CSI node plugins read and nothing else is kept in (empty: none, and no store server serves)")
	f.StringVar(&natsSecret, "nats-secret", "sluice-nats", "Secret holding the NATS keys and server configuration (created if missing)")
	f.StringVar(&storageEndpoint, "storage-endpoint", "", "S3 endpoint host:port of the installation's object storage (empty: none)")
	f.StringVar(&storageSecret, "storage-secret", "sluice-storage", "Secret (keys accessKey, secretKey) of the installation's object-storage user: not the server's root; it makes each workflow keys of its own (--storage-accounts)")
	f.StringVar(&storageBucket, "storage-bucket", "sluice", "bucket of permanent outputs for workflows that name none")
	f.BoolVar(&storageSecure, "storage-secure", false, "use TLS to reach the object storage")
	f.StringVar(&storageAccounts, "storage-accounts", storageAccountsMinIO, "how the installation's object storage gives each workflow keys of its own: "+
		"minio (a service account of the namespace's MinIO user, through MinIO's admin API), "+
		"versitygw (an account of versitygw's own IAM, granted its prefix by the bucket's policy; --storage-admin-endpoint names the admin API), "+
		"or none (any other S3 server: workflows bring their keys, spec.storage.secretRef)")
	f.StringVar(&storageAdminEndpoint, "storage-admin-endpoint", "", "host:port of the object storage's admin API when it is not --storage-endpoint (versitygw's --admin-port)")
	f.IntVar(&webhookPort, "webhook-port", 9443, "webhook HTTPS port")
	f.StringVar(&certDir, "cert-dir", os.TempDir()+"/sluice-webhook", "where the webhook's serving certificate is written")
	f.StringVar(&certSecret, "cert-secret", "sluice-webhook-cert", "Secret holding the webhook CA and certificate (created and rotated)")
	f.BoolVar(&manageCerts, "manage-certs", true, "issue, rotate and inject the webhook's certificate; false: serve tls.crt and tls.key from --cert-dir as another issuer (cert-manager) keeps them, reloading on change")
	f.StringVar(&webhookSvc, "webhook-service", "sluice-webhook", "the webhook's Service name")
	f.StringVar(&webhookConfig, "webhook-config", "sluice", "the MutatingWebhookConfiguration whose caBundle is managed")
	f.StringVar(&metricsAddr, "metrics-addr", ":8080", "controller metrics address (0: off)")
	f.StringVar(&healthAddr, "health-addr", ":8081", "healthz/readyz address")
	f.BoolVar(&leaderElect, "leader-elect", false, "use leader election (several replicas)")
	f.StringVar(&injectOpts.Image, "sidecar-image", envOr("SLUICE_IMAGE", ""), "image of the injected sidecar (default $SLUICE_IMAGE)")
	f.StringVar(&pullPolicy, "sidecar-pull-policy", "IfNotPresent", "imagePullPolicy of the injected sidecar")
	f.StringVar(&injectOpts.Driver, "driver-name", v1alpha1.DriverName, "CSI driver name")
	f.StringVar(&markSecret, "volume-mark-secret", "sluice-volume-mark", "Secret holding the key that marks injected volumes, which the CSI node plugins check (created if missing; empty: no marks)")
	f.IntVar(&workers, "workers", controller.DefaultWorkers, "Workflows reconciled at once")
	f.DurationVar(&deadlockGrace, "deadlock-grace", controller.DefaultDeadlockGrace, "fail a workflow as Deadlocked once every unfinished pod has waited on the rules with no progress for this long (negative: never)")
	f.DurationVar(&nodeLostGrace, "node-lost-grace", controller.DefaultNodeLostGrace, "take a node for lost once its Ready condition has been False or Unknown this long (or its Node is deleted): "+
		"its pods' attempts fail (NodeLost) and are retried on other nodes, and the files held only there are reported lost. The node lifecycle controller marks a silent node Unknown "+
		"after 40-50 s; this grace more spares a kubelet or network that comes straight back, and still acts minutes before the pods are evicted (300 s). Negative: never")
	f.StringVar(&natsStorage, "nats-account-storage", quantity(natsauth.DefaultQuota.Storage), "JetStream file storage of the installation's NATS account, which holds the workflows "+
		"made before namespace accounts (an upgrade): nats-server gives that account no JetStream unless it is at most 75% of the space free on its volume when it starts")
	f.Int64Var(&natsStreams, "nats-account-streams", natsauth.DefaultQuota.Streams, "streams of the installation's NATS account (two per workflow made before namespace accounts)")
	f.Int64Var(&nsWorkflows, "nats-namespace-workflows", natsauth.DefaultNamespaceQuota.Workflows, "workflows of one namespace provisioned at once on the NATS server: each namespace's workflows are in a NATS account "+
		"of their own, allowed two streams per workflow, so one namespace cannot take the others' slots (at the default workflow limits, 7: 1Gi); the next is retried, with a NATSError event, until one of the namespace's is removed")
	f.Int64Var(&nsConns, "nats-namespace-connections", natsauth.DefaultNamespaceQuota.Connections, "client connections one namespace's NATS account may hold at once: "+
		"a sidecar per running pod of its workflows, a store server per node and workflow, and the controller's; beyond it the server refuses the next")
	f.Int64Var(&nsConsumers, "nats-namespace-consumers-per-stream", natsauth.DefaultNamespaceQuota.ConsumersPerStream, "consumers one stream of a namespace's NATS account may have "+
		"(each workflow's streams get 3 per pod and 32 within it, and a consumer unused for a minute goes): 512 serve a workflow of 160 pods at once; a namespace holds at most 2 × workflows × this")
	f.StringVar(&wfStreamBytes, "nats-workflow-stream-bytes", quantity(wfmeta.DefaultLimits.StreamBytes), "MaxBytes of each workflow's stream: its events (a few hundred bytes per write, close, rename) "+
		"and the bytes of its replicate: Stream files. Once full it refuses new messages, never drops recorded ones: the files whose events it refused fail")
	f.StringVar(&wfBucketBytes, "nats-workflow-bucket-bytes", quantity(wfmeta.DefaultLimits.BucketBytes), "MaxBytes of each workflow's KV bucket (file records of a few hundred bytes, terminations, pod counters)")
	f.DurationVar(&wfMaxAge, "nats-workflow-max-age", wfmeta.DefaultLimits.MaxAge, "how long a workflow's stream and bucket keep a message: a workflow nobody removed loses its records after it, so it must exceed any run")
	f.StringVar(&memoryMax, "workflow-memory-max", "", "refuse Workflows whose spec.volume.sizeLimit exceeds this (SizeNotPermitted): the CSI plugins' --workflow-memory-max (empty: no maximum)")
	f.StringVar(&diskMax, "workflow-disk-max", "", "refuse Workflows whose spec.volume.disk.sizeLimit exceeds this (SizeNotPermitted): the CSI plugins' --workflow-disk-max (empty: no maximum)")
	tlsOpts.addFlags(f)
	addLogFlags(cmd)
	return cmd
}

// quantity formats bytes as a Kubernetes quantity ("4Gi").
func quantity(bytes int64) string { return resource.NewQuantity(bytes, resource.BinarySI).String() }

// natsBounds returns the installation's NATS account quota and each workflow's limits
// from the controller's flags (quantities such as "4Gi"), checking that one workflow
// fits in the quota.
func natsBounds(storage string, streams int64, streamBytes, bucketBytes string, maxAge time.Duration) (natsauth.Quota, wfmeta.Limits, error) {
	var sizes [3]int64
	for i, f := range []struct{ flag, v string }{{"--nats-account-storage", storage}, {"--nats-workflow-stream-bytes", streamBytes}, {"--nats-workflow-bucket-bytes", bucketBytes}} {
		q, err := resource.ParseQuantity(f.v)
		if err != nil {
			return natsauth.Quota{}, wfmeta.Limits{}, fmt.Errorf("%s %q: %w", f.flag, f.v, err)
		}
		sizes[i] = q.Value()
	}
	quota := natsauth.Quota{Storage: sizes[0], Streams: streams}
	limits := wfmeta.Limits{StreamBytes: sizes[1], BucketBytes: sizes[2], MaxAge: maxAge}
	if err := quota.Validate(); err != nil {
		return quota, limits, err
	}
	if err := limits.Validate(); err != nil {
		return quota, limits, err
	}
	if limits.StreamBytes+limits.BucketBytes > quota.Storage {
		return quota, limits, fmt.Errorf("--nats-workflow-stream-bytes %s and --nats-workflow-bucket-bytes %s exceed --nats-account-storage %s: no workflow would fit", streamBytes, bucketBytes, storage)
	}
	return quota, limits, nil
}

// ensureBucket creates the installation's default bucket, retrying (with backoff up to
// 5 s) while the object storage is not reachable yet, until it exists (true) or ctx ends
// or no client can be made (false). Over TLS the storage's certificate must chain to ca
// or the system's roots.
func ensureBucket(ctx context.Context, log logr.Logger, s *podconfig.Storage, ca []byte) bool {
	tr, err := objstore.Transport(s.Endpoint, s.Secure, ca)
	if err != nil {
		log.Error(err, "object storage client", "endpoint", s.Endpoint)
		return false
	}
	wait := time.Second
	for attempt := 1; ; attempt++ {
		// A new client each time: one that met the storage while it was starting kept
		// answering NoSuchBucket for a bucket that existed (seen on a fresh cluster).
		mc, err := minio.New(s.Endpoint, &minio.Options{Creds: credentials.NewStaticV4(s.AccessKey, s.SecretKey, ""), Secure: s.Secure, Transport: tr})
		if err != nil {
			log.Error(err, "object storage client", "endpoint", s.Endpoint)
			return false
		}
		// Each attempt is bounded: a first connection to a Service whose proxy rules
		// are not in place yet can hang far longer than the storage takes to come up.
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ok, err := mc.BucketExists(actx, s.Bucket)
		if err == nil && !ok {
			err = mc.MakeBucket(actx, s.Bucket, minio.MakeBucketOptions{})
		}
		cancel()
		if err == nil {
			log.Info("object storage bucket ready", "endpoint", s.Endpoint, "bucket", s.Bucket)
			return true
		}
		l := log.V(1)
		if attempt%10 == 0 {
			l = log // say it now and then: workflows that store there wait for it
		}
		l.Info("object storage not ready; retrying", "endpoint", s.Endpoint, "bucket", s.Bucket, "attempt", attempt, "err", err.Error(), "in", wait)
		select {
		case <-ctx.Done():
			return false
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// certsPresent checks that dir holds the webhook's serving certificate and key (tls.crt,
// tls.key) when another issuer manages them, so that a missing mount fails at start with
// the files named rather than at the first admission request.
func certsPresent(dir string) error {
	for _, f := range []string{"tls.crt", "tls.key"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return fmt.Errorf("--manage-certs=false: the webhook certificate: %w", err)
		}
	}
	return nil
}
