package controller

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/podconfig"
)

// A workflow storing permanent files in the installation's bucket gets its configuration
// Secret (without which its sidecars cannot start, so nothing uploads) only once the
// bucket exists; until then it is Ready=False with reason StorageMissing.
func TestWorkflowWaitsForTheInstallationsBucket(t *testing.T) {
	var ready atomic.Bool
	e := startEnv(t, func(r *WorkflowReconciler) {
		r.Storage = &podconfig.Storage{Endpoint: "minio.example:9000", Bucket: "sluice", AccessKey: "a", SecretKey: "b"}
		r.StorageReady = ready.Load
	})
	ctx := context.Background()
	ns := e.namespace(t, "bucket")
	if err := e.k8s.Create(ctx, workflowFrom(t, ns, `
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: keeps}
spec:
  permanent: [out.txt]
  steps:
  - name: a
    outputs: [{path: out.txt}]
`)); err != nil {
		t.Fatal(err)
	}
	secret := types.NamespacedName{Namespace: ns, Name: podconfig.SecretName("keeps")}
	eventually(t, 20*time.Second, "Ready=False StorageMissing", func() error {
		wf, err := e.workflow(ns, "keeps")
		if err != nil {
			return err
		}
		c := meta.FindStatusCondition(wf.Status.Conditions, v1alpha1.ConditionReady)
		if c == nil || c.Status != "False" || c.Reason != ReasonStorageMissing {
			return fmt.Errorf("Ready condition %+v", c)
		}
		return nil
	})
	if err := e.k8s.Get(ctx, secret, &corev1.Secret{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the configuration Secret exists before the bucket does (%v)", err)
	}
	ready.Store(true)
	eventually(t, 20*time.Second, "the Secret once the bucket exists", func() error {
		return e.k8s.Get(ctx, secret, &corev1.Secret{})
	})
}
