// Package csidriver is Sluice's CSI node plugin (`sluice csi`): the Identity and Node
// services of the CSI spec for ephemeral inline volumes (volumeLifecycleModes:
// [Ephemeral], podInfoOnMount: true, attachRequired: false). It owns the node store — one
// directory per workflow, each a tmpfs of the workflow's size, the sizes bounded together
// (memtier.go) — and the workflows' disk tiers (disktier.go), and, at NodePublishVolume,
// mounts a pod's streaming volume: a FUSE filesystem whose /dev/fuse descriptor it hands
// to the pod's sidecar (package handoff), or, with the "direct" attribute, a bind mount of
// the workflow's store directory for clusters without FUSE.
//
// Each injected pod has two volumes of this driver: the app volume (role "app", mounted in
// the app containers) and the control volume (role "sidecar", mounted only in the
// sidecar), which holds the hand-off socket and the workflow's store and state
// directories. A workflow's store is published only to pods of the workflow's own
// namespace: the directory is chosen by the namespace the kubelet reports for the pod,
// never by a volume attribute.
//
// Layout under Options.StateDir:
//
//	store/                      a tmpfs holding the workflows' mount points
//	store/<ns>/<workflow>/      the workflow's tmpfs, its memory tier (memtier.go): the
//	                            workflows' sizes add up to at most Options.StoreSize
//	store/<ns>/<workflow>/data  the workflow's node store: the files of the volume
//	store/<ns>/<workflow>/state what the workflow's sidecars on this node share
//	disk/<ns>/<workflow>        the workflow's disk tier (spec.tiers.fs), on the node's disk:
//	                            with DiskTierFilesystem the mount point of its file system
//	disk/.images/<ns>/<workflow> that file system's sparse image (disktier.go)
//	pods/<pod-uid>/sluice.sock  the pod's hand-off socket
//	published/<ns>/<workflow>   the record that a volume of the workflow was published here,
//	                            with its UID (root's only, published.Record): what a store
//	                            server may start for
//	store-server-root/          empty (root's only): where each store server's own root
//	                            is mounted in its mount namespace (storeserver.isolate)
package csidriver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/published"
)

// Pod information the kubelet adds to the volume context (podInfoOnMount: true).
const (
	ctxPodName      = "csi.storage.k8s.io/pod.name"
	ctxPodNamespace = "csi.storage.k8s.io/pod.namespace"
	ctxPodUID       = "csi.storage.k8s.io/pod.uid"
	ctxEphemeral    = "csi.storage.k8s.io/ephemeral"
)

