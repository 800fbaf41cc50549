package controller

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/objstore"
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
		r.StorageAccounts = newFakeAccounts()
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

// fakeAccounts stands for MinIO's admin API: the accounts made and not removed.
type fakeAccounts struct {
	mu       sync.Mutex
	accounts map[string]objstore.Account
}

func newFakeAccounts() *fakeAccounts { return &fakeAccounts{accounts: map[string]objstore.Account{}} }

func (f *fakeAccounts) Ensure(_ context.Context, a objstore.Account) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.accounts[a.AccessKey] = a
	return nil
}

func (f *fakeAccounts) Remove(_ context.Context, accessKey string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.accounts, accessKey)
	return nil
}

func (f *fakeAccounts) get(accessKey string) (objstore.Account, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	a, ok := f.accounts[accessKey]
	return a, ok
}

func (f *fakeAccounts) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.accounts)
}

// installation is the installation's storage of the storage tests: its keys must never
// reach a workflow.
var installation = podconfig.Storage{Endpoint: "minio.example:9000", Bucket: "sluice", AccessKey: "installation-key", SecretKey: "installation-secret"}

func storageOf(t *testing.T, sec *corev1.Secret) podconfig.Storage {
	t.Helper()
	var st podconfig.Storage
	if err := json.Unmarshal(sec.Data[v1alpha1.SecretKeyStorage], &st); err != nil {
		t.Fatalf("storage in Secret %s: %v", sec.Name, err)
	}
	return st
}

// A workflow storing permanent files in the installation's storage gets keys of its own
// (an account made through the admin API) whose policy is scoped to
// <bucket>/<namespace>/<workflow>/, never the installation's keys; the keys stay the same
// across reconciles, and deleting the workflow removes the account.
func TestWorkflowGetsStorageKeysOfItsOwnPrefix(t *testing.T) {
	accounts := newFakeAccounts()
	e := startEnv(t, func(r *WorkflowReconciler) {
		st := installation
		r.Storage = &st
		r.StorageAccounts = accounts
	})
	ctx := context.Background()
	ns := e.namespace(t, "tenant-a")
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
	key := types.NamespacedName{Namespace: ns, Name: podconfig.SecretName("keeps")}
	var sec corev1.Secret
	eventually(t, 20*time.Second, "the configuration Secret", func() error { return e.k8s.Get(ctx, key, &sec) })
	for k, v := range sec.Data {
		if bytes.Contains(v, []byte(installation.SecretKey)) || bytes.Contains(v, []byte(installation.AccessKey)) {
			t.Errorf("the workflow's Secret holds the installation's keys (in %s)", k)
		}
	}
	st := storageOf(t, &sec)
	acc, ok := accounts.get(st.AccessKey)
	if !ok {
		t.Fatalf("the Secret's access key %q is no account made for the workflow (accounts: %d)", st.AccessKey, accounts.count())
	}
	if acc.Bucket != "sluice" || acc.Prefix != ns+"/keeps/" || acc.SecretKey != st.SecretKey {
		t.Errorf("account %+v: want bucket sluice, prefix %s/keeps/ and the Secret's secret key", acc, ns)
	}
	if st.Endpoint != installation.Endpoint || st.Bucket != "sluice" || st.Prefix != ns+"/keeps/" {
		t.Errorf("storage in the Secret %+v", st)
	}

	// Another reconcile (an annotation changes) keeps the keys the sidecars hold.
	patch := []byte(`{"metadata":{"annotations":{"touch":"1"}}}`)
	if err := e.k8s.Patch(ctx, wf, client.RawPatch(types.MergePatchType, patch)); err != nil {
		t.Fatal(err)
	}
	second := workflowFrom(t, ns, `
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: other}
spec:
  permanent: [out.txt]
  steps:
  - name: a
    outputs: [{path: out.txt}]
`)
	if err := e.k8s.Create(ctx, second); err != nil {
		t.Fatal(err)
	}
	var sec2 corev1.Secret
	eventually(t, 20*time.Second, "the second workflow's Secret", func() error {
		return e.k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: podconfig.SecretName("other")}, &sec2)
	})
	if st2 := storageOf(t, &sec2); st2.AccessKey == st.AccessKey || st2.Prefix != ns+"/other/" {
		t.Errorf("second workflow's storage %+v shares keys or prefix with the first's", st2)
	}
	if err := e.k8s.Get(ctx, key, &sec); err != nil {
		t.Fatal(err)
	}
	if again := storageOf(t, &sec); again != st {
		t.Errorf("keys changed across reconciles: %+v, then %+v", st, again)
	}

	if err := e.k8s.Delete(ctx, wf); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the account removed with the workflow", func() error {
		if _, ok := accounts.get(st.AccessKey); ok {
			return fmt.Errorf("account %s still there", st.AccessKey)
		}
		if _, err := e.workflow(ns, "keeps"); !apierrors.IsNotFound(err) {
			return fmt.Errorf("workflow still there (%w)", err)
		}
		return nil
	})
	if accounts.count() != 1 {
		t.Errorf("%d accounts left, want the second workflow's", accounts.count())
	}
}

