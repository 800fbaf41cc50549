package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sluice-io/sluice/api/v1alpha1"
	csidriver "github.com/sluice-io/sluice/csi-driver"
	"github.com/sluice-io/sluice/internal/podconfig"
	"github.com/sluice-io/sluice/internal/storeserver"
	"github.com/sluice-io/sluice/internal/volumemark"
)

func newCSICommand() *cobra.Command {
	var (
		opts       csidriver.Options
		endpoint   string
		storeSize  string
		register   bool
		kubeletDir string
		cleanup    bool
		// serveStores runs the node's store servers (storeserver).
		serveStores bool
		// natsURL, when set, is the NATS server of every store server.
		natsURL string
		// agentNamespace holds the workflows' agent Secrets.
		agentNamespace string
		// markKey is the file of the volume mark key (volumemark.LoadKey).
		markKey string
		// memoryMax, memoryDefault and diskMax are the per-workflow sizes (quantities).
		memoryMax, memoryDefault, diskMax string
		// diskSize bounds the node's disk tiers together (a quantity).
		diskSize string
	)
	cmd := &cobra.Command{
		Use:   "csi",
		Short: "Run the CSI node plugin (DaemonSet): node store, FUSE mounts, hand-off to sidecars",
		Long: `Serve the CSI Identity and Node services for Sluice's ephemeral inline volumes.
The plugin owns the node store (a tmpfs per workflow, sized by its spec.volume.sizeLimit,
together at most --store-size), mounts each pod's streaming
volume at NodePublishVolume and hands its /dev/fuse descriptor to the pod's sidecar. It
must run privileged, with the kubelet's pods directory mounted with Bidirectional
propagation.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := klog.NewKlogr().WithName("csi")
			q, err := resource.ParseQuantity(storeSize)
			if err != nil {
				return fmt.Errorf("--store-size %q: %w", storeSize, err)
			}
			opts.StoreSize = q.Value()
			for _, f := range []struct {
				flag, v string
				to      *int64
			}{
				{"--workflow-memory-max", memoryMax, &opts.WorkflowMemoryMax},
				{"--workflow-memory-default", memoryDefault, &opts.WorkflowMemoryDefault},
				{"--workflow-disk-max", diskMax, &opts.WorkflowDiskMax},
				{"--disk-size", diskSize, &opts.DiskSize},
			} {
				if *f.to, err = parseSize(f.flag, f.v); err != nil {
					return err
				}
			}
			opts.Version = versionString()
			opts.Log = log
			if markKey != "" {
				if opts.MarkKey, err = volumemark.LoadKey(markKey); err != nil {
					return fmt.Errorf("--volume-mark-key: %w", err)
				}
				api, err := apiClient()
				if err != nil {
					return fmt.Errorf("checking volume marks needs the API server: %w", err)
				}
				opts.Workflow = workflowIdentity(api)
			} else {
				log.Info("no --volume-mark-key: every well-formed publish is served, whoever wrote its attributes (not for shared clusters)")
				// The workflow's user still owns its directories, when the API says it.
				if api, err := apiClient(); err == nil {
					opts.Workflow = workflowIdentity(api)
				}
			}
			if opts.StoreSize > 0 || opts.DiskTier != csidriver.DiskTierDirectory {
				// Each workflow's tmpfs and disk tier file system are sized by its Workflow
				// as the API server has it, never by a volume attribute its pods could write.
				api, err := apiClient()
				if err != nil {
					return fmt.Errorf("sizing the workflows' tiers needs the API server (or --store-size=0 --disk-tier=directory): %w", err)
				}
				opts.WorkflowSizes = func(ctx context.Context, ns, name string) (csidriver.WorkflowSizes, error) {
					w, err := getWorkflow(ctx, api, ns, name)
					if err != nil || w == nil {
						return csidriver.WorkflowSizes{}, err
					}
					return workflowSizes(w), nil
				}
			}
			d, err := csidriver.New(opts)
			if err != nil {
				return err
			}
			defer d.Close()
			g, ctx := errgroup.WithContext(cmd.Context())
			g.Go(func() error { return d.Serve(ctx, endpoint) })
			if serveStores {
				api, err := apiClient()
				if err != nil {
					return fmt.Errorf("store servers need the API server (disable with --serve-stores=false): %w", err)
				}
				children, err := storeServerChildren(opts, log.WithName("store-server"), cmd.Flags().Lookup("v").Value.String(), nil)
				if err != nil {
					return fmt.Errorf("store servers cannot run on this node (disable with --serve-stores=false): %w", err)
				}
				servers := storeserver.New(storeserver.Options{
					Node: opts.NodeID, Log: log.WithName("store-server"), DiskOf: d.DiskDirOf, RecordOf: d.RecordDirOf,
					Workflow: func(ctx context.Context, ns, name string) (*v1alpha1.Workflow, error) {
						return getWorkflow(ctx, api, ns, name)
					},
					Connection: func(ctx context.Context, wf *v1alpha1.Workflow) (*podconfig.Connection, error) {
						return getAgentConnection(ctx, api, agentNamespace, wf)
					},
					NATSURL: natsURL,
					Start:   children.Start,
				})
				d.BeforeRetire(servers.Stop)
				g.Go(func() error { return runStoreServers(ctx, d, servers, log.WithName("store-server")) })
			}
			if register {
				name := opts.Name
				if name == "" {
					name = v1alpha1.DriverName
				}
				r := &csidriver.Registrar{
					Name:     name,
					Endpoint: filepath.Join(kubeletDir, "plugins", name, "csi.sock"),
					Socket:   filepath.Join(kubeletDir, "plugins_registry", name+"-reg.sock"),
					Registered: func(ok bool, reason string) {
						log.Info("kubelet plugin registration", "registered", ok, "error", reason)
					},
				}
				g.Go(func() error { return r.Serve(ctx) })
			}
			if cleanup {
				g.Go(func() error { return watchRetirements(ctx, d) })
			}
			return g.Wait()
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Name, "driver-name", v1alpha1.DriverName, "CSI driver name")
	f.StringVar(&endpoint, "endpoint", "unix:///csi/csi.sock", "CSI socket")
	f.StringVar(&opts.NodeID, "node-id", envOr("NODE_NAME", ""), "this node's name (default $NODE_NAME)")
	f.StringVar(&opts.StateDir, "state-dir", "/var/lib/sluice", "directory of the node store and the pods' control directories")
	f.StringVar(&opts.DiskDir, "disk-dir", "", "directory on the node's disk of the workflows' disk tiers (spec.tiers.fs; default <state-dir>/disk)")
	f.StringVar(&storeSize, "store-size", "1Gi", "memory of the node store: the sizes of the workflows' tmpfs mounts add up to at most this; a pod whose workflow does not fit waits (0: use the state directory as it is, unlimited)")
	f.StringVar(&memoryMax, "workflow-memory-max", "", "largest tmpfs of one workflow on a node (caps spec.volume.sizeLimit; give the controller the same; empty: the largest that fits in --store-size with its inodes, 8/9 of it)")
	f.StringVar(&memoryDefault, "workflow-memory-default", "", "tmpfs of a workflow without spec.volume.sizeLimit (empty: an eighth of --store-size)")
	f.StringVar(&opts.DiskTier, "disk-tier", csidriver.DiskTierAuto, "what each workflow's disk tier is: filesystem (an ext4 file system of its size on a loop device: the kernel bounds it; refuse to start without loop devices), directory (a directory its sidecars' store counts), auto (filesystem when the node has loop devices)")
	f.StringVar(&diskSize, "disk-size", "", "with --disk-tier=filesystem, the most the workflows' disk tiers on a node may take together (a quantity; empty: half of what the disk tiers' file system has free when the plugin starts)")
	f.StringVar(&diskMax, "workflow-disk-max", "", "most bytes one workflow's disk tier may hold on a node, whatever its spec.volume.disk.sizeLimit (give the controller the same; empty: with --disk-tier=filesystem an eighth of --disk-size for a workflow without a sizeLimit, --disk-size above it; with directory, no bound beyond the disk's)")
	f.IntVar(&opts.SidecarUID, "sidecar-uid", 65532, "user the sidecars run as (owns the workflow directories)")
	f.IntVar(&opts.SidecarGID, "sidecar-gid", 65532, "group the sidecars run as")
	f.BoolVar(&register, "register-with-kubelet", false, "serve the kubelet plugin registration API (for clusters without node-driver-registrar)")
	f.StringVar(&kubeletDir, "kubelet-dir", "/var/lib/kubelet", "the kubelet's root directory, as the kubelet sees it (with --register-with-kubelet)")
	f.BoolVar(&cleanup, "cleanup", true, "watch Workflows and remove retired workflows' node stores (needs API access)")
	f.BoolVar(&serveStores, "serve-stores", true, "serve each workflow's node store to the other nodes' fetchers after its pods ended (needs the NATS server)")
	f.StringVar(&markKey, "volume-mark-key", "", "file of the key of the injectors' volume marks (the controller's Secret sluice-volume-mark): publishes without a valid mark, or for a Workflow that no longer has the UID they name, are refused; empty: not checked")
	f.StringVar(&natsURL, "nats-url", "", "NATS server of the store servers (default: the URL of the workflow's agent Secret)")
	f.StringVar(&agentNamespace, "agent-namespace", v1alpha1.DefaultAgentNamespace, "namespace of the workflows' agent Secrets, the store servers' NATS connections, which the controller keeps (the controller's --agent-namespace)")
	addLogFlags(cmd)
	cmd.AddCommand(newCSIStoreServerCommand())
	return cmd
}

// storeServerUse names the hidden subcommand of `sluice csi` that is a store server's
// child process.
const storeServerUse = "store-server"

// storeServerChildren is how the plugin runs its store servers: each in a child process
// of this binary (/proc/self/exe, as the kernel has it, whatever became of its path)
// running `csi store-server`, as the sidecars' user, without capabilities, in a root of
// its own mounted at <state dir>/store-server-root in its mount namespace, logging at
// verbosity v; started is told each child's process ID once it serves (nil: nothing).
func storeServerChildren(opts csidriver.Options, log logr.Logger, v string, started func(dir string, pid int)) (*storeserver.Children, error) {
	argv := []string{"/proc/self/exe", "csi", storeServerUse}
	if v != "" {
		argv = append(argv, "--v="+v)
	}
	return storeserver.NewChildren(storeserver.ChildOptions{
		Command: argv, UID: opts.SidecarUID, GID: opts.SidecarGID, Log: log, Started: started,
		RootDir: filepath.Join(opts.StateDir, "store-server-root"),
	})
}

// newCSIStoreServerCommand is the store server's child process, which the plugin starts
// (storeserver.Children); hidden: nobody else runs it.
func newCSIStoreServerCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:    storeServerUse,
		Short:  "Serve one workflow's node store (a child process of the CSI plugin)",
		Long:   `Serve one workflow's node store, configured on standard input by the CSI plugin that started it, as an unprivileged user. Not for use by hand.`,
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return storeserver.RunChild(cmd.Context(), os.Stdin, os.Stdout, klog.NewKlogr().WithName("store-server"))
		},
	}
	addLogFlags(cmd)
	return cmd
}

