package csidriver

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/published"
)

// sidecarUID is the user the disk tier tests write as: the sidecars' (65532).
const sidecarUID = 65532

// writeAs writes bytes zero bytes into a new file at path as the sidecars' user, without
// capabilities, and returns what the writer said when it failed.
func writeAs(t *testing.T, path string, bytes int64) (string, error) {
	t.Helper()
	cmd := exec.Command("sh", "-c", `head -c "$1" /dev/zero > "$2"`, "sh", strconv.FormatInt(bytes, 10), path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: sidecarUID, Gid: sidecarUID}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// diskNode is a node plugin whose disk tiers are file systems, owned by the sidecars'
// user; every user may traverse its directories. opts is completed with what the node
// uses, for a restart (tierNode.start).
func diskNode(t *testing.T, opts *Options, sizes map[string]WorkflowSizes) *tierNode {
	t.Helper()
	opts.DiskTier = DiskTierFilesystem
	opts.SidecarUID, opts.SidecarGID = sidecarUID, sidecarUID
	n := newTierNode(t, *opts, nil)
	n.sizes = sizes
	for _, d := range []string{filepath.Dir(n.dir), n.dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _ = unmountAll(kernelMounter{}, n.d.diskRoot()) })
	return n
}

// diskMount returns the file system type mounted at workflow wf's disk tier and its size
// in bytes that an unprivileged user may fill ("" when none is).
func (n *tierNode) diskMount(wf string) (string, int64) {
	n.t.Helper()
	dir := n.d.DiskDir("ns1", wf)
	m, ok, err := mountedAt(kernelMounter{}, dir)
	if err != nil {
		n.t.Fatal(err)
	}
	if !ok {
		return "", 0
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		n.t.Fatal(err)
	}
	return m.fsType, int64(st.Blocks-(st.Bfree-st.Bavail)) * st.Bsize
}

// A workflow's disk tier holds at most its spec.volume.disk.sizeLimit, whoever writes
// there: it is a file system of that size, so the kernel refuses the sidecars' user and
// root alike (ENOSPC), not only the sidecar's own accounting. The image behind it is
// root's and outside every pod's view; the sidecar is told a limit below the file
// system's size.
func TestDiskTierIsAFileSystemOfItsSize(t *testing.T) {
	n := diskNode(t, &Options{DiskSize: 2 << 30}, map[string]WorkflowSizes{"a": {DiskTier: true, Disk: 8 << 20}, "big": {DiskTier: true, Disk: 1 << 30}})
	// Formatting writes the file system's structures, not its zeroed inode tables and
	// journal: a new disk tier takes little of the node's disk, whatever its size.
	n.mustPublish("uid-big", "big")
	var big unix.Stat_t
	if err := unix.Lstat(filepath.Join(n.d.diskRoot(), imagesDir, "ns1", "big"), &big); err != nil {
		t.Fatal(err)
	}
	if held := big.Blocks * 512; held > 4<<20 || big.Size != diskImageSize(1<<30) {
		t.Errorf("a new disk tier of 1 GiB takes %d bytes of the node's disk (image of %d), want at most 4 MiB", held, big.Size)
	}
	n.mustPublish("uid-1", "a")
	control := n.mustPublishRole("uid-1", "a", v1alpha1.RoleSidecar)
	fs, size := n.diskMount("a")
	if fs != "ext4" || size < 8<<20 || size > diskImageSize(8<<20) {
		t.Fatalf("the disk tier is %q of %d bytes, want ext4 of at least %d, at most %d", fs, size, 8<<20, diskImageSize(8<<20))
	}
	if got := n.attached("uid-1").DiskLimit; got != diskTierShare(size) || got < 8<<20 {
		t.Errorf("the sidecar is told a disk limit of %d, want %d, at least the sizeLimit", got, diskTierShare(size))
	}
	disk := n.d.DiskDir("ns1", "a")
	if out, err := writeAs(t, filepath.Join(disk, "small"), 4<<20); err != nil {
		t.Fatalf("a write within the limit failed: %v: %s", err, out)
	}
	if out, err := writeAs(t, filepath.Join(disk, "big"), 24<<20); err == nil || !strings.Contains(out, "No space left") {
		t.Errorf("the sidecars' user writing beyond the disk tier's size: %v %q, want ENOSPC", err, out)
	}
	if err := fill(filepath.Join(disk, "root"), 24<<20); !errors.Is(err, unix.ENOSPC) {
		t.Errorf("root writing beyond the disk tier's size: %v, want ENOSPC", err)
	}
	var st unix.Stat_t
	img := filepath.Join(n.d.diskRoot(), imagesDir, "ns1", "a")
	if err := unix.Lstat(img, &st); err != nil || st.Uid != 0 || st.Mode&0o777 != 0o600 || st.Size != diskImageSize(8<<20) {
		t.Errorf("the image %s: uid %d mode %o size %d (%v), want root's, 0600, %d bytes", img, st.Uid, st.Mode&0o777, st.Size, err, diskImageSize(8<<20))
	}
	// The sidecar's control volume shows the file system's root, nothing beside it.
	var ctl, root unix.Stat_t
	if err := unix.Stat(filepath.Join(control, "disk"), &ctl); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(disk, &root); err != nil {
		t.Fatal(err)
	}
	if ctl.Dev != root.Dev || ctl.Ino != root.Ino || ctl.Uid != sidecarUID {
		t.Errorf("the control volume's disk/ is %d:%d (uid %d), want the disk tier's root %d:%d, the sidecars' user's", ctl.Dev, ctl.Ino, ctl.Uid, root.Dev, root.Ino)
	}
}

