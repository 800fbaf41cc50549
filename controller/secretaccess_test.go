package controller

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sluice-io/sluice/internal/podconfig"
)

// The controller's token cannot list or watch Secrets (issue 43, finding 5: a stolen one
// listed every Secret of the cluster; RBAC can grant list and watch only for all of
// them), and the controller still runs workflows with deploy/base's RBAC and nothing
// more: it makes a workflow's Secret and pods, and puts a deleted Secret back.
func TestControllerRunsWithoutListingSecrets(t *testing.T) {
	te := clusterOf(t)
	admin := startClient(t, te)
	installFromDeployBase(t, admin, "ClusterRole//sluice-controller", "ClusterRoleBinding//sluice-controller")
	ctx := context.Background()
	as, err := client.New(controllerConfig(te), client.Options{Scheme: te.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	for _, what := range []struct {
		name string
		call func() error
	}{
		{"list", func() error { return as.List(ctx, &corev1.SecretList{}) }},
		{"watch", func() error {
			w, err := client.NewWithWatch(controllerConfig(te), client.Options{Scheme: te.Scheme})
			if err != nil {
				return err
			}
			wi, err := w.Watch(ctx, &corev1.SecretList{})
			if err == nil {
				wi.Stop()
			}
			return err
		}},
	} {
		// RBAC objects take effect at once; a refusal is Forbidden.
		if err := what.call(); !apierrors.IsForbidden(err) {
			t.Errorf("the controller's token may %s the cluster's Secrets (err %v); want Forbidden", what.name, err)
		}
	}

	e := startEnvAs(t, te, controllerConfig(te))
	ns := e.namespace(t, "uncached-secrets")
	wf := oneStepWorkflow(t, ns, "pipe")
	if err := e.k8s.Create(ctx, wf); err != nil {
		t.Fatal(err)
	}
	key := types.NamespacedName{Namespace: ns, Name: podconfig.SecretName("pipe")}
	var sec corev1.Secret
	eventually(t, 30*time.Second, "the workflow's Secret", func() error { return e.k8s.Get(ctx, key, &sec) })
	eventually(t, 30*time.Second, "the step's pod", func() error {
		return e.k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "pipe-a-0"}, &corev1.Pod{})
	})
	// A deleted Secret is made again at the next reconcile (here one the Workflow's
	// change starts; at the latest secretCheckEvery later).
	if err := e.k8s.Delete(ctx, &sec); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the Secret gone", func() error {
		err := e.k8s.Get(ctx, key, &corev1.Secret{})
		if err == nil {
			return errors.New("the Secret is still there")
		}
		if !apierrors.IsNotFound(err) {
			return err
		}
		return nil
	})
	patch := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"test.sluice.io/poke":"1"}}}`))
	if err := e.k8s.Patch(ctx, wf, patch); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the Secret made again", func() error {
		var again corev1.Secret
		if err := e.k8s.Get(ctx, key, &again); err != nil {
			return err
		}
		if again.UID == sec.UID {
			return errors.New("the deleted Secret is still there")
		}
		return nil
	})
}