// apiClient returns a client of the API server that reads without a cache: the plugin
// checks what exists now.
func apiClient() (client.Client, error) {
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return nil, fmt.Errorf("API server configuration: %w", err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme()})
	if err != nil {
		return nil, fmt.Errorf("API client: %w", err)
	}
	return c, nil
}

// workflowIdentity reads, at a publish, what the plugin checks of a Workflow in the API
// server r (csidriver.Options.Workflow).
func workflowIdentity(r client.Reader) func(ctx context.Context, ns, name string) (csidriver.WorkflowIdentity, error) {
	return func(ctx context.Context, ns, name string) (csidriver.WorkflowIdentity, error) {
		w, err := getWorkflow(ctx, r, ns, name)
		if err != nil || w == nil {
			return csidriver.WorkflowIdentity{}, err
		}
		return csidriver.WorkflowIdentity{UID: string(w.UID), User: ptr.Deref(w.Status.AgentUser, 0)}, nil
	}
}

// getAgentConnection reads the agent Secret of wf in namespace ns
// (podconfig.AgentSecretName): nil when the controller has not made it yet. The Secret
// must be labelled as wf's.
func getAgentConnection(ctx context.Context, r client.Reader, ns string, wf *v1alpha1.Workflow) (*podconfig.Connection, error) {
	var sec corev1.Secret
	key := types.NamespacedName{Namespace: ns, Name: podconfig.AgentSecretName(string(wf.UID))}
	err := r.Get(ctx, key, &sec)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the agent Secret %s: %w", key, err)
	}
	if sec.Labels[v1alpha1.LabelAgentNamespace] != wf.Namespace || sec.Labels[v1alpha1.LabelWorkflow] != wf.Name {
		return nil, fmt.Errorf("the agent Secret %s is not labelled as workflow %s/%s's", key, wf.Namespace, wf.Name)
	}
	c, err := podconfig.ParseConnection(sec.Data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	return c, nil
}

