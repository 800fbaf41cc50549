package csidriver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/yaml"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/csi-driver/handoff"
	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/store"
	"github.com/sluice-io/sluice/internal/streamfs"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/internal/testutil"
)

const testSpec = `
steps:
- name: p
  outputs: [{path: out, commit: {rule: OnClose}}]
- name: c
  inputs: [out]`

// TestMain doubles as a minimal sidecar when SLUICE_TEST_SIDECAR names a control
// directory: it attaches to the plugin's hand-off socket there and serves the view of
// step c over the workflow's store, as `sluice sidecar` does, until it is killed.
func TestMain(m *testing.M) {
	if dir := os.Getenv("SLUICE_TEST_SIDECAR"); dir != "" {
		if err := fakeSidecar(dir, os.Getenv("SLUICE_TEST_RESTORE") != ""); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		select {}
	}
	os.Exit(m.Run())
}

func fakeSidecar(dir string, restore bool) error {
	if err := testutil.WaitToProceed(); err != nil {
		return err
	}
	sock := filepath.Join(dir, handoff.SocketName)
	att, err := handoff.Attach(context.Background(), sock, 10*time.Second)
	if err != nil {
		return err
	}
	var spec v1alpha1.WorkflowSpec
	if err := yaml.Unmarshal([]byte(testSpec), &spec); err != nil {
		return err
	}
	rs, errs, _ := semantics.Compile(context.Background(), &spec)
	if len(errs) > 0 {
		return errs.ToAggregate()
	}
	st, err := store.New(filepath.Join(dir, "workflow", "data"), store.Options{})
	if err != nil {
		return err
	}
	eng := semantics.NewEngine(rs)
	if restore {
		// What the transport replays for a restarted sidecar: here, that "out" was written
		// and committed by the producer.
		p, _ := st.Path("out")
		if err := os.WriteFile(p, []byte("restored"), 0o644); err != nil {
			return err
		}
		_ = eng.Create("out", false)
		_ = eng.Write("out", 0, 8)
		_ = eng.Close("out")
	}
	v, err := streamfs.Mount("/dev/fd/"+fmt.Sprint(att.FUSE.Fd()), st, eng, streamfs.Options{
		Step: att.Volume.Step, Instance: att.Volume.Instance, Device: att.FUSE, Init: att.Init,
		SaveInit: func(b []byte) error { return handoff.SaveInit(sock, b) },
		NodeLog:  filepath.Join(dir, "workflow", "state", "views", "pod"),
	})
	if err != nil {
		return err
	}
	fmt.Println("ready")
	if err := v.WaitBlocked(context.Background(), 1); err == nil {
		fmt.Println("blocked")
	}
	return nil
}

// startSidecar starts a fake sidecar (TestMain's other role) for the pod's control
// directory and waits until it serves.
func startSidecar(t *testing.T, controlDir string, restore bool) *testutil.Child {
	t.Helper()
	p := spawnSidecar(t, controlDir, restore, false)
	p.Expect(t, "ready")
	return p
}

// spawnSidecar starts a fake sidecar process; with wait, it attaches only once told to
// (Proceed). Kubernetes starts a restarted sidecar from the kubelet, not from the app;
// the test starts it while the first one still serves (see testutil.StartChild).
func spawnSidecar(t *testing.T, controlDir string, restore, wait bool) *testutil.Child {
	t.Helper()
	env := []string{"SLUICE_TEST_SIDECAR=" + controlDir}
	if restore {
		env = append(env, "SLUICE_TEST_RESTORE=1")
	}
	return testutil.StartChild(t, testutil.ChildOptions{Env: env, Hold: wait})
}

// testDiskSize is the disk tiers' size of the tests' nodes: an unsized workflow's disk
// tier is an eighth of it (--disk-size; the default, the test file system's size, would
// format tiers of gigabytes).
const testDiskSize = 512 << 20

type testNode struct {
	t   *testing.T
	d   *Driver
	dir string
}

