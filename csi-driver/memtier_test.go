package csidriver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/csi-driver/handoff"
	"github.com/sluice-io/sluice/internal/testenv"
)

// tierNode is a node plugin with a bounded node store (real tmpfs mounts) whose
// Workflows have the sizeLimits of limits (by name; missing: none).
type tierNode struct {
	t      *testing.T
	d      *Driver
	dir    string
	limits map[string]int64
	// sizes, when they name a workflow, are what it asks (limits is then not read).
	sizes map[string]WorkflowSizes
}

func newTierNode(t *testing.T, opts Options, limits map[string]int64) *tierNode {
	t.Helper()
	testenv.Root(t, "the workflows' memory tiers are tmpfs mounts")
	dir := t.TempDir()
	t.Cleanup(func() { _ = unmountAll(kernelMounter{}, dir) })
	n := &tierNode{t: t, dir: dir, limits: limits}
	n.d = n.start(opts)
	return n
}

// start starts a plugin on the node's state directory, as a restarted plugin does.
func (n *tierNode) start(opts Options) *Driver {
	n.t.Helper()
	opts.NodeID, opts.StateDir = "node-1", filepath.Join(n.dir, "state")
	if opts.SidecarUID == 0 {
		opts.SidecarUID, opts.SidecarGID = os.Getuid(), os.Getgid()
	}
	if opts.DiskSize == 0 {
		opts.DiskSize = testDiskSize
	}
	opts.WorkflowSizes = func(_ context.Context, _, name string) (WorkflowSizes, error) {
		if s, ok := n.sizes[name]; ok {
			return s, nil
		}
		return WorkflowSizes{Memory: n.limits[name], DiskTier: true}, nil
	}
	d, err := New(opts)
	if err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(d.Close)
	return d
}

// publish publishes the direct-mode app volume of pod uid of workflow wf in namespace
// ns1 and returns its target.
func (n *tierNode) publish(uid, wf string) (string, error) {
	return n.publishRole(uid, wf, v1alpha1.RoleApp)
}

// publishRole publishes pod uid's direct-mode volume of role.
func (n *tierNode) publishRole(uid, wf, role string) (string, error) {
	target := filepath.Join(n.dir, "pods", uid, role)
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		n.t.Fatal(err)
	}
	_, err := n.d.NodePublishVolume(context.Background(), &csi.NodePublishVolumeRequest{
		VolumeId: "csi-" + uid + "-" + role, TargetPath: target,
		VolumeCapability: &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}}},
		VolumeContext: map[string]string{
			ctxEphemeral: "true", ctxPodNamespace: "ns1", ctxPodName: "pod-" + uid, ctxPodUID: uid,
			v1alpha1.VolumeAttrWorkflow: wf, v1alpha1.VolumeAttrStep: "c", v1alpha1.VolumeAttrRole: role, v1alpha1.VolumeAttrMode: v1alpha1.ModeDirect,
		},
	})
	return target, err
}

// mustPublishRole is publishRole, failing the test on an error.
func (n *tierNode) mustPublishRole(uid, wf, role string) string {
	n.t.Helper()
	target, err := n.publishRole(uid, wf, role)
	if err != nil {
		n.t.Fatalf("publishing the %s volume of %s: %v", role, wf, err)
	}
	return target
}

func (n *tierNode) mustPublish(uid, wf string) string {
	n.t.Helper()
	target, err := n.publish(uid, wf)
	if err != nil {
		n.t.Fatalf("publishing a volume of %s: %v", wf, err)
	}
	return target
}

func (n *tierNode) unpublish(uid, target string) {
	n.t.Helper()
	if _, err := n.d.NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: "csi-" + uid + "-" + filepath.Base(target), TargetPath: target}); err != nil {
		n.t.Fatalf("unpublishing %s: %v", target, err)
	}
}

// attached is what pod uid's sidecar learns at the hand-off.
func (n *tierNode) attached(uid string) handoff.Volume {
	n.t.Helper()
	a, err := handoff.Attach(context.Background(), filepath.Join(n.d.podsRoot(), uid, handoff.SocketName), 10*time.Second)
	if err != nil {
		n.t.Fatal(err)
	}
	if a.FUSE != nil {
		a.FUSE.Close()
	}
	return a.Volume
}

