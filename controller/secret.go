package controller

import (
	"bytes"
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/podconfig"
	"github.com/sluice-io/sluice/internal/transport"
)

// ensureSecret creates the workflow's sidecar configuration Secret, or brings its
// workflow and storage keys up to date; credentials are issued once.
func (r *WorkflowReconciler) ensureSecret(ctx context.Context, wf *v1alpha1.Workflow, names transport.Names) error {
	storage, err := r.storageFor(ctx, wf)
	if err != nil {
		return err
	}
	// The sidecars get the workflow as the API server holds it, without status noise.
	snap := &v1alpha1.Workflow{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "Workflow"},
		ObjectMeta: metav1.ObjectMeta{Name: wf.Name, Namespace: wf.Namespace, UID: wf.UID, Generation: wf.Generation},
		Spec:       wf.Spec,
	}
	cfg := &podconfig.Config{Workflow: snap, NATSURL: r.NATSURL, NATSInbox: names.Inbox, Storage: storage}

	var sec corev1.Secret
	key := types.NamespacedName{Namespace: wf.Namespace, Name: podconfig.SecretName(wf.Name)}
	err = r.Client.Get(ctx, key, &sec)
	switch {
	case apierrors.IsNotFound(err):
		if cfg.NATSCreds, err = r.Streams.Credentials(wf.Namespace+"/"+wf.Name, names); err != nil {
			return err
		}
		data, err := cfg.Data()
		if err != nil {
			return err
		}
		sec = corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace,
				Labels: map[string]string{v1alpha1.LabelManagedBy: v1alpha1.ManagedBy, v1alpha1.LabelWorkflow: wf.Name}},
			Type: corev1.SecretTypeOpaque,
			Data: data,
		}
		if err := controllerutil.SetControllerReference(wf, &sec, r.Client.Scheme()); err != nil {
			return err
		}
		if err := r.Client.Create(ctx, &sec); err != nil {
			return fmt.Errorf("creating Secret %s: %w", key, err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("reading Secret %s: %w", key, err)
	}
	if !metav1.IsControlledBy(&sec, wf) {
		return fmt.Errorf("the Secret %s exists and does not belong to Workflow %s", key, wf.Name)
	}
	cfg.NATSCreds = sec.Data[v1alpha1.SecretKeyNATSCreds]
	data, err := cfg.Data()
	if err != nil {
		return err
	}
	same := len(data) == len(sec.Data)
	for k, v := range data {
		same = same && bytes.Equal(sec.Data[k], v)
	}
	if same {
		return nil
	}
	sec.Data = data
	if err := r.Client.Update(ctx, &sec); err != nil {
		return fmt.Errorf("updating Secret %s: %w", key, err)
	}
	return nil
}

// storageFor resolves the workflow's spec.storage against the installation's storage:
// endpoint and keys default to the installation's; a secretRef's Secret must hold
// accessKey and secretKey. Nil when the workflow keeps no permanent files.
func (r *WorkflowReconciler) storageFor(ctx context.Context, wf *v1alpha1.Workflow) (*podconfig.Storage, error) {
	spec := wf.Spec.Storage
	if spec == nil {
		if len(wf.Spec.Permanent) == 0 || r.Storage == nil {
			return nil, nil
		}
		s := *r.Storage
		s.Prefix = s.Prefix + wf.Namespace + "/" + wf.Name + "/"
		return &s, nil
	}
	var s podconfig.Storage
	if r.Storage != nil {
		s = *r.Storage
	}
	s.Bucket, s.Prefix = spec.Bucket, spec.Prefix
	if spec.Endpoint != "" {
		ep := spec.Endpoint
		s.Secure = strings.HasPrefix(ep, "https://")
		ep = strings.TrimPrefix(strings.TrimPrefix(ep, "https://"), "http://")
		s.Endpoint = strings.TrimSuffix(ep, "/")
	}
	if ref := spec.SecretRef; ref != nil {
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
	}
	if s.Endpoint == "" {
		return nil, fmt.Errorf("spec.storage: no endpoint, and Sluice was deployed without object storage")
	}
	return &s, nil
}
