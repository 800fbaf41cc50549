package controller

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sluice-io/sluice/internal/objstore"
	"github.com/sluice-io/sluice/internal/podconfig"
	"github.com/sluice-io/sluice/internal/servers"
	"github.com/sluice-io/sluice/internal/testenv"
)

// With versitygw as the installation's storage (--storage-accounts=versitygw), the
// controller gives a workflow keys of versitygw's own IAM that store under the workflow's
// prefix and nowhere else (another tenant's object is AccessDenied); an account deleted
// behind its back is made again, with the same keys, at the periodic check; deleting the
// Workflow deletes the account, whose keys then stop working.
func TestWorkflowGetsVersityGWKeysOfItsOwnPrefix(t *testing.T) {
	testenv.Integration(t, "versitygw (hack/servers.sh)")
	g, err := servers.StartVersityGW(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Stop)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	root, err := g.Bucket(ctx, "sluice")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := root.PutObject(ctx, "sluice", "other-tenant/wf/secret.txt", strings.NewReader("not yours\n"), 10, minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	rootKeys := objstore.Credentials{AccessKey: g.AccessKey, SecretKey: g.SecretKey}
	if err := objstore.SetupVersityGWUser(ctx, g.AdminEndpoint, false, rootKeys, "sluice-installation", "installation-secret-1"); err != nil {
		t.Fatal(err)
	}
	st := &podconfig.Storage{Endpoint: g.Endpoint, Bucket: "sluice", AccessKey: "sluice-installation", SecretKey: "installation-secret-1"}
	accounts, err := objstore.NewVersityGWAccounts(g.Endpoint, g.AdminEndpoint, "sluice", false, objstore.Credentials{AccessKey: st.AccessKey, SecretKey: st.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	// The root's view of the accounts, to delete one behind the controller's back.
	rootAccounts, err := objstore.NewVersityGWAccounts(g.Endpoint, g.AdminEndpoint, "sluice", false, rootKeys)
	if err != nil {
		t.Fatal(err)
	}
	e := startEnv(t, func(r *WorkflowReconciler) {
		r.Storage, r.StorageAccounts, r.AccountCheckEvery = st, accounts, 2*time.Second
	})
	ns := e.namespace(t, "vgw")
	wf := workflowFrom(t, ns, `
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: keeps}
spec:
  permanent: [out.txt]
  steps:
  - name: a
    outputs: [{path: out.txt}]
`)
	if err := e.k8s.Create(ctx, wf); err != nil {
		t.Fatal(err)
	}
	var sec corev1.Secret
	key := types.NamespacedName{Namespace: ns, Name: podconfig.SecretName("keeps")}
	eventually(t, 30*time.Second, "the configuration Secret", func() error { return e.k8s.Get(ctx, key, &sec) })
	keys := storageOf(t, &sec)
	if keys.AccessKey == st.AccessKey || keys.Prefix != ns+"/keeps/" {
		t.Fatalf("the workflow's storage %+v: want keys of its own for %s/keeps/", keys, ns)
	}
	if err := keysStore(ctx, keys); err != nil {
		t.Fatalf("the workflow's keys storing under its prefix: %v", err)
	}
	wfClient, err := minio.New(g.Endpoint, &minio.Options{Creds: credentials.NewStaticV4(keys.AccessKey, keys.SecretKey, "")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wfClient.StatObject(ctx, "sluice", "other-tenant/wf/secret.txt", minio.StatObjectOptions{}); minio.ToErrorResponse(err).Code != "AccessDenied" {
		t.Errorf("the workflow's keys reading another tenant's object: %v, want AccessDenied", err)
	}

	if err := rootAccounts.Remove(ctx, keys.AccessKey); err != nil {
		t.Fatal(err)
	}
	if err := keysStore(ctx, keys); err == nil {
		t.Fatal("the keys still store after their account was deleted")
	}
	eventually(t, 30*time.Second, "the account made again", func() error { return keysStore(ctx, keys) })

	if err := e.k8s.Delete(ctx, wf); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the account removed with the workflow", func() error {
		if _, err := e.workflow(ns, "keeps"); !apierrors.IsNotFound(err) {
			return fmt.Errorf("workflow still there (%w)", err)
		}
		if err := keysStore(ctx, keys); err == nil {
			return fmt.Errorf("the deleted workflow's keys still store")
		}
		return nil
	})
}