// workflowMount returns the tmpfs mounted at workflow wf's directory and its size.
func (n *tierNode) workflowMount(wf string) (mountInfo, int64, bool) {
	n.t.Helper()
	dir := n.d.WorkflowDir("ns1", wf)
	m, ok, err := mountedAt(kernelMounter{}, dir)
	if err != nil {
		n.t.Fatal(err)
	}
	if !ok {
		return m, 0, false
	}
	size, err := tmpfsSize(dir)
	if err != nil {
		n.t.Fatal(err)
	}
	return m, size, true
}

// fill writes bytes into a new file of workflow wf's store and returns the error of the
// write.
func (n *tierNode) fill(wf, name string, bytes int) error {
	return fill(filepath.Join(n.d.WorkflowDir("ns1", wf), "data", name), bytes)
}

// fill writes bytes into a new file at path and returns the error of the write.
func fill(path string, bytes int) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.Write(make([]byte, bytes))
	return err
}

// A workflow's memory tier is a tmpfs of its own, of its spec.volume.sizeLimit: the
// kernel refuses a write beyond it, through the sidecar's control volume, while the
// sidecar is told a limit below it, so that the node store waits or spills first, and
// the installation's bound of the disk tier. The mount cannot carry setuid programs or
// devices.
func TestWorkflowMemoryTierIsItsOwnTmpfs(t *testing.T) {
	n := newTierNode(t, Options{StoreSize: 64 << 20, WorkflowDiskMax: 1 << 30, DiskSize: 2 << 30}, map[string]int64{"small": 8 << 20})
	n.mustPublish("uid-1", "small")
	control, err := n.publishRole("uid-1", "small", v1alpha1.RoleSidecar)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.unpublish("uid-1", control) })
	m, size, ok := n.workflowMount("small")
	if !ok || m.fsType != "tmpfs" {
		t.Fatalf("no tmpfs at the workflow's directory: %+v", m)
	}
	if size != 8<<20 {
		t.Errorf("the workflow's tmpfs has %d bytes, want its sizeLimit %d", size, 8<<20)
	}
	if fi, err := os.Stat(n.d.WorkflowDir("ns1", "small")); err != nil {
		t.Error(err)
	} else if fi.Mode().Perm() != 0o755 {
		t.Errorf("the workflow's directory on its tmpfs has mode %v, want 0755 as before", fi.Mode())
	}
	var st unix.Statfs_t
	if err := unix.Statfs(n.d.WorkflowDir("ns1", "small"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Flags&unix.ST_NOSUID == 0 || st.Flags&unix.ST_NODEV == 0 {
		t.Errorf("the workflow's tmpfs is mounted without nosuid,nodev (flags %#x)", st.Flags)
	}
	if err := fill(filepath.Join(control, "workflow", "data", "big"), 12<<20); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("writing 12 MiB into an 8 MiB memory tier: %v, want ENOSPC from the kernel", err)
	}
	vol := n.attached("uid-1")
	if got := vol.MemoryLimit; got != memoryTier(8<<20) || got >= 8<<20 || got <= 0 {
		t.Errorf("the sidecar is told a memory tier of %d bytes, want %d (below the mount's %d)", got, memoryTier(8<<20), 8<<20)
	}
	if vol.DiskLimit < 1<<30 || vol.DiskLimit > diskImageSize(1<<30) {
		t.Errorf("the sidecar is told a disk tier bound of %d bytes, want the installation's %d and at most its file system's %d", vol.DiskLimit, 1<<30, diskImageSize(1<<30))
	}
}

// A workflow without a sizeLimit gets the default size (an eighth of the store); one
// above the installation's maximum gets the maximum.
func TestWorkflowMemoryTierSizes(t *testing.T) {
	n := newTierNode(t, Options{StoreSize: 64 << 20, WorkflowMemoryMax: 16 << 20}, map[string]int64{"huge": 1 << 30})
	n.mustPublish("uid-1", "unsized")
	n.mustPublish("uid-2", "huge")
	if _, size, _ := n.workflowMount("unsized"); size != 8<<20 {
		t.Errorf("a workflow without sizeLimit has a tmpfs of %d bytes, want an eighth of the store, %d", size, 8<<20)
	}
	if _, size, _ := n.workflowMount("huge"); size != 16<<20 {
		t.Errorf("a workflow above the maximum has a tmpfs of %d bytes, want the maximum %d", size, 16<<20)
	}
}

