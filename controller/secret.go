package controller

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/natsauth"
	"github.com/sluice-io/sluice/internal/podconfig"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

// errNATSCredentials marks an ensureSecret error in issuing the workflow's NATS
// credentials (the workflow is then not Ready for a NATSError, not for its storage).
var errNATSCredentials = errors.New("issuing the workflow's NATS credentials")

// ensureSecret creates the workflow's sidecar configuration Secret, or brings its
// workflow and storage keys up to date. Its NATS credentials are issued when it is made
// and again once they are halfway to their expiry (natsauth.RenewAt): the sidecars read
// the file again whenever they (re)connect, and the kubelet updates the mounted Secret.
// renewAt is when the credentials it leaves are next due (zero: never, they do not
// expire).
func (r *WorkflowReconciler) ensureSecret(ctx context.Context, wf *v1alpha1.Workflow, names wfmeta.Names) (renewAt time.Time, err error) {
	// The sidecars get the workflow as the API server holds it, without status noise.
	snap := &v1alpha1.Workflow{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "Workflow"},
		ObjectMeta: metav1.ObjectMeta{Name: wf.Name, Namespace: wf.Namespace, UID: wf.UID, Generation: wf.Generation},
		Spec:       wf.Spec,
	}
	var sec corev1.Secret
	key := types.NamespacedName{Namespace: wf.Namespace, Name: podconfig.SecretName(wf.Name)}
	err = r.Client.Get(ctx, key, &sec)
	if err != nil && !apierrors.IsNotFound(err) {
		return time.Time{}, fmt.Errorf("reading Secret %s: %w", key, err)
	}
	var prev *podconfig.Storage
	if b := sec.Data[v1alpha1.SecretKeyStorage]; err == nil && len(b) > 0 && metav1.IsControlledBy(&sec, wf) {
		prev = &podconfig.Storage{}
		if json.Unmarshal(b, prev) != nil {
			prev = nil
		}
	}
	storage, serr := r.storageFor(ctx, wf, prev)
	if serr != nil {
		return time.Time{}, serr
	}
	cfg := &podconfig.Config{Workflow: snap, NATSURL: r.NATSURL, NATSInbox: names.Inbox, Storage: storage, CA: r.CA}
	issue := func() error {
		var err error
		if cfg.NATSCreds, err = r.Streams.Credentials(ctx, wf.Namespace+"/"+wf.Name, names); err != nil {
			return fmt.Errorf("%w: %w", errNATSCredentials, err)
		}
		if renewAt, err = natsauth.RenewAt(cfg.NATSCreds); err != nil {
			return fmt.Errorf("%w: %w", errNATSCredentials, err)
		}
		return nil
	}

	if apierrors.IsNotFound(err) {
		if err := issue(); err != nil {
			return time.Time{}, err
		}
		data, err := cfg.Data()
		if err != nil {
			return time.Time{}, err
		}
		sec = corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace,
				Labels: map[string]string{v1alpha1.LabelManagedBy: v1alpha1.ManagedBy, v1alpha1.LabelWorkflow: wf.Name}},
			Type: corev1.SecretTypeOpaque,
			Data: data,
		}
		if err := controllerutil.SetControllerReference(wf, &sec, r.Client.Scheme()); err != nil {
			return time.Time{}, err
		}
		if err := r.Client.Create(ctx, &sec); err != nil {
			return time.Time{}, fmt.Errorf("creating Secret %s: %w", key, err)
		}
		return renewAt, nil
	}
	if !metav1.IsControlledBy(&sec, wf) {
		return time.Time{}, fmt.Errorf("the Secret %s exists and does not belong to Workflow %s", key, wf.Name)
	}
	cfg.NATSCreds = sec.Data[v1alpha1.SecretKeyNATSCreds]
	if renewAt, err = natsauth.RenewAt(cfg.NATSCreds); err != nil || (!renewAt.IsZero() && !r.now().Before(renewAt)) {
		// Due, or unreadable (someone edited the Secret): issue them again.
		if err := issue(); err != nil {
			return time.Time{}, err
		}
	}
	data, err := cfg.Data()
	if err != nil {
		return time.Time{}, err
	}
	return renewAt, r.updateSecretData(ctx, &sec, data)
}

