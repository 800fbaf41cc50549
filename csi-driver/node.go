package csidriver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/csi-driver/handoff"
	"github.com/sluice-io/sluice/internal/published"
	"github.com/sluice-io/sluice/internal/store"
	"github.com/sluice-io/sluice/internal/volumemark"
)

// NodeGetInfo returns the node's ID and its topology segment (CSI Node).
func (d *Driver) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{
		NodeId:             d.opts.NodeID,
		AccessibleTopology: &csi.Topology{Segments: map[string]string{v1alpha1.TopologyKey: d.opts.NodeID}},
	}, nil
}

// NodeGetCapabilities reports no optional Node capability: ephemeral volumes are neither
// staged nor expanded (CSI Node).
func (d *Driver) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	return &csi.NodeGetCapabilitiesResponse{}, nil
}

// publication is a validated NodePublishVolume request.
type publication struct {
	volumeID, target string
	readOnly         bool
	role, mode       string
	vol              handoff.Volume
	workflowDir      string
	workflowDataDir  string
	workflowStateDir string
	// own is the user and group the workflow's sidecars run as, who own its directories
	// on the node: the Workflow's status.agentUser (checkMark), else Options.SidecarUID.
	own owner
}

// owner is a user and group ID.
type owner struct{ uid, gid int }

// validate checks a NodePublishVolume request and resolves what it publishes. Errors are
// InvalidArgument naming the field or attribute.
func (d *Driver) validate(req *csi.NodePublishVolumeRequest) (*publication, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	}
	if req.GetTargetPath() == "" {
		return nil, status.Error(codes.InvalidArgument, "target_path is required")
	}
	if req.GetVolumeCapability() == nil {
		return nil, status.Error(codes.InvalidArgument, "volume_capability is required")
	}
	if req.GetVolumeCapability().GetBlock() != nil {
		return nil, status.Error(codes.InvalidArgument, "volume_capability: block access is not supported; Sluice volumes are filesystems")
	}
	vc := req.GetVolumeContext()
	if vc[ctxEphemeral] != "true" {
		return nil, status.Errorf(codes.InvalidArgument, "only CSI ephemeral inline volumes are supported (volume_context %q is %q)", ctxEphemeral, vc[ctxEphemeral])
	}
	p := &publication{volumeID: req.GetVolumeId(), target: filepath.Clean(req.GetTargetPath()), readOnly: req.GetReadonly(),
		own: owner{uid: d.opts.SidecarUID, gid: d.opts.SidecarGID}}
	p.vol = handoff.Volume{
		Namespace: vc[ctxPodNamespace], Pod: vc[ctxPodName], PodUID: vc[ctxPodUID],
		Workflow: vc[v1alpha1.VolumeAttrWorkflow], Step: vc[v1alpha1.VolumeAttrStep], Node: d.opts.NodeID,
	}
	if errs := validation.IsDNS1123Label(p.vol.Namespace); len(errs) > 0 {
		return nil, status.Errorf(codes.InvalidArgument, "volume_context %q %q: %s (is podInfoOnMount set on the CSIDriver?)", ctxPodNamespace, p.vol.Namespace, strings.Join(errs, "; "))
	}
	if p.vol.PodUID == "" || strings.ContainsAny(p.vol.PodUID, "/\x00") || p.vol.PodUID == "." || p.vol.PodUID == ".." {
		return nil, status.Errorf(codes.InvalidArgument, "volume_context %q %q is not a pod UID", ctxPodUID, p.vol.PodUID)
	}
	if errs := validation.IsDNS1123Subdomain(p.vol.Workflow); len(errs) > 0 {
		return nil, status.Errorf(codes.InvalidArgument, "volume attribute %q %q: %s", v1alpha1.VolumeAttrWorkflow, p.vol.Workflow, strings.Join(errs, "; "))
	}
	p.role = vc[v1alpha1.VolumeAttrRole]
	if p.role == "" {
		p.role = v1alpha1.RoleApp
	}
	if p.role != v1alpha1.RoleApp && p.role != v1alpha1.RoleSidecar {
		return nil, status.Errorf(codes.InvalidArgument, "volume attribute %q %q: must be %q or %q", v1alpha1.VolumeAttrRole, p.role, v1alpha1.RoleApp, v1alpha1.RoleSidecar)
	}
	p.mode = vc[v1alpha1.VolumeAttrMode]
	if p.mode == "" {
		p.mode = v1alpha1.ModeFUSE
	}
	if p.mode != v1alpha1.ModeFUSE && p.mode != v1alpha1.ModeDirect {
		return nil, status.Errorf(codes.InvalidArgument, "volume attribute %q %q: must be %q or %q", v1alpha1.VolumeAttrMode, p.mode, v1alpha1.ModeFUSE, v1alpha1.ModeDirect)
	}
	p.vol.Mode = p.mode
	if p.role == v1alpha1.RoleApp {
		if p.vol.Step == "" {
			return nil, status.Errorf(codes.InvalidArgument, "volume attribute %q is required for role %q", v1alpha1.VolumeAttrStep, v1alpha1.RoleApp)
		}
		if s := vc[v1alpha1.VolumeAttrInstance]; s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 0 {
				return nil, status.Errorf(codes.InvalidArgument, "volume attribute %q %q: must be a non-negative integer", v1alpha1.VolumeAttrInstance, s)
			}
			p.vol.Instance = n
		}
	}
	p.workflowDir = d.WorkflowDir(p.vol.Namespace, p.vol.Workflow)
	p.workflowDataDir = filepath.Join(p.workflowDir, "data")
	p.workflowStateDir = filepath.Join(p.workflowDir, "state")
	return p, nil
}