// The workflows' tmpfs sizes on a node add up to at most the store's size: a publish of
// a workflow that does not fit is refused with ResourceExhausted, naming the sizes, and
// nothing is made for it; once a retired workflow's mount is gone (unmounted with its
// directory), it fits.
func TestPublishOfAWorkflowThatDoesNotFit(t *testing.T) {
	n := newTierNode(t, Options{StoreSize: 64 << 20}, map[string]int64{"a": 48 << 20, "b": 32 << 20})
	a := n.mustPublish("uid-a", "a")
	_, err := n.publish("uid-b", "b")
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("publishing a workflow that does not fit: %v, want ResourceExhausted", err)
	}
	t.Log(err)
	if _, err := os.Stat(n.d.WorkflowDir("ns1", "b")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused workflow got a directory (%v)", err)
	}
	// The same workflow's other pods share its mount: no more room needed.
	n.mustPublish("uid-a2", "a")

	n.unpublish("uid-a", a)
	n.unpublish("uid-a2", filepath.Join(n.dir, "pods", "uid-a2", v1alpha1.RoleApp))
	if removed, err := n.d.Retire("ns1", "a"); err != nil || !removed {
		t.Fatalf("retiring workflow a: removed %v, %v", removed, err)
	}
	if _, _, ok := n.workflowMount("a"); ok {
		t.Error("the retired workflow's tmpfs is still mounted")
	}
	if _, err := os.Stat(n.d.WorkflowDir("ns1", "a")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the retired workflow's directory is still there: %v", err)
	}
	n.mustPublish("uid-b", "b")
	if _, size, ok := n.workflowMount("b"); !ok || size != 32<<20 {
		t.Errorf("workflow b has a tmpfs of %d bytes (mounted %v), want %d", size, ok, 32<<20)
	}
}

// A retired workflow keeps its tmpfs while a pod still has a volume of it published.
func TestRetireKeepsAMemoryTierInUse(t *testing.T) {
	n := newTierNode(t, Options{StoreSize: 64 << 20}, nil)
	target := n.mustPublish("uid-1", "wf")
	if removed, err := n.d.Retire("ns1", "wf"); err != nil || removed {
		t.Fatalf("retired a memory tier in use: removed %v, %v", removed, err)
	}
	if _, _, ok := n.workflowMount("wf"); !ok {
		t.Fatal("the tmpfs of a workflow in use was unmounted")
	}
	n.unpublish("uid-1", target)
	if removed, err := n.d.Retire("ns1", "wf"); err != nil || !removed {
		t.Fatalf("retiring the workflow once unused: removed %v, %v", removed, err)
	}
}

// A restarted plugin finds the workflows' mounts and keeps them, with their files and
// sizes (it asks the API server nothing about them), and counts them against the store.
func TestRestartedPluginKeepsTheMemoryTiers(t *testing.T) {
	n := newTierNode(t, Options{StoreSize: 64 << 20}, map[string]int64{"a": 40 << 20, "b": 32 << 20})
	n.mustPublish("uid-1", "a")
	if err := n.fill("a", "kept", 1<<20); err != nil {
		t.Fatal(err)
	}
	n.d.Close()

	n.limits = map[string]int64{"a": 4 << 20, "b": 32 << 20} // what a restarted plugin must not use for a
	n.d = n.start(Options{StoreSize: 64 << 20})
	n.mustPublish("uid-2", "a")
	if _, size, ok := n.workflowMount("a"); !ok || size != 40<<20 {
		t.Errorf("after the restart, workflow a has a tmpfs of %d bytes (mounted %v), want the kept %d", size, ok, 40<<20)
	}
	ms, err := kernelMounter{}.Mounts()
	if err != nil {
		t.Fatal(err)
	}
	mounts := 0
	for _, m := range ms {
		if m.mountPoint == n.d.WorkflowDir("ns1", "a") {
			mounts++
		}
	}
	if mounts != 1 {
		t.Errorf("workflow a's directory has %d mounts after the restart, want 1", mounts)
	}
	if fi, err := os.Stat(filepath.Join(n.d.WorkflowDir("ns1", "a"), "data", "kept")); err != nil || fi.Size() != 1<<20 {
		t.Errorf("the file written before the restart: %v", err)
	}
	if got := n.attached("uid-2").MemoryLimit; got != memoryTier(40<<20) {
		t.Errorf("after the restart the sidecar is told %d bytes, want %d", got, memoryTier(40<<20))
	}
	if _, err := n.publish("uid-3", "b"); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("publishing b beside the kept 40 MiB of a in 64 MiB: %v, want ResourceExhausted", err)
	}
}