// Options configure the plugin.
type Options struct {
	// Name is the CSI driver name (default v1alpha1.DriverName).
	Name string
	// Version is reported by GetPluginInfo.
	Version string
	// NodeID is this node's name (NodeGetInfo).
	NodeID string
	// StateDir holds the node store and the pods' control directories.
	StateDir string
	// DiskDir holds the workflows' disk tiers, on the node's disk (default StateDir/disk).
	DiskDir string
	// StoreSize bounds the node store in bytes: the sizes of the workflows' tmpfs mounts
	// (memtier.go) add up to at most this. 0 mounts nothing and uses StateDir/store as it
	// is, unlimited (tests).
	StoreSize int64
	// WorkflowMemoryMax is the largest tmpfs one workflow gets (a larger
	// spec.volume.sizeLimit is capped; the controller refuses one at admission). 0, or
	// more than StoreSize: StoreSize.
	WorkflowMemoryMax int64
	// WorkflowMemoryDefault is the size of the tmpfs of a workflow without
	// spec.volume.sizeLimit. 0: an eighth of StoreSize (at most WorkflowMemoryMax).
	WorkflowMemoryDefault int64
	// WorkflowDiskMax, when set, bounds each workflow's disk tier on the node, whatever
	// spec.volume.disk.sizeLimit says: the size of its file system (disktier.go), and
	// what its sidecars' store counts (handoff.Volume.DiskLimit). 0: an eighth of
	// DiskSize for a workflow without a sizeLimit, DiskSize above it, with file systems
	// and directories alike (a directory tier is never unbounded).
	WorkflowDiskMax int64
	// DiskTier is what a workflow's disk tier is: DiskTierAuto (""), DiskTierFilesystem
	// or DiskTierDirectory (disktier.go).
	DiskTier string
	// DiskSize, with file systems, bounds the disk tiers of a node together: their sizes
	// add up to at most this many bytes; with directories, a workflow without a
	// sizeLimit counts an eighth of it. 0: half of what the file system DiskDir is on has
	// free when the plugin starts.
	DiskSize int64
	// WorkflowSizes, when set, returns what Workflow ns/name asks of a node (its tiers'
	// sizeLimits) from the API server (zero when it does not exist); it sizes the
	// workflow's tmpfs and its disk tier's file system. Unset: every workflow gets
	// WorkflowMemoryDefault and a disk tier of the default size. Errors fail the publish
	// as Unavailable.
	WorkflowSizes func(ctx context.Context, ns, name string) (WorkflowSizes, error)
	// SidecarUID and SidecarGID own the workflow directories, so that the unprivileged
	// sidecar can write them.
	SidecarUID, SidecarGID int
	// Log receives structured logs.
	Log logr.Logger
	// MarkKey, when set, is the key of the injectors' volume marks (internal/volumemark):
	// a publish without a valid mark over its attributes and the pod's namespace is
	// refused with PermissionDenied. Nil publishes any well-formed request (tests).
	MarkKey []byte
	// Workflow, when set, returns what the plugin checks of Workflow ns/name in the API
	// server at a marked publish (a zero WorkflowIdentity when it does not exist): the
	// publish is refused unless the Workflow still has the UID the mark covers, and the
	// workflow's directories on the node are its user's. Errors fail the publish as
	// Unavailable.
	Workflow func(ctx context.Context, ns, name string) (WorkflowIdentity, error)
}

// WorkflowIdentity is what the plugin reads of a Workflow when it publishes a volume of
// it: its metadata.uid ("" when it does not exist) and the user and group ID its sidecars
// and store servers run as (status.agentUser; 0 when unset: Options.SidecarUID).
type WorkflowIdentity struct {
	// UID is the Workflow's metadata.uid ("" when it does not exist).
	UID string
	// User is its status.agentUser (0 when unset).
	User int64
}

// Driver is the CSI node plugin.
type Driver struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedNodeServer

	opts Options
	log  logr.Logger
	mnt  mounter

	// volumes are the volumes a publish or unpublish is working on (by volume ID).
	volumes volumeLocks
	// dirs is held shared by every publish and unpublish for its whole course, and
	// exclusively by Retire, which never removes a workflow's directory while one is
	// being mounted.
	dirs sync.RWMutex
	// memMu is held while a workflow's tmpfs is sized and mounted (ensureMemoryTier), so
	// that two workflows never both take the node store's last bytes; it guards shrunk.
	memMu sync.Mutex
	// shrunk are the workflow directories whose tmpfs ShrinkMemoryTier shrank: a later
	// publish of the workflow sizes it again (ensureMemoryTier).
	shrunk map[string]bool
	// diskFS is whether each disk tier is a file system of its own (chooseDiskTier).
	diskFS bool
	// diskMu is held while a disk tier's file system is made and mounted
	// (ensureDiskTier), so that two workflows never both take DiskSize's last bytes.
	diskMu sync.Mutex

	// mu guards what follows; it is held for bookkeeping only, never across a mount.
	mu       sync.Mutex
	sessions map[string]*session // by pod UID
	// retired is told when a volume of workflow ns/workflow was unpublished (see
	// SetRetirement).
	retired func(ns, workflow string)
	// beforeRetire is called with a workflow's directory before it is removed (see
	// BeforeRetire).
	beforeRetire func(dir string)
}