// A workflow with no disk tier (no spec.tiers.fs, no spec.volume.disk) gets no file
// system, and its sidecars cannot write its disk tier's directory.
func TestWorkflowWithoutDiskTierHoldsNothingOnDisk(t *testing.T) {
	n := diskNode(t, &Options{WorkflowDiskMax: 64 << 20}, map[string]WorkflowSizes{"a": {Memory: 1 << 20}})
	n.mustPublish("uid-1", "a")
	if fs, _ := n.diskMount("a"); fs != "" {
		t.Errorf("a workflow without a disk tier got a %s file system", fs)
	}
	if out, err := writeAs(t, filepath.Join(n.d.DiskDir("ns1", "a"), "f"), 1<<20); err == nil || !strings.Contains(out, "Permission denied") {
		t.Fatalf("a file in the disk tier of a workflow without one: %v %q, want EACCES", err, out)
	}
}

// The disk tiers of a node add up to at most --disk-size: a workflow that does not fit
// beside the others waits (ResourceExhausted) until one is retired, which unmounts its
// file system and removes its image. A restarted plugin counts what it finds; after a
// node's restart (the file system unmounted) the next publish mounts the image again,
// with the files it held.
func TestDiskTiersOfANodeAreBoundedTogether(t *testing.T) {
	opts := Options{DiskSize: 52 << 20}
	n := diskNode(t, &opts, map[string]WorkflowSizes{
		"a": {DiskTier: true, Disk: 24 << 20}, "b": {DiskTier: true, Disk: 24 << 20},
		"c": {DiskTier: true, Disk: 8 << 20}, "d": {DiskTier: true, Disk: 1 << 20},
	})
	a := n.mustPublish("uid-a", "a")
	if _, err := n.publish("uid-b", "b"); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "disk tier") {
		t.Fatalf("workflow b beside a: %v, want ResourceExhausted naming the disk tier", err)
	}
	n.unpublish("uid-a", a)
	if removed, err := n.d.Retire("ns1", "a"); err != nil || !removed {
		t.Fatalf("retiring workflow a: removed %v, %v", removed, err)
	}
	if fs, _ := n.diskMount("a"); fs != "" {
		t.Errorf("the retired workflow's disk tier is still mounted (%s)", fs)
	}
	if _, err := os.Lstat(filepath.Join(n.d.diskRoot(), imagesDir, "ns1", "a")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the retired workflow's image: %v, want it removed", err)
	}
	b := n.mustPublish("uid-b", "b")
	if out, err := writeAs(t, filepath.Join(n.d.DiskDir("ns1", "b"), "kept"), 1<<20); err != nil {
		t.Fatalf("%v: %s", err, out)
	}

	n.d.Close()
	n.d = n.start(opts)
	n.mustPublish("uid-c", "c") // 34 MiB and 16 MiB of the node's 52
	if _, err := n.publish("uid-d", "d"); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a workflow beyond the disk size after a restart: %v, want ResourceExhausted (the restarted plugin counts b and c)", err)
	}

	// The node restarts: no mount survives, the images do.
	n.unpublish("uid-b", b)
	if err := unmountAll(kernelMounter{}, n.d.DiskDir("ns1", "b")); err != nil {
		t.Fatal(err)
	}
	n.mustPublish("uid-b2", "b")
	if fs, _ := n.diskMount("b"); fs != "ext4" {
		t.Fatalf("workflow b's disk tier after the node's restart: %q, want its ext4 again", fs)
	}
	if fi, err := os.Stat(filepath.Join(n.d.DiskDir("ns1", "b"), "kept")); err != nil || fi.Size() != 1<<20 {
		t.Errorf("the file workflow b's disk tier held before the restart: %v", err)
	}
}