// checkMark refuses a publish whose attributes the Sluice controller or webhook did not
// write (docs/security.md, "Node plugin"): with Options.MarkKey set, the volume must
// carry a valid mark over its attributes and the pod's namespace (which the kubelet, not
// the pod, supplies), and, with Options.WorkflowUID set, the Workflow must still exist
// with the UID the mark covers. Refusals are PermissionDenied and name what is wrong.
func (d *Driver) checkMark(ctx context.Context, p *publication, vc map[string]string) error {
	if d.opts.MarkKey == nil {
		return d.ownerOf(ctx, p)
	}
	uid := vc[v1alpha1.VolumeAttrWorkflowUID]
	// The instance as written (validate reads it for the app role only); an attribute
	// that is not a number fails the mark.
	instance := 0
	if s := vc[v1alpha1.VolumeAttrInstance]; s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			return status.Errorf(codes.InvalidArgument, "volume attribute %q %q: must be a non-negative integer", v1alpha1.VolumeAttrInstance, s)
		}
		instance = n
	}
	m := volumemark.Mark{Namespace: p.vol.Namespace, Workflow: p.vol.Workflow, WorkflowUID: uid,
		Step: p.vol.Step, Instance: instance, Role: p.role, Mode: p.mode}
	if err := volumemark.Verify(d.opts.MarkKey, m, vc[v1alpha1.VolumeAttrMark]); err != nil {
		d.log.Info("refused a publish without a valid mark", "namespace", p.vol.Namespace, "pod", p.vol.Pod, "workflow", p.vol.Workflow, "error", err.Error())
		return status.Errorf(codes.PermissionDenied, "pod %s/%s, volume of workflow %q: %v", p.vol.Namespace, p.vol.Pod, p.vol.Workflow, err)
	}
	if d.opts.Workflow == nil {
		return nil
	}
	id, err := d.opts.Workflow(ctx, p.vol.Namespace, p.vol.Workflow)
	got := id.UID
	if err != nil {
		return status.Errorf(codes.Unavailable, "reading Workflow %s/%s: %v", p.vol.Namespace, p.vol.Workflow, err)
	}
	if got != uid {
		why := fmt.Sprintf("has UID %q, not the %q the volume was made for", got, uid)
		if got == "" {
			why = "does not exist"
		}
		return status.Errorf(codes.PermissionDenied, "pod %s/%s: Workflow %s/%s %s", p.vol.Namespace, p.vol.Pod, p.vol.Namespace, p.vol.Workflow, why)
	}
	// The pod's sidecar learns it, and the publication record binds the node's store
	// server to it (published.Record).
	p.vol.WorkflowUID = uid
	return p.setOwner(id)
}

// ownerOf sets the owner of an unmarked publication's workflow directories from the
// Workflow in the API, when the plugin reads it (Options.Workflow); a Workflow it does
// not find leaves Options.SidecarUID.
func (d *Driver) ownerOf(ctx context.Context, p *publication) error {
	if d.opts.Workflow == nil {
		return nil
	}
	id, err := d.opts.Workflow(ctx, p.vol.Namespace, p.vol.Workflow)
	if err != nil {
		return status.Errorf(codes.Unavailable, "reading Workflow %s/%s: %v", p.vol.Namespace, p.vol.Workflow, err)
	}
	return p.setOwner(id)
}