// New prepares the plugin: it mounts the node store's tmpfs when StoreSize is set and
// creates the directories it needs. The workflows' own tmpfs mounts are made at publish
// (memtier.go); those a previous run of the plugin made stay.
func New(opts Options) (*Driver, error) {
	if opts.Name == "" {
		opts.Name = v1alpha1.DriverName
	}
	if opts.NodeID == "" {
		return nil, errors.New("the node ID (--node-id) is required")
	}
	if opts.StateDir == "" {
		return nil, errors.New("the state directory (--state-dir) is required")
	}
	if opts.Log.GetSink() == nil {
		opts.Log = logr.Discard()
	}
	d := &Driver{opts: opts, log: opts.Log, mnt: kernelMounter{}, sessions: map[string]*session{}}
	if opts.StoreSize > 0 {
		if err := ensureTmpfs(d.mnt, d.storeRoot(), opts.StoreSize); err != nil {
			return nil, err
		}
		if err := d.boundOldTiers(); err != nil {
			return nil, err
		}
	}
	for _, dir := range []string{d.storeRoot(), d.podsRoot(), d.diskRoot()} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("creating %s: %w", dir, err)
		}
	}
	if err := d.chooseDiskTier(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(d.recordRoot(), 0o700); err != nil {
		return nil, fmt.Errorf("creating %s: %w", d.recordRoot(), err)
	}
	if err := os.Chmod(d.recordRoot(), 0o700); err != nil {
		return nil, fmt.Errorf("closing %s to everyone but root: %w", d.recordRoot(), err)
	}
	if err := d.migrateDeposits(); err != nil {
		return nil, err
	}
	return d, nil
}

func (d *Driver) storeRoot() string { return filepath.Join(d.opts.StateDir, "store") }

// recordRoot holds the records of the workflows published on the node: root's, mode
// 0700, never published to a pod.
func (d *Driver) recordRoot() string { return filepath.Join(d.opts.StateDir, "published") }

// migrateDeposits turns what plugins before issue 42 kept in deposits/<ns>/<workflow>/
// (the NATS credentials the sidecars handed over, and the Workflow UID the plugin checked
// at publication, in server/workflow.uid) into publication records (RecordDir), so that
// the store servers of those workflows start again, and removes the rest: nothing reads
// the credentials now.
func (d *Driver) migrateDeposits() error {
	root := filepath.Join(d.opts.StateDir, "deposits")
	nss, err := os.ReadDir(root)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("the deposits of an earlier version: %w", err)
	}
	for _, ns := range nss {
		wfs, err := os.ReadDir(filepath.Join(root, ns.Name()))
		if !ns.IsDir() || err != nil {
			continue
		}
		for _, wf := range wfs {
			// An older plugin's deposit kept the UID as a record keeps it (server/workflow.uid).
			uid, ok, err := published.Load(filepath.Join(root, ns.Name(), wf.Name(), "server"))
			if err != nil || !ok || uid == "" || !wf.IsDir() {
				continue
			}
			if err := published.Record(d.RecordDir(ns.Name(), wf.Name()), uid); err != nil {
				return fmt.Errorf("recording the publication of %s/%s from its deposit: %w", ns.Name(), wf.Name(), err)
			}
		}
	}
	if err := os.RemoveAll(root); err != nil {
		return fmt.Errorf("removing the deposits of an earlier version: %w", err)
	}
	return nil
}

// RecordDir is the directory of the publication record of workflow wf of namespace ns
// (published.Record): outside every directory a pod sees, written only by the plugin
// when it publishes a volume of the workflow, from the UID it checked in the API.
func (d *Driver) RecordDir(ns, wf string) string { return filepath.Join(d.recordRoot(), ns, wf) }

// RecordDirOf is RecordDir of the workflow whose directory (WorkflowDir) is dir.
func (d *Driver) RecordDirOf(dir string) string {
	return d.RecordDir(filepath.Base(filepath.Dir(dir)), filepath.Base(dir))
}
func (d *Driver) podsRoot() string { return filepath.Join(d.opts.StateDir, "pods") }
func (d *Driver) diskRoot() string {
	if d.opts.DiskDir != "" {
		return d.opts.DiskDir
	}
	return filepath.Join(d.opts.StateDir, "disk")
}

