package csidriver

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/controller/inject"
	"github.com/sluice-io/sluice/csi-driver/handoff"
	"github.com/sluice-io/sluice/internal/published"
	"github.com/sluice-io/sluice/internal/testenv"
)

// The node plugin publishes a csi.sluice.io volume only with the attributes the Sluice
// injector wrote for that namespace and a Workflow that still has the UID they name: a
// pod that writes the volume itself, copies another namespace's or another role's
// attributes, or outlives its Workflow is refused with PermissionDenied before anything
// is created on the node.
func TestPublishRequiresTheInjectorsMark(t *testing.T) {
	testenv.Root(t, "publishing volumes mounts")
	key := bytes.Repeat([]byte{42}, 32)
	uids := map[string]string{"tenant-a/wf": "uid-wf-a", "tenant-b/wf": "uid-wf-b"}
	// tenant-a/wf's sidecars run as a user of their own (status.agentUser).
	users := map[string]int64{"tenant-a/wf": 2100000011}
	dir := t.TempDir()
	d, err := New(Options{NodeID: "node-1", StateDir: filepath.Join(dir, "state"), SidecarUID: os.Getuid(), SidecarGID: os.Getgid(), DiskTier: DiskTierDirectory,
		MarkKey: key, Workflow: func(_ context.Context, ns, name string) (WorkflowIdentity, error) {
			return WorkflowIdentity{UID: uids[ns+"/"+name], User: users[ns+"/"+name]}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)

	// The attributes the injector writes for instance 1 of step c of tenant-a/wf.
	attrs := func(ns string, opts inject.Options) map[string]map[string]string {
		wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Name: "wf", Namespace: ns, UID: "uid-wf-a"},
			Spec: v1alpha1.WorkflowSpec{Steps: []v1alpha1.Step{{Name: "c"}}}}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: ns}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main"}}}}
		if err := inject.Pod(pod, wf, inject.Instance{Step: "c", Instance: 1, Mode: v1alpha1.ModeDirect}, opts); err != nil {
			t.Fatal(err)
		}
		out := map[string]map[string]string{}
		for _, v := range pod.Spec.Volumes {
			if v.CSI != nil {
				out[v.CSI.VolumeAttributes[v1alpha1.VolumeAttrRole]] = v.CSI.VolumeAttributes
			}
		}
		return out
	}
	marked := attrs("tenant-a", inject.Options{Image: "sluice", MarkKey: key})
	n := 0
	publish := func(ns string, a map[string]string) (string, error) {
		n++
		uid := "pod-" + strings.Repeat("x", n)
		target := filepath.Join(dir, "pods", uid, "vol")
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			t.Fatal(err)
		}
		vc := map[string]string{ctxEphemeral: "true", ctxPodNamespace: ns, ctxPodName: "p", ctxPodUID: uid}
		for k, v := range a {
			vc[k] = v
		}
		_, err := d.NodePublishVolume(context.Background(), &csi.NodePublishVolumeRequest{VolumeId: "v-" + uid, TargetPath: target,
			VolumeCapability: &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}}}, VolumeContext: vc})
		if err == nil {
			t.Cleanup(func() {
				if _, err := d.NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: "v-" + uid, TargetPath: target}); err != nil {
					t.Errorf("unpublishing %s: %v", target, err)
				}
			})
		}
		return target, err
	}
	with := func(a map[string]string, k, v string) map[string]string {
		b := map[string]string{}
		for k, v := range a {
			b[k] = v
		}
		b[k] = v
		return b
	}
	for _, role := range []string{v1alpha1.RoleApp, v1alpha1.RoleSidecar} {
		if _, err := publish("tenant-a", marked[role]); err != nil {
			t.Fatalf("the injector's %s volume was refused: %v", role, err)
		}
	}
	// The pod's sidecar is told the Workflow's UID the plugin checked, and the plugin
	// records the publication with that UID, which binds the node's store server to it.
	sock := filepath.Join(d.podsRoot(), "pod-x", handoff.SocketName)
	att, err := handoff.Attach(context.Background(), sock, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if att.Volume.WorkflowUID != "uid-wf-a" {
		t.Errorf("the sidecar was told Workflow UID %q, want uid-wf-a", att.Volume.WorkflowUID)
	}
	if b, err := os.ReadFile(filepath.Join(d.RecordDir("tenant-a", "wf"), published.Dir, published.UIDFile)); err != nil || string(b) != "uid-wf-a" {
		t.Errorf("the publication is recorded with Workflow UID %q (%v), want the checked uid-wf-a", b, err)
	}
	// Its directories on the node are its user's, not the plugin's default sidecar user.
	for _, dir := range []string{filepath.Join(d.WorkflowDir("tenant-a", "wf"), "data"), filepath.Join(d.WorkflowDir("tenant-a", "wf"), "state"),
		d.DiskDir("tenant-a", "wf"), handoff.DirectDir(d.WorkflowDir("tenant-a", "wf"), "pod-x")} {
		var st unix.Stat_t
		if err := unix.Lstat(dir, &st); err != nil || st.Uid != 2100000011 || st.Gid != 2100000011 {
			t.Errorf("%s is owned by %d:%d (%v), want the workflow's user 2100000011", dir, st.Uid, st.Gid, err)
		}
	}

	unmarked := attrs("tenant-a", inject.Options{Image: "sluice"})[v1alpha1.RoleSidecar]
	for name, tc := range map[string]struct {
		ns    string
		attrs map[string]string
		want  string
	}{
		"a volume the pod wrote itself":         {"tenant-a", unmarked, "carries no mark"},
		"tenant-a's attributes in tenant-b":     {"tenant-b", marked[v1alpha1.RoleSidecar], "does not match"},
		"the app volume's mark on role sidecar": {"tenant-a", with(marked[v1alpha1.RoleApp], v1alpha1.VolumeAttrRole, v1alpha1.RoleSidecar), "does not match"},
		"another instance":                      {"tenant-a", with(marked[v1alpha1.RoleApp], v1alpha1.VolumeAttrInstance, "0"), "does not match"},
		"fuse instead of direct":                {"tenant-a", with(marked[v1alpha1.RoleApp], v1alpha1.VolumeAttrMode, v1alpha1.ModeFUSE), "does not match"},
		"another workflow's name":               {"tenant-a", with(marked[v1alpha1.RoleApp], v1alpha1.VolumeAttrWorkflow, "other"), "does not match"},
	} {
		if _, err := publish(tc.ns, tc.attrs); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want PermissionDenied (%s)", name, err, tc.want)
		}
	}
	// The Workflow was deleted and made again under the same name: the old pods'
	// volumes are refused.
	uids["tenant-a/wf"] = "uid-wf-a2"
	if _, err := publish("tenant-a", marked[v1alpha1.RoleApp]); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), `has UID "uid-wf-a2"`) {
		t.Errorf("a recreated Workflow: %v, want PermissionDenied naming the UID", err)
	}
	delete(uids, "tenant-a/wf")
	if _, err := publish("tenant-a", marked[v1alpha1.RoleApp]); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("a deleted Workflow: %v, want PermissionDenied", err)
	}
	// Nothing was made for the refused pods.
	if _, err := os.Stat(d.WorkflowDir("tenant-b", "wf")); !os.IsNotExist(err) {
		t.Errorf("a refused publish made tenant-b's workflow directory: %v", err)
	}
}
