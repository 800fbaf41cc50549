package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/minio/madmin-go/v3"
	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sluice-io/sluice/internal/objstore"
	"github.com/sluice-io/sluice/internal/podconfig"
	"github.com/sluice-io/sluice/internal/servers"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

// realStorage runs the pinned MinIO with the installation's user made as the bundled
// MinIO's setup container makes it, and returns the installation's storage, its
// accounts (objstore.MinIOAccounts, the controller's) and MinIO's root admin client.
func realStorage(t *testing.T) (*podconfig.Storage, *objstore.MinIOAccounts, *madmin.AdminClient) {
	t.Helper()
	testenv.Integration(t, "MinIO (hack/servers.sh)")
	m, err := servers.StartMinIO(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Stop)
	ctx := context.Background()
	if _, err := m.Bucket(ctx, "sluice"); err != nil {
		t.Fatal(err)
	}
	root := objstore.Credentials{AccessKey: m.AccessKey, SecretKey: m.SecretKey}
	if err := objstore.SetupMinIOUser(ctx, m.Endpoint, false, root, "sluice-installation", "installation-secret-1", "sluice"); err != nil {
		t.Fatal(err)
	}
	st := &podconfig.Storage{Endpoint: m.Endpoint, Bucket: "sluice", AccessKey: "sluice-installation", SecretKey: "installation-secret-1"}
	accounts, err := objstore.NewMinIOAccounts(m.Endpoint, false, objstore.Credentials{AccessKey: st.AccessKey, SecretKey: st.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	adm, err := madmin.NewWithOptions(m.Endpoint, &madmin.Options{Creds: credentials.NewStaticV4(m.AccessKey, m.SecretKey, "")})
	if err != nil {
		t.Fatal(err)
	}
	return st, accounts, adm
}

// keysStore reports whether the workflow keys of st store an object under their prefix.
func keysStore(ctx context.Context, st podconfig.Storage) error {
	c, err := minio.New(st.Endpoint, &minio.Options{Creds: credentials.NewStaticV4(st.AccessKey, st.SecretKey, "")})
	if err != nil {
		return err
	}
	_, err = c.PutObject(ctx, st.Bucket, st.Prefix+"probe.txt", strings.NewReader("ok\n"), 3, minio.PutObjectOptions{})
	return err
}

// A workflow's object storage account that is deleted (by a workflow of the same
// namespace, whose keys may, or by an operator) is made again by the controller, with the
// keys the workflow's sidecars hold: at once when a pod reports an upload refused for an
// unknown key, and within AccountCheckEvery otherwise (issue 43: the controller took an
// account for ensured for ever, and the workflow's permanent outputs failed until it
// restarted). The account is a service account of its namespace's own MinIO user.
func TestADeletedStorageAccountIsMadeAgain(t *testing.T) {
	for _, tc := range []struct {
		name   string
		every  time.Duration
		report bool // a pod reports the unknown key
	}{
		{"reported by a pod", time.Hour, true},
		{"periodic check", 2 * time.Second, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, accounts, root := realStorage(t)
			e := startEnv(t, func(r *WorkflowReconciler) {
				r.Storage, r.StorageAccounts, r.AccountCheckEvery = st, accounts, tc.every
			})
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			ns := e.namespace(t, "recheck-"+map[bool]string{true: "reported", false: "periodic"}[tc.report])
			wf := workflowFrom(t, ns, `
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: secret-project}
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
			key := types.NamespacedName{Namespace: ns, Name: podconfig.SecretName("secret-project")}
			eventually(t, 30*time.Second, "the configuration Secret", func() error { return e.k8s.Get(ctx, key, &sec) })
			keys := storageOf(t, &sec)
			if err := keysStore(ctx, keys); err != nil {
				t.Fatalf("the workflow's keys: %v", err)
			}
			info, err := root.InfoServiceAccount(ctx, keys.AccessKey)
			if err != nil || info.ParentUser != objstore.NamespaceUser(ns) {
				t.Errorf("the workflow's account has parent %q (%v), want its namespace's user %s", info.ParentUser, err, objstore.NamespaceUser(ns))
			}

			if err := root.DeleteServiceAccount(ctx, keys.AccessKey); err != nil {
				t.Fatal(err)
			}
			if err := keysStore(ctx, keys); err == nil {
				t.Fatal("the keys still store after their account was deleted")
			}
			if tc.report {
				// What a sidecar whose upload met the unknown key records.
				names := wfmeta.NamesForWorkflow(ns, "secret-project", string(wf.UID))
				kv, err := e.js.KeyValue(ctx, names.Bucket)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := json.Marshal(wfmeta.PodStats{Pod: "secret-project-a-0", Problems: []wfmeta.PodProblem{{Kind: wfmeta.ProblemUploadFailed,
					Message: "retrying an upload: The Access Key Id you provided does not exist in our records.", At: time.Now().UTC().Add(time.Second)}}})
				if _, err := kv.Put(ctx, wfmeta.StatsKey("pod-uid-1"), b); err != nil {
					t.Fatal(err)
				}
			}
			eventually(t, 30*time.Second, "the account made again", func() error {
				if err := keysStore(ctx, keys); err != nil {
					return fmt.Errorf("the workflow's keys: %w", err)
				}
				return nil
			})
			if err := e.k8s.Get(ctx, key, &sec); err != nil {
				t.Fatal(err)
			}
			if again := storageOf(t, &sec); again != keys {
				t.Errorf("the keys changed: %+v, then %+v", keys, again)
			}
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				t.Fatal("timed out")
			}
		})
	}
}
