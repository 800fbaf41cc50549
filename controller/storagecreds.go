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

	"k8s.io/apimachinery/pkg/types"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/objstore"
	"github.com/sluice-io/sluice/internal/podconfig"
)

// ReasonStorageNotPermitted says that spec.storage names storage outside the workflow's own prefix
// of the installation's object storage (another bucket, prefix or endpoint) and no
// secretRef with keys for it; or the installation cannot give the workflow keys of its own.
const ReasonStorageNotPermitted = "StorageNotPermitted"

// StorageAccounts makes and removes the object-storage keys of workflows that keep their
// permanent files in the installation's storage: each workflow's keys reach only its own
// prefix, <bucket>/<installation prefix><namespace>/<workflow>/. objstore.MinIOAccounts
// (service accounts of the installation's MinIO user) implements it; tests use a fake.
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
		AccessKey:   storageAccessKey(wf.Namespace, wf.Name, wf.UID),
		Bucket:      r.Storage.Bucket,
		Prefix:      r.workflowPrefix(wf),
		Description: "sluice workflow " + wf.Namespace + "/" + wf.Name,
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

// ensureAccount ensures acc once per controller process and keys (a restarted controller
// checks each workflow's account again).
func (r *WorkflowReconciler) ensureAccount(ctx context.Context, acc objstore.Account) error {
	r.accountsMu.Lock()
	done := r.accounts[acc.AccessKey] == acc.SecretKey
	r.accountsMu.Unlock()
	if done {
		return nil
	}
	if err := r.StorageAccounts.Ensure(ctx, acc); err != nil {
		return fmt.Errorf("the workflow's object storage keys: %w", err)
	}
	r.accountsMu.Lock()
	if r.accounts == nil {
		r.accounts = map[string]string{}
	}
	r.accounts[acc.AccessKey] = acc.SecretKey
	r.accountsMu.Unlock()
	return nil
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
	accounts   map[string]string // access key -> secret key ensured
}