// DiskDir is the directory of the disk tier of workflow wf of namespace ns (spec.tiers.fs
// files), beside the node store on the node's disk: the sidecars see it at disk/ of their
// control volume.
func (d *Driver) DiskDir(ns, wf string) string { return filepath.Join(d.diskRoot(), ns, wf) }

// DiskDirOf is DiskDir of the workflow whose directory (WorkflowDir) is dir.
func (d *Driver) DiskDirOf(dir string) string {
	return d.DiskDir(filepath.Base(filepath.Dir(dir)), filepath.Base(dir))
}

// WorkflowDir returns the directory of workflow wf of namespace ns in the node store.
func (d *Driver) WorkflowDir(ns, wf string) string { return filepath.Join(d.storeRoot(), ns, wf) }

// WorkflowDirs returns the directory of every workflow in the node store (WorkflowDir).
func (d *Driver) WorkflowDirs() ([]string, error) {
	nss, err := os.ReadDir(d.storeRoot())
	if err != nil {
		return nil, fmt.Errorf("listing the node store: %w", err)
	}
	var dirs []string
	for _, ns := range nss {
		if !ns.IsDir() {
			continue
		}
		wfs, err := os.ReadDir(filepath.Join(d.storeRoot(), ns.Name()))
		if err != nil {
			return nil, fmt.Errorf("listing the node store: %w", err)
		}
		for _, wf := range wfs {
			if wf.IsDir() {
				dirs = append(dirs, d.WorkflowDir(ns.Name(), wf.Name()))
			}
		}
	}
	return dirs, nil
}

// BeforeRetire makes Retire call f with a workflow's directory before removing it (the
// node's store server of the workflow stops there).
func (d *Driver) BeforeRetire(f func(dir string)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.beforeRetire = f
}

// Serve serves the CSI Identity and Node services on the unix socket at endpoint (a path
// or unix:// URL) until ctx is done.
func (d *Driver) Serve(ctx context.Context, endpoint string) error {
	path := strings.TrimPrefix(endpoint, "unix://")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("creating the socket directory: %w", err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing the old socket %s: %w", path, err)
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", path, err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(d.logCalls))
	csi.RegisterIdentityServer(srv, d)
	csi.RegisterNodeServer(srv, d)
	stop := context.AfterFunc(ctx, srv.GracefulStop)
	defer stop()
	d.log.Info("serving CSI", "driver", d.opts.Name, "node", d.opts.NodeID, "endpoint", path)
	if err := srv.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("serving CSI: %w", err)
	}
	return nil
}

// Close closes every pod session's descriptors and listeners (the mounts stay: their
// sidecars hold the descriptors).
func (d *Driver) Close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for uid, s := range d.sessions {
		s.close()
		delete(d.sessions, uid)
	}
}

func (d *Driver) logCalls(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	if err != nil {
		d.log.Info("CSI call failed", "method", info.FullMethod, "code", status.Code(err).String(), "err", status.Convert(err).Message())
	} else {
		d.log.V(2).Info("CSI call", "method", info.FullMethod)
	}
	return resp, err
}

// GetPluginInfo returns the driver's name and version (CSI Identity).
func (d *Driver) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	v := d.opts.Version
	if v == "" {
		v = "dev"
	}
	return &csi.GetPluginInfoResponse{Name: d.opts.Name, VendorVersion: v}, nil
}

// GetPluginCapabilities reports no controller service: volumes are ephemeral and exist
// only on the node (CSI Identity).
func (d *Driver) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return &csi.GetPluginCapabilitiesResponse{}, nil
}

// Probe reports ready when the node store is in place (CSI Identity).
func (d *Driver) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	if _, err := os.Stat(d.storeRoot()); err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "node store %s: %v", d.storeRoot(), err)
	}
	return &csi.ProbeResponse{}, nil
}