// setOwner makes the user of id (status.agentUser) the owner of p's workflow directories;
// without one they stay Options.SidecarUID's.
func (p *publication) setOwner(id WorkflowIdentity) error {
	switch {
	case id.User >= 1<<31 || id.User < 0:
		return status.Errorf(codes.FailedPrecondition, "Workflow %s/%s: status.agentUser %d is no user ID (1 to 2^31-1)", p.vol.Namespace, p.vol.Workflow, id.User)
	case id.User > 0:
		p.own = owner{uid: int(id.User), gid: int(id.User)}
	}
	return nil
}

// NodePublishVolume publishes a pod's Sluice volume at the target path (CSI Node). Role
// app, mode fuse: a FUSE mount whose descriptor the pod's sidecar gets through the pod's
// hand-off socket; mode direct: a bind mount of the pod's own direct directory. Role
// sidecar: the pod's control directory (hand-off socket) with the workflow's store and
// state directories (and, in direct mode, the pod's direct directory) under workflow/. Publishing again what is published is a success
// (CSI idempotency); a publish of a volume another operation is working on is Aborted
// (the kubelet retries it).
func (d *Driver) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	p, err := d.validate(req)
	if err != nil {
		return nil, err
	}
	if err := d.checkMark(ctx, p, req.GetVolumeContext()); err != nil {
		return nil, err
	}
	if !d.volumes.tryAcquire(p.volumeID) {
		return nil, status.Errorf(codes.Aborted, "an operation on volume %s is in progress", p.volumeID)
	}
	defer d.volumes.release(p.volumeID)
	d.dirs.RLock()
	defer d.dirs.RUnlock()
	if _, ok, err := mountedAt(d.mnt, p.target); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	} else if ok {
		return &csi.NodePublishVolumeResponse{}, nil
	}
	if err := d.prepareWorkflowDir(ctx, p); err != nil {
		if _, ok := status.FromError(err); ok {
			return nil, err
		}
		return nil, status.Error(codes.Internal, err.Error())
	}
	s, err := d.acquireSession(p.vol.PodUID)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	// Ends the session if the publish failed and no other volume of the pod is published.
	defer d.releaseSession(p.vol.PodUID, s)
	if err := os.MkdirAll(p.target, 0o750); err != nil {
		return nil, status.Errorf(codes.Internal, "creating target %s: %v", p.target, err)
	}
	switch {
	case p.role == v1alpha1.RoleSidecar:
		err = d.publishControl(p, s)
	case p.mode == v1alpha1.ModeDirect:
		err = d.publishDirect(p, s)
	default:
		err = d.publishFUSE(p, s)
	}
	if err != nil {
		_ = unmountAll(d.mnt, p.target)
		_ = os.Remove(p.target)
		if _, ok := status.FromError(err); ok {
			return nil, err // a refusal with its own code (Unavailable: try again)
		}
		return nil, status.Error(codes.Internal, err.Error())
	}
	d.log.Info("published", "role", p.role, "mode", p.mode, "namespace", p.vol.Namespace, "pod", p.vol.Pod,
		"workflow", p.vol.Workflow, "step", p.vol.Step, "instance", p.vol.Instance, "target", p.target)
	return &csi.NodePublishVolumeResponse{}, nil
}

// prepareWorkflowDir makes the workflow's disk tier (ensureDiskTier), mounts its tmpfs
// unless it is there (ensureMemoryTier), then creates the workflow's store and state
// directories in it, owned by the sidecar's user; the tiers' limits go to the sidecar
// with the volume. The store directory is the volume's root as steps see it: mode 0777,
// as an emptyDir's. Every directory is reached beneath the store's (or the disk tier's) root
// without following a symlink (beneath.go). Refusals are gRPC statuses; other errors
// plain.
func (d *Driver) prepareWorkflowDir(ctx context.Context, p *publication) error {
	wfDir := d.WorkflowDir(p.vol.Namespace, p.vol.Workflow)
	// The Workflow is read from the API once, and only when a tier is made or grown.
	var sized *WorkflowSizes
	sizes := func(ctx context.Context) (WorkflowSizes, error) {
		if sized != nil {
			return *sized, nil
		}
		s := WorkflowSizes{DiskTier: true}
		if d.opts.WorkflowSizes != nil {
			var err error
			if s, err = d.opts.WorkflowSizes(ctx, p.vol.Namespace, p.vol.Workflow); err != nil {
				return s, err
			}
		}
		sized = &s
		return s, nil
	}
	// The disk tier first: a store server starts once the workflow's directory exists
	// (storeserver), and must find the disk tier's file system mounted.
	disk, err := d.ensureDiskTier(ctx, p.vol.Namespace, p.vol.Workflow, p.own, sizes)
	if err != nil {
		return err
	}
	limit, err := d.ensureMemoryTier(ctx, p.vol.Namespace, p.vol.Workflow, func(ctx context.Context) (int64, error) {
		s, err := sizes(ctx)
		return s.Memory, err
	})
	if err != nil {
		return err
	}
	for _, dir := range []struct {
		root, rel string
		mode      uint32
	}{
		{wfDir, "data", 0o777},
		{wfDir, "state", 0o755},
	} {
		fd, err := ownedDir(dir.root, dir.rel, p.own.uid, p.own.gid, dir.mode)
		if err != nil {
			return fmt.Errorf("preparing the workflow's directory: %w", err)
		}
		unix.Close(fd)
	}
	p.vol.MemoryLimit, p.vol.DiskLimit = limit, disk
	// What the node's store server may start for: this workflow, with the UID the API
	// gave it (checkMark). Unchecked publications record nothing.
	if p.vol.WorkflowUID != "" {
		if err := published.Record(d.RecordDir(p.vol.Namespace, p.vol.Workflow), p.vol.WorkflowUID); err != nil {
			return err
		}
	}
	return nil
}