func newTestNode(t *testing.T) *testNode {
	t.Helper()
	testenv.Root(t, "publishing volumes mounts")
	dir := t.TempDir()
	// The workflows' disk tier file systems stay mounted when the plugin stops.
	t.Cleanup(func() { _ = unmountAll(kernelMounter{}, dir) })
	d, err := New(Options{NodeID: "node-1", StateDir: filepath.Join(dir, "state"), SidecarUID: os.Getuid(), SidecarGID: os.Getgid(),
		DiskSize: testDiskSize})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	return &testNode{t: t, d: d, dir: dir}
}

// publish publishes a volume of pod uid in namespace ns at a fresh target and returns
// the target.
func (n *testNode) publish(uid, ns, role, mode string) (string, error) {
	target := filepath.Join(n.dir, "pods", uid, "volumes", role)
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		n.t.Fatal(err)
	}
	_, err := n.d.NodePublishVolume(context.Background(), &csi.NodePublishVolumeRequest{
		VolumeId:         "csi-" + uid + "-" + role,
		TargetPath:       target,
		VolumeCapability: &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}}},
		VolumeContext: map[string]string{
			ctxEphemeral: "true", ctxPodNamespace: ns, ctxPodName: "pod-" + uid, ctxPodUID: uid,
			v1alpha1.VolumeAttrWorkflow: "wf", v1alpha1.VolumeAttrStep: "c", v1alpha1.VolumeAttrRole: role, v1alpha1.VolumeAttrMode: mode,
		},
	})
	if err == nil {
		n.t.Cleanup(func() { n.unpublish(uid, target) })
	}
	return target, err
}

func (n *testNode) unpublish(uid, target string) {
	_, err := n.d.NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: "csi-" + uid, TargetPath: target})
	if err != nil {
		n.t.Errorf("unpublishing %s: %v", target, err)
	}
}