// A workflow directory that a plugin from before the per-workflow mounts filled stays as
// it is, on the store's tmpfs: nothing is mounted over its files, and its sidecars are
// told no limit of the plugin's (their spec's applies).
func TestWorkflowDirectoryFromBeforeKeepsItsFiles(t *testing.T) {
	n := newTierNode(t, Options{StoreSize: 64 << 20}, map[string]int64{"old": 8 << 20})
	kept := filepath.Join(n.d.WorkflowDir("ns1", "old"), "data", "kept")
	if err := os.MkdirAll(filepath.Dir(kept), 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(kept, []byte("written before the upgrade"), 0o644); err != nil {
		t.Fatal(err)
	}
	n.mustPublish("uid-1", "old")
	if m, _, ok := n.workflowMount("old"); ok {
		t.Errorf("a tmpfs was mounted over the workflow's files: %+v", m)
	}
	if b, err := os.ReadFile(kept); err != nil || string(b) != "written before the upgrade" {
		t.Errorf("the workflow's file: %q, %v", b, err)
	}
	if got := n.attached("uid-1").MemoryLimit; got != 0 {
		t.Errorf("the sidecar is told a memory tier of %d bytes, want none", got)
	}
}

// finishedWorkflows is a Retirement and Finisher that says no workflow is retired and
// the workflows of done have finished.
type finishedWorkflows map[string]bool

func (finishedWorkflows) Retired(context.Context, string, string) (bool, error) { return false, nil }

func (f finishedWorkflows) Finished(_ context.Context, _, wf string) (bool, error) {
	return f[wf], nil
}

// A finished workflow kept on the node (no ttlSecondsAfterFinished) counts only what its
// tmpfs holds once none of its volumes is published there: its files stay, its mount
// shrinks, and a workflow that did not fit beside it does. A later pod of the finished
// workflow gets its whole size back once it fits again, never the shrunk one.
func TestFinishedWorkflowKeepsOnlyWhatItHolds(t *testing.T) {
	n := newTierNode(t, Options{StoreSize: 64 << 20}, map[string]int64{"a": 48 << 20, "b": 32 << 20})
	a := n.mustPublish("uid-a", "a")
	if err := n.fill("a", "result", 2<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := n.publish("uid-b", "b"); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("workflow b beside a running a: %v, want ResourceExhausted", err)
	}
	ctx := context.Background()
	// Finished, but a pod still has its volume: nothing changes yet.
	if err := n.d.RetireIf(ctx, finishedWorkflows{"a": true}, "ns1", "a"); err != nil {
		t.Fatal(err)
	}
	if _, size, _ := n.workflowMount("a"); size != 48<<20 {
		t.Errorf("a finished workflow in use has a tmpfs of %d bytes, want its %d", size, 48<<20)
	}
	n.unpublish("uid-a", a)
	// Running, unused: nothing changes either.
	if err := n.d.RetireIf(ctx, finishedWorkflows{}, "ns1", "a"); err != nil {
		t.Fatal(err)
	}
	if _, size, _ := n.workflowMount("a"); size != 48<<20 {
		t.Errorf("a running workflow's tmpfs shrank to %d bytes", size)
	}
	if err := n.d.RetireIf(ctx, finishedWorkflows{"a": true}, "ns1", "a"); err != nil {
		t.Fatal(err)
	}
	_, size, ok := n.workflowMount("a")
	if !ok || size < 2<<20 || size > 4<<20 {
		t.Errorf("the finished workflow's tmpfs is %d bytes (mounted %v), want what it holds (2 MiB) and 1 MiB", size, ok)
	}
	if got, err := os.ReadFile(filepath.Join(n.d.WorkflowDir("ns1", "a"), "data", "result")); err != nil || len(got) != 2<<20 {
		t.Errorf("the finished workflow's file after the shrink: %d bytes, %v", len(got), err)
	}
	b := n.mustPublish("uid-b", "b")

	if _, err := n.publish("uid-a3", "a"); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a late pod of the shrunk workflow beside b: %v, want ResourceExhausted (48 MiB do not fit again)", err)
	}
	n.unpublish("uid-b", b)
	if removed, err := n.d.Retire("ns1", "b"); err != nil || !removed {
		t.Fatalf("retiring workflow b: removed %v, %v", removed, err)
	}
	n.mustPublish("uid-a3", "a")
	if _, size, _ := n.workflowMount("a"); size != 48<<20 {
		t.Errorf("the late pod's workflow has a tmpfs of %d bytes, want its %d again", size, 48<<20)
	}
	if got := n.attached("uid-a3").MemoryLimit; got != memoryTier(48<<20) {
		t.Errorf("the late pod's sidecar is told a memory limit of %d, want %d", got, memoryTier(48<<20))
	}
}

