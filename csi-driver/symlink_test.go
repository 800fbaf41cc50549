package csidriver

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/sluice-io/sluice/api/v1alpha1"
)

// A tenant that replaces a directory of its workflow's directory with a symlink (to the
// kubelet's pods directory, say) must not make the plugin chmod, chown or bind-mount the
// symlink's target when it publishes the next pod (issue 32, finding 3).
func TestPublishFollowsNoPlantedSymlink(t *testing.T) {
	for _, planted := range []string{"direct", "state"} {
		t.Run(planted, func(t *testing.T) {
			n := newTestNode(t)
			if _, err := n.publish("uid-a", "team", v1alpha1.RoleApp, v1alpha1.ModeDirect); err != nil {
				t.Fatal(err)
			}
			victim := filepath.Join(t.TempDir(), "kubelet-pods")
			if err := os.MkdirAll(filepath.Join(victim, "uid-b"), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(victim, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(victim, "uid-b", "token"), []byte("service account token"), 0o600); err != nil {
				t.Fatal(err)
			}
			at := filepath.Join(n.d.WorkflowDir("team", "wf"), planted)
			if err := os.RemoveAll(at); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(victim, at); err != nil {
				t.Fatal(err)
			}
			target, err := n.publish("uid-b", "team", v1alpha1.RoleApp, v1alpha1.ModeDirect)
			if err == nil {
				t.Error("published a pod's volume through a planted symlink")
			}
			for _, dir := range []string{victim, filepath.Join(victim, "uid-b")} {
				if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o700 {
					t.Errorf("%s: %v, mode %v; want it untouched (0700)", dir, err, st.Mode().Perm())
				}
			}
			if _, err := os.Stat(filepath.Join(target, "token")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the pod's volume shows the symlink's target (%v)", err)
			}
			if _, mounted, _ := mountedAt(kernelMounter{}, target); mounted {
				t.Error("something is mounted at the refused volume's target")
			}
		})
	}
}

// A sidecar-role volume shows the sidecar the workflow's data and state and its own pod's
// direct directory, never the workflow's directory itself: another pod's direct
// directory is out of its reach.
func TestSidecarVolumeBindsOnlyWhatItNeeds(t *testing.T) {
	n := newTestNode(t)
	if _, err := n.publish("uid-b", "team", v1alpha1.RoleApp, v1alpha1.ModeDirect); err != nil {
		t.Fatal(err)
	}
	ctl, err := n.publish("uid-a", "team", v1alpha1.RoleSidecar, v1alpha1.ModeDirect)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(ctl, "workflow", "direct", "uid-b")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pod uid-a's sidecar sees pod uid-b's direct directory (%v)", err)
	}
	wdir := n.d.WorkflowDir("team", "wf")
	if err := os.WriteFile(filepath.Join(wdir, "server"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(ctl, "workflow", "server")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the sidecar's workflow/ is the workflow's directory (%v)", err)
	}
	for _, sub := range []string{"data", "state", "direct/uid-a"} {
		name := filepath.Join(ctl, "workflow", sub, "x")
		if err := os.WriteFile(name, []byte(sub), 0o644); err != nil {
			t.Fatalf("the sidecar cannot write its workflow/%s: %v", sub, err)
		}
		if b, err := os.ReadFile(filepath.Join(wdir, sub, "x")); err != nil || string(b) != sub {
			t.Errorf("workflow/%s is not the workflow's %s: %q, %v", sub, sub, b, err)
		}
	}
}
