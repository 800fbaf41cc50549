package controller

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/objstore"
	"github.com/sluice-io/sluice/internal/podconfig"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

// ReasonStorageNotPermitted says that spec.storage names storage outside the workflow's own prefix
// of the installation's object storage (another bucket, prefix or endpoint) and no
// secretRef with keys for it; or the installation cannot give the workflow keys of its own.
const ReasonStorageNotPermitted = "StorageNotPermitted"

// StorageAccounts makes and removes the object-storage keys of workflows that keep their
// permanent files in the installation's storage: each workflow's keys reach only its own
// prefix, <bucket>/<installation prefix><namespace>/<workflow>/. objstore.MinIOAccounts
// (service accounts of a MinIO user of the namespace's own) implements it; tests use a
// fake.
type StorageAccounts interface {
	// Ensure makes the account, or makes sure it exists with these keys; idempotent.
	Ensure(ctx context.Context, a objstore.Account) error
	// Remove deletes the account with this access key; a missing one is not an error.
	Remove(ctx context.Context, accessKey string) error
}

// storageNotPermitted is a storage configuration the controller refuses (Ready=False,
// ReasonStorageNotPermitted): retrying does not help, changing the spec does.
type storageNotPermitted struct{ msg string }

func (e *storageNotPermitted) Error() string { return e.msg }

func notPermitted(format string, args ...any) error {
	return &storageNotPermitted{msg: fmt.Sprintf(format, args...)}
}

// isStorageNotPermitted reports whether err is a refused storage configuration.
func isStorageNotPermitted(err error) bool {
	var e *storageNotPermitted
	return errors.As(err, &e)
}

// storageAccessKey is the access key of a workflow's account: derived from the workflow's
// identity (never from anything its namespace can write), 20 characters as MinIO allows.
func storageAccessKey(ns, name string, uid types.UID) string {
	sum := sha256.Sum256([]byte(ns + "/" + name + "/" + string(uid)))
	return "sluice" + hex.EncodeToString(sum[:])[:14]
}