// spec.storage naming another bucket, another workflow's prefix or another endpoint
// without a secretRef is refused: Ready=False with reason StorageNotPermitted, no
// configuration Secret (so no sidecar holds keys for it), no account. A prefix within
// the workflow's own is accepted with the workflow's own keys.
func TestStorageOutsideTheWorkflowsPrefixNeedsASecretRef(t *testing.T) {
	accounts := newFakeAccounts()
	e := startEnv(t, func(r *WorkflowReconciler) {
		st := installation
		r.Storage = &st
		r.StorageAccounts = accounts
	})
	ctx := context.Background()
	ns := e.namespace(t, "tenant-b")
	wf := func(name, storage string) *v1alpha1.Workflow {
		return workflowFrom(t, ns, fmt.Sprintf(`
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: %s}
spec:
  storage: %s
  permanent: [out.txt]
  steps:
  - name: a
    outputs: [{path: out.txt}]
`, name, storage))
	}
	refused := map[string]string{
		"other-bucket":   `{bucket: other}`,
		"other-prefix":   `{bucket: sluice, prefix: tenant-a/keeps/}`,
		"sibling-prefix": `{bucket: sluice, prefix: tenant-b/sibling-prefix-x/}`,
		"dot-dot":        `{bucket: sluice, prefix: tenant-b/dot-dot/../../tenant-a/keeps}`,
		"whole-bucket":   `{bucket: sluice}`,
		"other-endpoint": `{bucket: sluice, prefix: tenant-b/other-endpoint/, endpoint: "https://collector.example:443"}`,
	}
	for name, storage := range refused {
		if err := e.k8s.Create(ctx, wf(name, storage)); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.k8s.Create(ctx, wf("own-prefix", `{bucket: sluice, prefix: tenant-b/own-prefix/results}`)); err != nil {
		t.Fatal(err)
	}
	for name := range refused {
		e.expectRefused(t, ns, name, ReasonStorageNotPermitted, "secretRef")
	}
	var sec corev1.Secret
	eventually(t, 20*time.Second, "own-prefix's Secret", func() error {
		return e.k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: podconfig.SecretName("own-prefix")}, &sec)
	})
	st := storageOf(t, &sec)
	acc, ok := accounts.get(st.AccessKey)
	if !ok || acc.Prefix != ns+"/own-prefix/" || st.Prefix != ns+"/own-prefix/results/" || st.SecretKey == installation.SecretKey {
		t.Errorf("own-prefix: storage %+v, account %+v (made: %v)", st, acc, ok)
	}
	if n := accounts.count(); n != 1 {
		t.Errorf("%d accounts made, want 1 (own-prefix's)", n)
	}
}

// storageFor (without an API server): the installation's storage reaches a workflow only
// through an account scoped to <bucket>/<namespace>/<workflow>/, and spec.storage that
// leaves that prefix without a secretRef is refused as StorageNotPermitted.
func TestStorageForScopesKeysToTheWorkflow(t *testing.T) {
	accounts := newFakeAccounts()
	st := installation
	r := &WorkflowReconciler{Storage: &st, StorageAccounts: accounts}
	wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant-a", Name: "wf", UID: "uid-1"},
		Spec: v1alpha1.WorkflowSpec{Permanent: []string{"out.txt"}}}
	ctx := context.Background()
	got, err := r.storageFor(ctx, wf, nil)
	if err != nil {
		t.Fatal(err)
	}
	acc, ok := accounts.get(got.AccessKey)
	if !ok || got.AccessKey == installation.AccessKey || got.SecretKey == installation.SecretKey {
		t.Fatalf("storage %+v: not an account of the workflow's own", got)
	}
	if acc.Bucket != "sluice" || acc.Prefix != "tenant-a/wf/" || got.Prefix != "tenant-a/wf/" {
		t.Errorf("account %+v, storage %+v: want scope sluice/tenant-a/wf/", acc, got)
	}
	if again, err := r.storageFor(ctx, wf, got); err != nil || *again != *got {
		t.Errorf("second resolution %+v (%v), want the same keys %+v", again, err, got)
	}
	for _, spec := range []v1alpha1.StorageSpec{
		{Bucket: "other"},
		{Bucket: "sluice"},
		{Bucket: "sluice", Prefix: "tenant-b/wf/"},
		{Bucket: "sluice", Prefix: "tenant-a/wf2/"},
		{Bucket: "sluice", Prefix: "tenant-a/wf/../../tenant-b/wf"},
		{Bucket: "sluice", Prefix: "tenant-a/wf/", Endpoint: "https://collector.example"},
	} {
		w := wf.DeepCopy()
		w.Spec.Storage = &spec
		if s, err := r.storageFor(ctx, w, nil); !isStorageNotPermitted(err) || !strings.Contains(fmt.Sprint(err), "secretRef") {
			t.Errorf("spec.storage %+v: %+v, %v; want StorageNotPermitted naming secretRef", spec, s, err)
		}
	}
	w := wf.DeepCopy()
	w.Spec.Storage = &v1alpha1.StorageSpec{Bucket: "sluice", Prefix: "tenant-a/wf/run-1", Endpoint: "http://minio.example:9000/"}
	if s, err := r.storageFor(ctx, w, nil); err != nil || s.Prefix != "tenant-a/wf/run-1/" || s.AccessKey == installation.AccessKey {
		t.Errorf("a prefix within the workflow's own: %+v, %v", s, err)
	}
	r.StorageAccounts = nil
	if s, err := r.storageFor(ctx, wf, nil); !isStorageNotPermitted(err) {
		t.Errorf("no way to make accounts: %+v, %v; want StorageNotPermitted", s, err)
	}
}

// expectRefused waits until Workflow ns/name is Ready=False for reason, with a message
// that mentions mention, and checks that it got no configuration Secret.
func (e *env) expectRefused(t *testing.T, ns, name, reason, mention string) {
	t.Helper()
	eventually(t, 20*time.Second, name+": Ready=False "+reason, func() error {
		got, err := e.workflow(ns, name)
		if err != nil {
			return err
		}
		c := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionReady)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != reason || !strings.Contains(c.Message, mention) {
			return fmt.Errorf("Ready condition %+v", c)
		}
		return nil
	})
	err := e.k8s.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: podconfig.SecretName(name)}, &corev1.Secret{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("%s: a configuration Secret exists (%v)", name, err)
	}
}