func (d *Driver) publishFUSE(p *publication, s *session) error {
	// The sidecar runs without capabilities: it keeps owners in user xattrs when the
	// store's file system takes them, and only then can the kernel check permissions
	// against the owners its views report (store.Owners).
	owners, err := store.ProbeOwners(p.workflowDataDir, false)
	if err != nil {
		// Never mount without default_permissions for a failure a tenant can cause (its
		// tier full, or out of inodes): the kubelet tries again.
		return status.Errorf(codes.Unavailable, "the volume is not mounted, rather than without the kernel's permission checks: %v", err)
	}
	if owners == store.OwnersNone {
		d.log.Info("node store keeps no owners: the volume is mounted without default_permissions, every step may access every file",
			"dir", p.workflowDataDir, "workflow", p.vol.Workflow)
	}
	f, err := mountFUSE(d.mnt, p.target, p.readOnly, owners != store.OwnersNone)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fuse != nil {
		s.fuse.Close()
	}
	s.fuse, s.init, s.vol, s.appTarget, s.appPublished = f, nil, p.vol, p.target, true
	return nil
}

// directDir creates the pod's own directory of the workflow's directory (next to the
// node store, on the same tmpfs), owned by the sidecar's user, mode 0777, reached without
// following a symlink, and returns an O_PATH descriptor of it.
func (d *Driver) directDir(p *publication) (int, error) {
	rel := "direct/" + p.vol.PodUID
	fd, err := ownedDir(p.workflowDir, rel, p.own.uid, p.own.gid, 0o777) // past the umask
	if err != nil {
		return -1, fmt.Errorf("preparing the pod's direct directory: %w", err)
	}
	return fd, nil
}

// publishDirect bind-mounts the pod's own directory of the workflow's directory at the
// target, from its descriptor. The app containers write it as whichever user they run
// as; the sidecar, which owns it, ingests what they write into the store and copies
// committed files into it (package directview).
func (d *Driver) publishDirect(p *publication, s *session) error {
	fd, err := d.directDir(p)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := bindMountFd(d.mnt, fd, p.target, p.readOnly); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.vol, s.appTarget, s.appPublished, s.directDir = p.vol, p.target, true, handoff.DirectDir(p.workflowDir, p.vol.PodUID)
	return nil
}