// Every tmpfs of the node store bounds its inodes from its size (one per 8 KiB, at least
// 1,024), so that a tier cannot pin the node's kernel memory with empty files (a 1 MiB
// tier held 200,000 of them, +200 MiB of slab, issue 43); the inodes count against the
// node store beside the bytes (1 KiB each); and a finished workflow's shrunk tier gives
// its unused inodes back too.
func TestMemoryTierBoundsItsInodes(t *testing.T) {
	n := newTierNode(t, Options{StoreSize: 64 << 20}, map[string]int64{"tiny": 1 << 20, "big": 56 << 20, "mid": 32 << 20, "whole": 64 << 20})
	var st unix.Statfs_t
	if err := unix.Statfs(n.d.storeRoot(), &st); err != nil {
		t.Fatal(err)
	}
	if st.Files != uint64(tierInodes(64<<20)) {
		t.Errorf("the node store's own tmpfs holds %d inodes, want %d", st.Files, tierInodes(64<<20))
	}
	target := n.mustPublish("uid-1", "tiny")
	dir := n.d.WorkflowDir("ns1", "tiny")
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	if st.Files != minInodes {
		t.Errorf("a 1 MiB tier holds %d inodes, want the floor %d", st.Files, minInodes)
	}
	// Through the app's own volume (direct mode: the tier itself), as a tenant would.
	made := 0
	var err error
	for ; made < 5000; made++ {
		var f *os.File
		if f, err = os.Create(filepath.Join(target, fmt.Sprintf("e%d", made))); err != nil {
			break
		}
		f.Close()
	}
	if !errors.Is(err, syscall.ENOSPC) || made >= minInodes {
		t.Errorf("created %d empty files in a 1 MiB tier (then %v), want ENOSPC before %d", made, err, minInodes)
	}
	// 56 MiB and 7,168 inodes take 63 MiB of the 64 MiB store; the 1 MiB tier with its
	// 1,024 inodes takes 2 MiB: they do not fit together, though their sizes would.
	if _, err := n.publish("uid-2", "big"); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "7168 inodes") {
		t.Errorf("a 56 MiB tier beside a 1 MiB one in a 64 MiB store: %v, want ResourceExhausted counting its inodes", err)
	}
	mid := n.mustPublish("uid-3", "mid")
	n.unpublish("uid-3", mid)
	if err := n.d.RetireIf(context.Background(), finishedWorkflows{"mid": true}, "ns1", "mid"); err != nil {
		t.Fatal(err)
	}
	if err := unix.Statfs(n.d.WorkflowDir("ns1", "mid"), &st); err != nil {
		t.Fatal(err)
	}
	if used := st.Files - st.Ffree; st.Files > used+shrinkInodeSpare {
		t.Errorf("the finished tier kept %d inodes for the %d it uses, want at most %d more", st.Files, used, shrinkInodeSpare)
	}

	// A workflow asking for the whole store gets the largest tier that fits in it with
	// its inodes, and fits alone.
	n.unpublish("uid-1", target)
	for _, wf := range []string{"tiny", "mid"} {
		if removed, err := n.d.Retire("ns1", wf); err != nil || !removed {
			t.Fatalf("retiring %s: removed %v, %v", wf, removed, err)
		}
	}
	n.mustPublish("uid-4", "whole")
	if _, size, _ := n.workflowMount("whole"); size != largestTier(64<<20) || tierCharge(size, tierInodes(size)) > 64<<20 || size < 56<<20 {
		t.Errorf("a workflow of the store's size got a tier of %d bytes, want %d (8/9 of the store)", size, largestTier(64<<20))
	}
}