// getWorkflow reads workflow ns/name: nil when it does not exist.
func getWorkflow(ctx context.Context, r client.Reader, ns, name string) (*v1alpha1.Workflow, error) {
	var w v1alpha1.Workflow
	err := r.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &w)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading Workflow %s/%s: %w", ns, name, err)
	}
	return &w, nil
}

// runStoreServers keeps a store server running for every workflow of the node store this
// plugin published a volume of (published.Record, kept where no pod can write) that
// exists in the API server with its agent Secret, checking every 5 seconds,
// until ctx is done; then it stops them. Each workflow's start runs on its own, so a slow
// one holds up no other. A failure to start one is logged when it changes and tried
// again (storeserver.Servers.Ensure says when).
func runStoreServers(ctx context.Context, d *csidriver.Driver, servers *storeserver.Servers, log logr.Logger) error {
	var (
		starts sync.WaitGroup
		mu     sync.Mutex
		failed = map[string]string{}
	)
	defer servers.StopAll()
	defer starts.Wait() // ctx is done: the starts in progress end
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		dirs, err := d.WorkflowDirs()
		if err != nil {
			log.Error(err, "listing the node store's workflows")
		}
		for _, dir := range dirs {
			starts.Add(1)
			go func() {
				defer starts.Done()
				err := servers.Ensure(ctx, dir)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err != nil && failed[dir] != err.Error() && ctx.Err() == nil:
					failed[dir] = err.Error()
					log.Error(err, "starting a workflow's store server; trying again", "dir", dir)
				case servers.Serving(dir):
					delete(failed, dir)
				}
			}()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// watchRetirements removes the node stores of workflows that are deleted or whose data
// retention ended, as the API server reports them: at start for what is already there,
// then at every change of a Workflow.
func watchRetirements(ctx context.Context, d *csidriver.Driver) error {
	log := klog.NewKlogr().WithName("csi-cleanup")
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("API server configuration (disable with --cleanup=false): %w", err)
	}
	c, err := cache.New(cfg, cache.Options{Scheme: scheme()})
	if err != nil {
		return fmt.Errorf("workflow cache: %w", err)
	}
	r := csidriver.APIRetirement{Reader: c}
	inf, err := c.GetInformer(ctx, &v1alpha1.Workflow{})
	if err != nil {
		return fmt.Errorf("workflow informer: %w", err)
	}
	retire := func(obj any) {
		if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		w, ok := obj.(*v1alpha1.Workflow)
		if !ok {
			return
		}
		if err := d.RetireIf(ctx, r, w.Namespace, w.Name); err != nil {
			log.Error(err, "removing a retired workflow's node store", "namespace", w.Namespace, "workflow", w.Name)
		}
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		UpdateFunc: func(_, obj any) { retire(obj) },
		DeleteFunc: retire,
	}); err != nil {
		return err
	}
	d.SetRetirement(ctx, r)
	go func() {
		if !c.WaitForCacheSync(ctx) {
			return
		}
		if err := d.Sweep(ctx, r); err != nil {
			log.Error(err, "sweeping retired workflows' node stores")
		}
	}()
	return c.Start(ctx)
}

// parseSize parses the quantity v of flag (empty: 0).
func parseSize(flag, v string) (int64, error) {
	if v == "" {
		return 0, nil
	}
	q, err := resource.ParseQuantity(v)
	if err != nil {
		return 0, fmt.Errorf("%s %q: %w", flag, v, err)
	}
	if q.Sign() < 0 {
		return 0, fmt.Errorf("%s %q: must not be negative", flag, v)
	}
	return q.Value(), nil
}

// workflowSizes is what Workflow w asks of a node's tiers.
func workflowSizes(w *v1alpha1.Workflow) csidriver.WorkflowSizes {
	var s csidriver.WorkflowSizes
	if q := w.Spec.Volume.SizeLimit; q != nil {
		s.Memory = q.Value()
	}
	if disk := w.Spec.Volume.Disk; disk != nil {
		s.DiskTier = true
		if disk.SizeLimit != nil {
			s.Disk = disk.SizeLimit.Value()
		}
	}
	if t := w.Spec.Tiers; t != nil && len(t.FS) > 0 {
		s.DiskTier = true
	}
	return s
}