// publishControl bind-mounts the pod's control directory at the target, then what the
// sidecar needs of the workflow's directory, each from its descriptor: data/ at
// target/workflow/data, state/ at target/workflow/state, in direct mode the pod's own
// direct/<uid> at target/workflow/direct/<uid>, and the disk tier at target/disk. Never
// the workflow's directory itself: the other pods' direct directories stay out of reach.
func (d *Driver) publishControl(p *publication, s *session) error {
	uid := p.vol.PodUID
	type bind struct {
		root, rel string // the source, beneath root
		at        string // the mount point, beneath the pod's control directory
	}
	binds := []bind{
		{p.workflowDir, "data", "workflow/data"},
		{p.workflowDir, "state", "workflow/state"},
		{d.DiskDir(p.vol.Namespace, p.vol.Workflow), "", "disk"}, // its own file system's root
	}
	if p.mode == v1alpha1.ModeDirect {
		fd, err := d.directDir(p)
		if err != nil {
			return err
		}
		unix.Close(fd)
		binds = append(binds, bind{p.workflowDir, "direct/" + uid, "workflow/direct/" + uid})
	}
	for _, b := range binds {
		fd, err := makeDir(d.podsRoot(), uid+"/"+b.at, 0o755)
		if err != nil {
			return fmt.Errorf("preparing the control volume: %w", err)
		}
		unix.Close(fd)
	}
	ctl, err := makeDir(d.podsRoot(), uid, 0o755)
	if err != nil {
		return fmt.Errorf("preparing the control volume: %w", err)
	}
	err = bindMountFd(d.mnt, ctl, p.target, false)
	unix.Close(ctl)
	if err != nil {
		return err
	}
	for _, b := range binds {
		if err := d.bindBeneath(b.root, b.rel, p.target, b.at); err != nil {
			return err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sidecarTarget = p.target
	return nil
}

// bindBeneath bind-mounts the directory rel beneath root at the directory at beneath
// target, both resolved without following symlinks and mounted by descriptor.
func (d *Driver) bindBeneath(root, rel, target, at string) error {
	src, err := makeDir(root, rel, 0o755)
	if err != nil {
		return err
	}
	defer unix.Close(src)
	dst, err := makeDir(target, at, 0o755)
	if err != nil {
		return err
	}
	defer unix.Close(dst)
	if err := d.mnt.Mount(fdPath(src), fdPath(dst), "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind-mounting %s at %s: %w", rel, filepath.Join(target, at), err)
	}
	return nil
}

// NodeUnpublishVolume unmounts the target path and removes it (CSI Node). A target that
// is not mounted, or does not exist, is already unpublished: a success. When neither of
// the pod's volumes is published any more, the pod's session ends (its descriptor is
// closed, its control directory removed). An unpublish of a volume another operation is
// working on is Aborted.
func (d *Driver) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	}
	if req.GetTargetPath() == "" {
		return nil, status.Error(codes.InvalidArgument, "target_path is required")
	}
	target := filepath.Clean(req.GetTargetPath())
	if !d.volumes.tryAcquire(req.GetVolumeId()) {
		return nil, status.Errorf(codes.Aborted, "an operation on volume %s is in progress", req.GetVolumeId())
	}
	defer d.volumes.release(req.GetVolumeId())
	d.dirs.RLock()
	defer d.dirs.RUnlock()
	if err := unmountAll(d.mnt, target); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, status.Errorf(codes.Internal, "removing target %s: %v", target, err)
	}
	if directDir := d.forget(target); directDir != "" {
		// The app's own copies; the committed bytes stay in the node store.
		if err := os.RemoveAll(directDir); err != nil {
			d.log.Error(err, "removing a pod's direct directory", "dir", directDir)
		}
	}
	d.log.Info("unpublished", "target", target)
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// forget marks the volume published at target unpublished in its pod's session, ending
// the session when neither of the pod's volumes is published any more, and tells the
// retirement check (SetRetirement). It returns the pod's direct directory when target was
// its direct-mode app volume, for the caller to remove.
func (d *Driver) forget(target string) (directDir string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for uid, s := range d.sessions {
		s.mu.Lock()
		found := true
		switch target {
		case s.appTarget:
			s.appPublished, s.appTarget = false, ""
			if s.fuse != nil {
				s.fuse.Close()
				s.fuse = nil
			}
			directDir, s.directDir = s.directDir, ""
		case s.sidecarTarget:
			s.sidecarTarget = ""
		default:
			found = false
		}
		ns, wf := s.vol.Namespace, s.vol.Workflow
		s.mu.Unlock()
		if !found {
			continue
		}
		d.dropIfIdle(uid, s)
		if d.retired != nil && ns != "" {
			go d.retired(ns, wf)
		}
		break
	}
	return directDir
}

// acquireSession returns the session of pod uid (sessionFor) with one more operation in
// progress on it, which keeps it from ending until releaseSession.
func (d *Driver) acquireSession(uid string) (*session, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	s, err := d.sessionFor(uid)
	if err != nil {
		return nil, err
	}
	s.ops++
	return s, nil
}

// releaseSession ends an operation begun with acquireSession, and the session with it
// when neither of the pod's volumes is published.
func (d *Driver) releaseSession(uid string, s *session) {
	d.mu.Lock()
	defer d.mu.Unlock()
	s.ops--
	d.dropIfIdle(uid, s)
}

// dropIfIdle ends the session of pod uid when none of its volumes is published and no
// publish is working on it. Callers hold d.mu.
func (d *Driver) dropIfIdle(uid string, s *session) {
	if d.sessions[uid] != s || s.ops > 0 || !s.idle() {
		return // ended already (Close), or still in use
	}
	s.close()
	delete(d.sessions, uid)
	_ = unmountAll(d.mnt, s.dir)
	if err := os.RemoveAll(s.dir); err != nil {
		d.log.Error(err, "removing a pod's control directory", "dir", s.dir)
	}
}
