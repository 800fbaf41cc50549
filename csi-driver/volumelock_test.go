package csidriver

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-io/sluice/api/v1alpha1"
)

// An operation on a volume while another on the same volume is in progress is answered
// Aborted at once, and the kubelet retries it, as csi-driver-nfs does; operations on
// other volumes go on meanwhile. (With one lock for the whole plugin held across the
// mount calls, both waited behind the first publish.)
func TestOperationsOnABusyVolumeAbort(t *testing.T) {
	n, f := newFakeNode(t)
	req := func(uid string) *csi.NodePublishVolumeRequest {
		target := filepath.Join(n.dir, "pods", uid, "volumes", "app")
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			t.Fatal(err)
		}
		return &csi.NodePublishVolumeRequest{
			VolumeId: "csi-" + uid, TargetPath: target,
			VolumeCapability: &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}}},
			VolumeContext: map[string]string{ctxEphemeral: "true", ctxPodNamespace: "ns1", ctxPodName: "pod-" + uid, ctxPodUID: uid,
				v1alpha1.VolumeAttrWorkflow: "wf", v1alpha1.VolumeAttrStep: "c", v1alpha1.VolumeAttrMode: v1alpha1.ModeDirect},
		}
	}
	busy := req("uid-1")
	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	f.onMount = func(target string) {
		if target == busy.TargetPath {
			close(held)
			<-release
		}
	}
	first := make(chan error, 1)
	go func() {
		_, err := n.d.NodePublishVolume(context.Background(), busy)
		first <- err
	}()
	<-held // the first publish is in its mount call

	within := func(what string, call func() error) error {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- call() }()
		select {
		case err := <-done:
			return err
		case <-time.After(5 * time.Second):
			t.Fatalf("%s waited for the publish in progress", what)
			return nil
		}
	}
	err := within("a second publish of the volume", func() error {
		_, err := n.d.NodePublishVolume(context.Background(), busy)
		return err
	})
	if status.Code(err) != codes.Aborted {
		t.Errorf("a second publish of the volume: %v, want Aborted", err)
	}
	err = within("an unpublish of the volume", func() error {
		_, err := n.d.NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: busy.VolumeId, TargetPath: busy.TargetPath})
		return err
	})
	if status.Code(err) != codes.Aborted {
		t.Errorf("an unpublish of the volume: %v, want Aborted", err)
	}
	other := req("uid-2")
	if err := within("a publish of another volume", func() error {
		_, err := n.d.NodePublishVolume(context.Background(), other)
		return err
	}); err != nil {
		t.Errorf("a publish of another volume: %v", err)
	}

	once.Do(func() { close(release) })
	if err := <-first; err != nil {
		t.Fatalf("the first publish: %v", err)
	}
	for _, r := range []*csi.NodePublishVolumeRequest{busy, other} {
		if _, err := n.d.NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: r.VolumeId, TargetPath: r.TargetPath}); err != nil {
			t.Errorf("unpublishing %s: %v", r.VolumeId, err)
		}
	}
}