// A pod's app volume is a FUSE mount served by the pod's sidecar through the handed-over
// descriptor; the bytes land in the workflow's store. When the sidecar is killed while a
// reader waits in open(), the reader stalls (never ENOTCONN) until a sidecar serves the
// mount again; the restarted sidecar takes the same mount over (the kept INIT, the
// kernel resending what the dead one held), so the parked request is answered rather
// than left hanging, and new opens are served.
func TestSidecarRestartKeepsTheMount(t *testing.T) {
	n := newTestNode(t)
	app, err := n.publish("uid-1", "ns1", v1alpha1.RoleApp, v1alpha1.ModeFUSE)
	if err != nil {
		t.Fatal(err)
	}
	control, err := n.publish("uid-1", "ns1", v1alpha1.RoleSidecar, "")
	if err != nil {
		t.Fatal(err)
	}
	first := startSidecar(t, control, false)

	if err := os.WriteFile(filepath.Join(app, "plain.txt"), []byte("through FUSE"), 0o644); err != nil {
		t.Fatal(err)
	}
	stored, err := os.ReadFile(filepath.Join(n.d.WorkflowDir("ns1", "wf"), "data", "plain.txt"))
	if err != nil || string(stored) != "through FUSE" {
		t.Fatalf("the workflow's store holds %q (%v)", stored, err)
	}

	// Files the app holds open across the restart: one it reads, one it writes.
	reading, err := os.Open(filepath.Join(app, "plain.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer reading.Close()
	head := make([]byte, 7)
	if _, err := io.ReadFull(reading, head); err != nil || string(head) != "through" {
		t.Fatalf("reading plain.txt before the restart: %q (%v)", head, err)
	}
	writing, err := os.Create(filepath.Join(app, "log.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer writing.Close()
	if _, err := writing.WriteString("before;"); err != nil {
		t.Fatal(err)
	}

	parked := make(chan error, 1)
	go func() {
		b, err := os.ReadFile(filepath.Join(app, "out"))
		if err == nil && string(b) != "restored" {
			err = fmt.Errorf("read %q, want the committed bytes", b)
		}
		parked <- err
	}()
	first.Expect(t, "blocked") // the reader waits in the first sidecar for "out"
	second := spawnSidecar(t, control, true, true)
	first.Kill()

	select {
	case err := <-parked:
		t.Fatalf("the reader returned (%v) while no sidecar served the volume; it must stall", err)
	default:
	}
	second.Proceed(t)
	select {
	case err := <-parked:
		if err != nil {
			t.Fatalf("the reader parked in open() across the restart: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the parked request was never answered after the sidecar restarted")
	}
	// A request naming a node of the first sidecar that no path walk revived (log.txt is
	// not looked up again): an extended attribute asked through the open descriptor.
	if _, err := unix.Fgetxattr(int(writing.Fd()), "user.absent", make([]byte, 64)); !errors.Is(err, unix.ENODATA) {
		t.Errorf("getxattr through the descriptor opened before the restart: %v, want ENODATA", err)
	}
	if b, err := os.ReadFile(filepath.Join(app, "out")); err != nil || string(b) != "restored" {
		t.Errorf("after the restart out reads %q (%v), want its committed bytes", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(app, "plain.txt")); err != nil || string(b) != "through FUSE" {
		t.Errorf("after the restart plain.txt reads %q (%v)", b, err)
	}
	// The handles of the dead sidecar keep working with the new one.
	if rest, err := io.ReadAll(reading); err != nil || string(rest) != " FUSE" {
		t.Errorf("the descriptor opened before the restart reads %q (%v), want the rest of plain.txt", rest, err)
	}
	if _, err := writing.WriteString("after"); err != nil {
		t.Errorf("writing through the descriptor opened before the restart: %v", err)
	}
	if err := writing.Close(); err != nil {
		t.Errorf("closing the descriptor opened before the restart: %v", err)
	}
	stored, err = os.ReadFile(filepath.Join(n.d.WorkflowDir("ns1", "wf"), "data", "log.txt"))
	if err != nil || string(stored) != "before;after" {
		t.Errorf("the store holds log.txt as %q (%v), want what was written on both sides of the restart", stored, err)
	}
}

// Publishing is idempotent; a direct volume is the pod's own directory next to the node
// store; unpublishing removes the target, that directory and, with the pod's last volume,
// the pod's control directory; unpublishing again succeeds.
func TestPublishIdempotent(t *testing.T) {
	n := newTestNode(t)
	app, err := n.publish("uid-2", "ns1", v1alpha1.RoleApp, v1alpha1.ModeDirect)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.publish("uid-2", "ns1", v1alpha1.RoleApp, v1alpha1.ModeDirect); err != nil {
		t.Fatalf("publishing again: %v", err)
	}
	if err := os.WriteFile(filepath.Join(app, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	direct := handoff.DirectDir(n.d.WorkflowDir("ns1", "wf"), "uid-2")
	if _, err := os.Stat(filepath.Join(direct, "f")); err != nil {
		t.Fatalf("direct mode does not show the pod's directory: %v", err)
	}
	if _, err := os.Stat(filepath.Join(n.d.WorkflowDir("ns1", "wf"), "data", "f")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the app wrote the node store directly (the sidecar ingests what it may): %v", err)
	}
	n.unpublish("uid-2", app)
	if _, err := os.Stat(app); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("target still there after unpublish: %v", err)
	}
	if _, err := os.Stat(direct); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the pod's direct directory outlived its volume: %v", err)
	}
	if _, err := os.Stat(filepath.Join(n.d.podsRoot(), "uid-2")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the pod's control directory outlived its last volume: %v", err)
	}
	n.unpublish("uid-2", app)
}

// A workflow's store is published only to pods of its namespace: two pods naming the
// same workflow from two namespaces see two different stores.
func TestStorePerNamespace(t *testing.T) {
	n := newTestNode(t)
	a, err := n.publish("uid-a", "team-a", v1alpha1.RoleApp, v1alpha1.ModeDirect)
	if err != nil {
		t.Fatal(err)
	}
	b, err := n.publish("uid-b", "team-b", v1alpha1.RoleApp, v1alpha1.ModeDirect)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(a, "secret"), []byte("a's"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(b, "secret")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a pod of namespace team-b sees team-a's file: %v", err)
	}
}

// Bad requests fail with InvalidArgument naming the field or attribute (a unit test: the
// node plugin mounts nothing).
func TestPublishRefusesBadRequests(t *testing.T) {
	n, _ := newFakeNode(t)
	base := func() *csi.NodePublishVolumeRequest {
		return &csi.NodePublishVolumeRequest{
			VolumeId: "v", TargetPath: filepath.Join(n.dir, "t"),
			VolumeCapability: &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}}},
			VolumeContext: map[string]string{ctxEphemeral: "true", ctxPodNamespace: "ns", ctxPodUID: "u", ctxPodName: "p",
				v1alpha1.VolumeAttrWorkflow: "wf", v1alpha1.VolumeAttrStep: "s"},
		}
	}
	cases := map[string]func(r *csi.NodePublishVolumeRequest){
		"volume_id":                 func(r *csi.NodePublishVolumeRequest) { r.VolumeId = "" },
		"target_path":               func(r *csi.NodePublishVolumeRequest) { r.TargetPath = "" },
		"volume_capability":         func(r *csi.NodePublishVolumeRequest) { r.VolumeCapability = nil },
		"ephemeral":                 func(r *csi.NodePublishVolumeRequest) { delete(r.VolumeContext, ctxEphemeral) },
		"pod.namespace":             func(r *csi.NodePublishVolumeRequest) { r.VolumeContext[ctxPodNamespace] = "../etc" },
		"pod.uid":                   func(r *csi.NodePublishVolumeRequest) { r.VolumeContext[ctxPodUID] = "../../x" },
		v1alpha1.VolumeAttrWorkflow: func(r *csi.NodePublishVolumeRequest) { r.VolumeContext[v1alpha1.VolumeAttrWorkflow] = "../other" },
		v1alpha1.VolumeAttrStep:     func(r *csi.NodePublishVolumeRequest) { delete(r.VolumeContext, v1alpha1.VolumeAttrStep) },
		v1alpha1.VolumeAttrInstance: func(r *csi.NodePublishVolumeRequest) { r.VolumeContext[v1alpha1.VolumeAttrInstance] = "-1" },
		v1alpha1.VolumeAttrMode:     func(r *csi.NodePublishVolumeRequest) { r.VolumeContext[v1alpha1.VolumeAttrMode] = "nfs" },
		"block access is not supp": func(r *csi.NodePublishVolumeRequest) {
			r.VolumeCapability = &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}}
		},
	}
	for name, mutate := range cases {
		req := base()
		mutate(req)
		_, err := n.d.NodePublishVolume(context.Background(), req)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: got %v, want InvalidArgument naming it", name, err)
		}
	}
}