// updateSecretData makes sec's data data, with an update only when it differs. The error
// names the Secret.
func (r *WorkflowReconciler) updateSecretData(ctx context.Context, sec *corev1.Secret, data map[string][]byte) error {
	same := len(data) == len(sec.Data)
	for k, v := range data {
		same = same && bytes.Equal(sec.Data[k], v)
	}
	if same {
		return nil
	}
	sec.Data = data
	if err := r.Client.Update(ctx, sec); err != nil {
		return fmt.Errorf("updating Secret %s/%s: %w", sec.Namespace, sec.Name, err)
	}
	return nil
}

// storageFor resolves the workflow's spec.storage against the installation's storage.
// Without spec.storage, permanent files go to the installation's bucket under
// <prefix><namespace>/<workflow>/, with keys of the workflow's own that reach only that
// prefix (never the installation's keys). A spec.storage with a secretRef uses the keys of
// that Secret (accessKey, secretKey) at its endpoint (default: the installation's); one
// without may only name a prefix within the workflow's own, in the installation's bucket
// and endpoint, and gets the workflow's own keys. Nil when the workflow keeps no
// permanent files. prev is the storage in the workflow's Secret, if any.
func (r *WorkflowReconciler) storageFor(ctx context.Context, wf *v1alpha1.Workflow, prev *podconfig.Storage) (*podconfig.Storage, error) {
	spec := wf.Spec.Storage
	if spec == nil {
		if len(wf.Spec.Permanent) == 0 || r.Storage == nil {
			return nil, nil
		}
		return r.installationStorage(ctx, wf, r.workflowPrefix(wf), prev)
	}
	ref := spec.SecretRef
	if ref == nil {
		if why := r.outsideScope(wf, spec); why != "" {
			own := "none"
			if r.Storage != nil {
				own = fmt.Sprintf("bucket %q, prefix %q", r.Storage.Bucket, r.workflowPrefix(wf))
			}
			return nil, notPermitted("spec.storage: %s, and spec.storage.secretRef names no keys for it "+
				"(without a secretRef a workflow may use only its own prefix of the installation's storage: %s)", why, own)
		}
		return r.installationStorage(ctx, wf, strings.TrimSuffix(spec.Prefix, "/")+"/", prev)
	}
	s := podconfig.Storage{Bucket: spec.Bucket, Prefix: spec.Prefix}
	if r.Storage != nil {
		s.Endpoint, s.Secure = r.Storage.Endpoint, r.Storage.Secure
	}
	if spec.Endpoint != "" {
		s.Secure = strings.HasPrefix(spec.Endpoint, "https://")
		s.Endpoint = normEndpoint(spec.Endpoint)
	}
	var sec corev1.Secret
	var rd client.Reader = r.Client
	if r.APIReader != nil {
		rd = r.APIReader
	}
	if err := rd.Get(ctx, types.NamespacedName{Namespace: wf.Namespace, Name: ref.Name}, &sec); err != nil {
		return nil, fmt.Errorf("spec.storage.secretRef: Secret %s/%s: %w", wf.Namespace, ref.Name, err)
	}
	ak, sk := sec.Data["accessKey"], sec.Data["secretKey"]
	if len(ak) == 0 || len(sk) == 0 {
		return nil, fmt.Errorf("spec.storage.secretRef: Secret %s/%s must hold keys accessKey and secretKey", wf.Namespace, ref.Name)
	}
	s.AccessKey, s.SecretKey = string(ak), string(sk)
	if s.Endpoint == "" {
		return nil, fmt.Errorf("spec.storage: no endpoint, and Sluice was deployed without object storage")
	}
	return &s, nil
}

// secretCheckEvery bounds how long a running workflow waits for a reconcile, so that its
// Secret, which the controller does not watch, is put back within it when deleted.
const secretCheckEvery = time.Minute

// ManagerClientOptions are the client options of the controller's manager: Secrets are
// read from the API server and never cached, so the controller needs no list or watch
// of Secrets, which RBAC can grant only for every Secret of the cluster (no label or
// name prefix narrows them); with get, create and update alone a stolen controller token
// cannot enumerate the cluster's Secrets (issue 43, finding 5). The reconciler reads a
// workflow's Secret on each reconcile, at least every secretCheckEvery while it runs; a
// deleted one is made again then.
func ManagerClientOptions() client.Options {
	return client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.Secret{}}}}
}