// newSecretKey returns 40 random hex characters (MinIO's longest secret key).
func newSecretKey() (string, error) {
	b := make([]byte, 20)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("making a secret key: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// workflowPrefix is the prefix of the installation's bucket that workflow wf owns.
func (r *WorkflowReconciler) workflowPrefix(wf *v1alpha1.Workflow) string {
	return r.Storage.Prefix + wf.Namespace + "/" + wf.Name + "/"
}

// normEndpoint is an endpoint as host:port, without scheme or trailing slash.
func normEndpoint(ep string) string {
	return strings.TrimSuffix(strings.TrimPrefix(strings.TrimPrefix(ep, "https://"), "http://"), "/")
}

// outsideScope says, for a spec.storage without secretRef, why it does not stay
// within the workflow's own prefix of the installation's storage ("" when it does).
func (r *WorkflowReconciler) outsideScope(wf *v1alpha1.Workflow, spec *v1alpha1.StorageSpec) string {
	if r.Storage == nil {
		return "Sluice was deployed without object storage"
	}
	if spec.Endpoint != "" && normEndpoint(spec.Endpoint) != r.Storage.Endpoint {
		return fmt.Sprintf("endpoint %s is not the installation's object storage", spec.Endpoint)
	}
	if spec.Bucket != r.Storage.Bucket {
		return fmt.Sprintf("bucket %q is not the installation's bucket %q", spec.Bucket, r.Storage.Bucket)
	}
	own := r.workflowPrefix(wf)
	p := strings.TrimSuffix(spec.Prefix, "/") + "/"
	for _, seg := range strings.Split(strings.TrimSuffix(p, "/"), "/") {
		if seg == "" || seg == "." || seg == ".." {
			return fmt.Sprintf("prefix %q has an empty, . or .. segment", spec.Prefix)
		}
	}
	if !strings.HasPrefix(p, own) {
		return fmt.Sprintf("prefix %q is outside the workflow's own prefix %q", spec.Prefix, own)
	}
	return ""
}

// installationStorage is the installation's storage as workflow wf may use it: bucket,
// the prefix, and the keys of the workflow's own account, which reach only the
// workflow's prefix. prev is the storage in the workflow's Secret, if any: its secret key
// is kept, so the keys do not change under running sidecars.
func (r *WorkflowReconciler) installationStorage(ctx context.Context, wf *v1alpha1.Workflow, prefix string, prev *podconfig.Storage) (*podconfig.Storage, error) {
	if r.StorageAccounts == nil {
		return nil, notPermitted("the installation's object storage gives workflows no keys of their own: " +
			"set spec.storage with a secretRef (a Secret with keys accessKey and secretKey)")
	}
	acc := objstore.Account{
		AccessKey:       storageAccessKey(wf.Namespace, wf.Name, wf.UID),
		Bucket:          r.Storage.Bucket,
		Prefix:          r.workflowPrefix(wf),
		Namespace:       wf.Namespace,
		NamespacePrefix: r.Storage.Prefix + wf.Namespace + "/",
		Description:     "sluice workflow " + wf.Namespace + "/" + wf.Name,
	}
	if len(acc.Description) > 256 {
		acc.Description = acc.Description[:256]
	}
	if prev != nil && prev.AccessKey == acc.AccessKey && len(prev.SecretKey) >= 8 && len(prev.SecretKey) <= 40 {
		acc.SecretKey = prev.SecretKey
	} else {
		var err error
		if acc.SecretKey, err = newSecretKey(); err != nil {
			return nil, err
		}
	}
	if err := r.ensureAccount(ctx, acc); err != nil {
		return nil, err
	}
	return &podconfig.Storage{Endpoint: r.Storage.Endpoint, Secure: r.Storage.Secure, Bucket: acc.Bucket,
		Prefix: prefix, AccessKey: acc.AccessKey, SecretKey: acc.SecretKey}, nil
}

// DefaultAccountCheckEvery is how often the controller checks, by default, that a
// running workflow's object storage account still exists and takes its keys
// (WorkflowReconciler.AccountCheckEvery): a workflow of the same namespace holds keys
// that may delete it (objstore: siblings under one parent), and an operator may remove
// it. A sidecar retries an upload refused for an unknown key for 5 minutes.
const DefaultAccountCheckEvery = time.Minute

// accountCheckEvery is AccountCheckEvery or its default.
func (r *WorkflowReconciler) accountCheckEvery() time.Duration {
	if r.AccountCheckEvery > 0 {
		return r.AccountCheckEvery
	}
	return DefaultAccountCheckEvery
}

// ensureAccount ensures acc unless it was ensured with these keys less than
// accountCheckEvery ago (and not since reported unknown, forgetAccountCheck): a
// restarted controller, and every controller every interval, checks each workflow's
// account again, and makes it again if it is gone.
func (r *WorkflowReconciler) ensureAccount(ctx context.Context, acc objstore.Account) error {
	r.accountsMu.Lock()
	prev, done := r.accounts[acc.AccessKey]
	r.accountsMu.Unlock()
	if done && prev.secret == acc.SecretKey && r.now().Sub(prev.at) < r.accountCheckEvery() {
		return nil
	}
	if err := r.StorageAccounts.Ensure(ctx, acc); err != nil {
		return fmt.Errorf("the workflow's object storage keys: %w", err)
	}
	r.accountsMu.Lock()
	if r.accounts == nil {
		r.accounts = map[string]checkedAccount{}
	}
	r.accounts[acc.AccessKey] = checkedAccount{secret: acc.SecretKey, at: r.now()}
	r.accountsMu.Unlock()
	return nil
}

// hasAccount reports whether workflow wf's account is one the controller keeps (its
// permanent files go to the installation's storage), so that its reconciles come at
// least every accountCheckEvery.
func (r *WorkflowReconciler) hasAccount(wf *v1alpha1.Workflow) bool {
	r.accountsMu.Lock()
	defer r.accountsMu.Unlock()
	_, ok := r.accounts[storageAccessKey(wf.Namespace, wf.Name, wf.UID)]
	return ok
}

// unknownKeyMarkers are what an upload refused for keys the object store does not know
// says: the S3 error code, and its message.
var unknownKeyMarkers = []string{"InvalidAccessKeyId", "The Access Key Id you provided does not exist"}

// forgetAccountCheck makes the next reconcile of wf check its account at once when one of
// its pods reported, after the account's last check, an upload refused for an unknown
// key; it reports whether it did.
func (r *WorkflowReconciler) forgetAccountCheck(wf *v1alpha1.Workflow, stats []wfmeta.PodStats) bool {
	ak := storageAccessKey(wf.Namespace, wf.Name, wf.UID)
	r.accountsMu.Lock()
	defer r.accountsMu.Unlock()
	prev, ok := r.accounts[ak]
	if !ok || prev.at.IsZero() {
		return false
	}
	for _, ps := range stats {
		for _, p := range ps.Problems {
			if p.Kind != wfmeta.ProblemUploadFailed || !p.At.After(prev.at) {
				continue
			}
			for _, m := range unknownKeyMarkers {
				if strings.Contains(p.Message, m) {
					prev.at = time.Time{}
					r.accounts[ak] = prev
					return true
				}
			}
		}
	}
	return false
}

// removeAccount deletes the object storage account of a deleted workflow.
func (r *WorkflowReconciler) removeAccount(ctx context.Context, wf *v1alpha1.Workflow) error {
	if r.StorageAccounts == nil {
		return nil
	}
	ak := storageAccessKey(wf.Namespace, wf.Name, wf.UID)
	if err := r.StorageAccounts.Remove(ctx, ak); err != nil {
		return fmt.Errorf("removing the workflow's object storage keys: %w", err)
	}
	r.accountsMu.Lock()
	delete(r.accounts, ak)
	r.accountsMu.Unlock()
	return nil
}

// accountCache is the part of WorkflowReconciler's state that ensureAccount keeps.
type accountCache struct {
	accountsMu sync.Mutex
	accounts   map[string]checkedAccount // by access key
}

// checkedAccount is an account ensured with secret key secret at time at (zero: to
// check again at once).
type checkedAccount struct {
	secret string
	at     time.Time
}