type retireAll bool

func (r retireAll) Retired(context.Context, string, string) (bool, error) { return bool(r), nil }

// A retired workflow's node store is removed, but only once no volume uses it.
func TestRetireWaitsForTheLastVolume(t *testing.T) {
	n := newTestNode(t)
	app, err := n.publish("uid-r", "ns1", v1alpha1.RoleApp, v1alpha1.ModeDirect)
	if err != nil {
		t.Fatal(err)
	}
	dir, disk := n.d.WorkflowDir("ns1", "wf"), n.d.DiskDir("ns1", "wf")
	if _, err := os.Stat(disk); err != nil {
		t.Fatalf("publishing made no disk tier directory: %v", err)
	}
	var stopped []string
	n.d.BeforeRetire(func(dir string) { stopped = append(stopped, dir) })
	if removed, err := n.d.Retire("ns1", "wf"); err != nil || removed {
		t.Fatalf("retired a store in use: removed %v, %v", removed, err)
	}
	n.unpublish("uid-r", app)
	if err := n.d.Sweep(context.Background(), retireAll(true)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the retired workflow's store is still there: %v", err)
	}
	if _, err := os.Stat(disk); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the retired workflow's disk tier is still there: %v", err)
	}
	if len(stopped) != 1 || stopped[0] != dir {
		t.Errorf("BeforeRetire saw %v, want [%s]", stopped, dir)
	}
}

// Unpublishing a target that never was published succeeds, as the CSI spec requires.
func TestUnpublishUnknownTarget(t *testing.T) {
	n, _ := newFakeNode(t)
	_, err := n.d.NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: "v", TargetPath: filepath.Join(n.dir, "nothing")})
	if err != nil {
		t.Fatal(err)
	}
}
