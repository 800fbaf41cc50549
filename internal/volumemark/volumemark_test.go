package volumemark

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

// A mark verifies for exactly the attributes it was made for, under its key only.
func TestMarkCoversEveryAttribute(t *testing.T) {
	key := bytes.Repeat([]byte{7}, KeySize)
	m := Mark{Namespace: "tenant-a", Workflow: "wf", WorkflowUID: "u-1", Step: "s", Instance: 2, Role: "app", Mode: "fuse"}
	mark := Sign(key, m)
	if err := Verify(key, m, mark); err != nil {
		t.Fatalf("the injector's own mark: %v", err)
	}
	if err := Verify(key, m, ""); !errors.Is(err, ErrNoMark) {
		t.Errorf("no mark: %v, want ErrNoMark", err)
	}
	for name, forged := range map[string]Mark{
		"another namespace":    {Namespace: "tenant-b", Workflow: "wf", WorkflowUID: "u-1", Step: "s", Instance: 2, Role: "app", Mode: "fuse"},
		"another workflow":     {Namespace: "tenant-a", Workflow: "wf2", WorkflowUID: "u-1", Step: "s", Instance: 2, Role: "app", Mode: "fuse"},
		"a recreated workflow": {Namespace: "tenant-a", Workflow: "wf", WorkflowUID: "u-2", Step: "s", Instance: 2, Role: "app", Mode: "fuse"},
		"another instance":     {Namespace: "tenant-a", Workflow: "wf", WorkflowUID: "u-1", Step: "s", Instance: 3, Role: "app", Mode: "fuse"},
		"the sidecar's role":   {Namespace: "tenant-a", Workflow: "wf", WorkflowUID: "u-1", Step: "s", Instance: 2, Role: "sidecar", Mode: "fuse"},
		"direct mode":          {Namespace: "tenant-a", Workflow: "wf", WorkflowUID: "u-1", Step: "s", Instance: 2, Role: "app", Mode: "direct"},
		"fields run together":  {Namespace: "tenant-a", Workflow: "wf\x00u-1", WorkflowUID: "", Step: "s", Instance: 2, Role: "app", Mode: "fuse"},
	} {
		if err := Verify(key, forged, mark); !errors.Is(err, ErrBadMark) {
			t.Errorf("%s accepted the mark (%v)", name, err)
		}
	}
	if err := Verify(bytes.Repeat([]byte{8}, KeySize), m, mark); !errors.Is(err, ErrBadMark) {
		t.Errorf("another key accepted the mark (%v)", err)
	}
	if err := Verify(key, m, "not base64!"); !errors.Is(err, ErrBadMark) {
		t.Errorf("garbage accepted (%v)", err)
	}
}

// The controller makes the key once and every later start (or replica) reads the same;
// the node plugin loads it from the mounted Secret.
func TestBootstrapKeepsOneKey(t *testing.T) {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	c := fake.NewClientBuilder().WithScheme(s).Build()
	ctx := context.Background()
	k1, err := Bootstrap(ctx, c, "sluice-system", "sluice-volume-mark")
	if err != nil {
		t.Fatal(err)
	}
	k2, err := Bootstrap(ctx, c, "sluice-system", "sluice-volume-mark")
	if err != nil || !bytes.Equal(k1, k2) || len(k1) != KeySize {
		t.Fatalf("second bootstrap: %x, %v; want the first key %x", k2, err, k1)
	}
	var sec corev1.Secret
	if err := c.Get(ctx, types.NamespacedName{Namespace: "sluice-system", Name: "sluice-volume-mark"}, &sec); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), SecretKey)
	if err := os.WriteFile(path, sec.Data[SecretKey], 0o400); err != nil {
		t.Fatal(err)
	}
	if got, err := LoadKey(path); err != nil || !bytes.Equal(got, k1) {
		t.Fatalf("LoadKey: %x, %v", got, err)
	}
	// Another file: rewriting the read-only one takes root (make unit runs as anyone).
	short := filepath.Join(filepath.Dir(path), "short")
	if err := os.WriteFile(short, []byte("short"), 0o400); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadKey(short); err == nil {
		t.Error("LoadKey accepted a 5-byte key")
	}
}