// --disk-tier takes auto, filesystem or directory; anything else is refused naming the
// flag; directory makes no file systems.
func TestDiskTierKinds(t *testing.T) {
	dir := t.TempDir()
	if _, err := New(Options{NodeID: "n", StateDir: dir, DiskTier: "sometimes"}); err == nil || !strings.Contains(err.Error(), "--disk-tier") {
		t.Errorf("New with --disk-tier=sometimes: %v, want an error naming the flag", err)
	}
	d, err := New(Options{NodeID: "n", StateDir: dir, DiskTier: DiskTierDirectory})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if d.diskFS {
		t.Error("--disk-tier=directory makes file systems")
	}
}

// A disk tier directory from a plugin that kept disk tiers as directories (an upgrade
// while the workflow runs) keeps its files: no file system is mounted over them.
func TestDiskTierFromBeforeTheFileSystemsKeepsItsFiles(t *testing.T) {
	n := diskNode(t, &Options{WorkflowDiskMax: 64 << 20}, map[string]WorkflowSizes{"old": {DiskTier: true, Disk: 8 << 20}})
	kept := filepath.Join(n.d.DiskDir("ns1", "old"), "kept")
	if err := os.MkdirAll(filepath.Dir(kept), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(kept, []byte("written before the upgrade"), 0o644); err != nil {
		t.Fatal(err)
	}
	n.mustPublish("uid-1", "old")
	if fs, _ := n.diskMount("old"); fs != "" {
		t.Errorf("a %s file system was mounted over the workflow's disk tier files", fs)
	}
	if b, err := os.ReadFile(kept); err != nil || string(b) != "written before the upgrade" {
		t.Errorf("the workflow's disk tier file: %q, %v", b, err)
	}
	if got := n.attached("uid-1").DiskLimit; got != 64<<20 {
		t.Errorf("the sidecar is told a disk limit of %d, want the installation's %d", got, 64<<20)
	}
}

// After the node restarts, a deleted workflow's node store (a tmpfs) is gone but its disk
// tier's image is not: Sweep removes it, and the node's disk size is free again.
func TestSweepRemovesAnOrphanedDiskTier(t *testing.T) {
	opts := Options{DiskSize: 40 << 20}
	n := diskNode(t, &opts, map[string]WorkflowSizes{"a": {DiskTier: true, Disk: 24 << 20}, "b": {DiskTier: true, Disk: 24 << 20}})
	a := n.mustPublish("uid-a", "a")
	n.unpublish("uid-a", a)
	// The node restarts: no mount survives; the node store was a tmpfs.
	if err := unmountAll(kernelMounter{}, n.d.DiskDir("ns1", "a")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(n.d.WorkflowDir("ns1", "a")); err != nil {
		t.Fatal(err)
	}
	if _, err := n.publish("uid-b", "b"); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("workflow b beside a's image: %v, want ResourceExhausted", err)
	}
	if err := n.d.Sweep(context.Background(), retiredWorkflows{"a": true}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(n.d.diskRoot(), imagesDir, "ns1", "a")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the retired workflow's image after the sweep: %v, want it removed", err)
	}
	n.mustPublish("uid-b", "b")
}

// retiredWorkflows is a Retirement that says the workflows it holds are retired.
type retiredWorkflows map[string]bool

func (r retiredWorkflows) Retired(_ context.Context, _, wf string) (bool, error) { return r[wf], nil }

// Retire removes a workflow's publication record before it stops the store server
// (BeforeRetire): the node's store server loop, which starts a server for every
// workflow directory with a record, cannot start one that would hold the tiers Retire
// is removing.
func TestRetireRemovesTheRecordBeforeStoppingTheStoreServer(t *testing.T) {
	n := diskNode(t, &Options{}, map[string]WorkflowSizes{"a": {DiskTier: true, Disk: 8 << 20}})
	a := n.mustPublish("uid-a", "a")
	rec := n.d.RecordDir("ns1", "a")
	if err := published.Record(rec, "uid-wf-a"); err != nil {
		t.Fatal(err)
	}
	var atStop error
	n.d.BeforeRetire(func(string) { _, atStop = os.Stat(rec) })
	n.unpublish("uid-a", a)
	if removed, err := n.d.Retire("ns1", "a"); err != nil || !removed {
		t.Fatalf("retiring workflow a: removed %v, %v", removed, err)
	}
	if !errors.Is(atStop, os.ErrNotExist) {
		t.Errorf("the record when the store server was stopped: %v, want it removed already", atStop)
	}
}

// A directory disk tier (--disk-tier=directory, or auto on a node without loop devices)
// is never unbounded (issue 43): its sidecars are told the bound a file system of the
// workflow would hold, its sizeLimit or, without one, an eighth of --disk-size (half the
// disk's free space when unset), within --workflow-disk-max.
func TestDirectoryDiskTierIsNeverUnbounded(t *testing.T) {
	for _, tc := range []struct {
		name  string
		opts  Options
		sizes WorkflowSizes
		want  func(d *Driver) int64
	}{
		{"unsized", Options{DiskSize: 80 << 20}, WorkflowSizes{DiskTier: true}, func(*Driver) int64 { return 10 << 20 }},
		{"sized", Options{DiskSize: 80 << 20}, WorkflowSizes{DiskTier: true, Disk: 24 << 20}, func(*Driver) int64 { return 24 << 20 }},
		{"above the maximum", Options{DiskSize: 80 << 20, WorkflowDiskMax: 16 << 20}, WorkflowSizes{DiskTier: true, Disk: 24 << 20}, func(*Driver) int64 { return 16 << 20 }},
		{"no disk size", Options{}, WorkflowSizes{DiskTier: true}, func(d *Driver) int64 { return d.opts.DiskSize / 8 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := tc.opts
			opts.DiskTier = DiskTierDirectory
			n := newTierNode(t, opts, nil)
			n.sizes = map[string]WorkflowSizes{"wf": tc.sizes}
			n.mustPublish("uid-1", "wf")
			got, want := n.attached("uid-1").DiskLimit, tc.want(n.d)
			if got != want || got <= 0 {
				t.Errorf("the sidecar of a directory disk tier is told a bound of %d bytes, want %d", got, want)
			}
		})
	}
}
