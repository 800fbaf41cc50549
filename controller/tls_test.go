package controller

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/podconfig"
	"github.com/sluice-io/sluice/internal/testutil"
)

// With TLS on, every workflow's configuration Secret carries the installation's CA
// certificate (the sidecars verify NATS and MinIO with it) and nothing of its key; a
// Secret written before TLS was on gets it at the next reconcile.
func TestWorkflowSecretCarriesTheInstallationCA(t *testing.T) {
	ca := testutil.IssueServerTLS(t).CA
	e := startEnv(t, func(r *WorkflowReconciler) { r.CA = ca })
	ctx := context.Background()
	ns := e.namespace(t, "tls-ca")
	wf := workflowFrom(t, ns, pipeline)
	wf.Spec.Storage = nil // the installation has no storage here
	if err := e.k8s.Create(ctx, wf); err != nil {
		t.Fatal(err)
	}
	key := types.NamespacedName{Namespace: ns, Name: podconfig.SecretName(wf.Name)}
	secretHasCA := func() error {
		var sec corev1.Secret
		if err := e.k8s.Get(ctx, key, &sec); err != nil {
			return err
		}
		if !bytes.Equal(sec.Data[v1alpha1.SecretKeyInstallationCA], ca) {
			return fmt.Errorf("the Secret's %s is %q", v1alpha1.SecretKeyInstallationCA, sec.Data[v1alpha1.SecretKeyInstallationCA])
		}
		if _, ok := sec.Data[v1alpha1.SecretKeyCAKey]; ok {
			return fmt.Errorf("the Secret holds %s", v1alpha1.SecretKeyCAKey)
		}
		return nil
	}
	eventually(t, 20*time.Second, "the configuration Secret carries the CA", secretHasCA)

	// A Secret from before TLS: the CA is added.
	var sec corev1.Secret
	if err := e.k8s.Get(ctx, key, &sec); err != nil {
		t.Fatal(err)
	}
	delete(sec.Data, v1alpha1.SecretKeyInstallationCA)
	if err := e.k8s.Update(ctx, &sec); err != nil {
		t.Fatal(err)
	}
	// The controller does not watch Secrets: the next reconcile (here one a change of
	// the Workflow starts; at the latest secretCheckEvery later) adds it.
	poke := client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"test.sluice.io/poke":"1"}}}`))
	if err := e.k8s.Patch(ctx, wf, poke); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the CA added to an older Secret", secretHasCA)
}