// A workflow tmpfs that a plugin from before inode bounds mounted (the kernel's default
// nr_inodes, half the node's RAM pages) gets its inodes bounded when the plugin starts,
// keeping its files, so that it counts its bounded inodes against the store, not
// millions.
func TestRestartedPluginBoundsOldTiersInodes(t *testing.T) {
	n := newTierNode(t, Options{StoreSize: 64 << 20}, nil)
	dir := n.d.WorkflowDir("ns1", "old")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("sluice-workflow", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size=8388608"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "kept"), []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil || st.Files <= uint64(tierInodes(8<<20)) {
		t.Fatalf("the old tier holds %d inodes (%v), want the kernel's default, more than %d", st.Files, err, tierInodes(8<<20))
	}
	n.d.Close()
	n.d = n.start(Options{StoreSize: 64 << 20})
	if err := unix.Statfs(dir, &st); err != nil || st.Files != uint64(tierInodes(8<<20)) {
		t.Errorf("after the restart the old tier holds %d inodes (%v), want %d", st.Files, err, tierInodes(8<<20))
	}
	if b, err := os.ReadFile(filepath.Join(dir, "kept")); err != nil || string(b) != "kept" {
		t.Errorf("the old tier's file: %q, %v", b, err)
	}
}

// A FUSE volume whose workflow's tier cannot be probed for owners (a tenant filled its
// inodes) is not published, rather than mounted without default_permissions, which
// would let every step of the workflow access every file (issue 43): the publish fails
// with Unavailable, and the kubelet tries again.
func TestPublishWithoutThePermissionProbeFails(t *testing.T) {
	n := newTierNode(t, Options{StoreSize: 64 << 20}, map[string]int64{"tiny": 1 << 20})
	target := n.mustPublish("uid-1", "tiny")
	for i := 0; ; i++ {
		f, err := os.Create(filepath.Join(target, fmt.Sprintf("e%d", i)))
		if err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
		f.Close()
	}
	fuseTarget := filepath.Join(n.dir, "pods", "uid-2", v1alpha1.RoleApp)
	if err := os.MkdirAll(filepath.Dir(fuseTarget), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := n.d.NodePublishVolume(context.Background(), &csi.NodePublishVolumeRequest{
		VolumeId: "csi-uid-2-app", TargetPath: fuseTarget,
		VolumeCapability: &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}}},
		VolumeContext: map[string]string{
			ctxEphemeral: "true", ctxPodNamespace: "ns1", ctxPodName: "pod-uid-2", ctxPodUID: "uid-2",
			v1alpha1.VolumeAttrWorkflow: "tiny", v1alpha1.VolumeAttrStep: "c", v1alpha1.VolumeAttrRole: v1alpha1.RoleApp, v1alpha1.VolumeAttrMode: v1alpha1.ModeFUSE,
		},
	})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "permission checks") {
		t.Errorf("publishing a FUSE volume of a tier out of inodes: %v, want Unavailable naming the permission checks", err)
	}
	if m, ok, _ := mountedAt(kernelMounter{}, fuseTarget); ok {
		t.Errorf("the volume was mounted (%+v)", m)
	}
}
