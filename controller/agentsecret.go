package controller

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/natsauth"
	"github.com/sluice-io/sluice/internal/podconfig"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

// agentSecretKey is the agent Secret of wf (v1alpha1.AgentSecretPrefix).
func (r *WorkflowReconciler) agentSecretKey(wf *v1alpha1.Workflow) types.NamespacedName {
	return types.NamespacedName{Namespace: r.AgentNamespace, Name: podconfig.AgentSecretName(string(wf.UID))}
}

// ensureAgentSecret creates the workflow's agent Secret in the agent namespace, or
// brings it up to date: the NATS connection the CSI node plugins give the workflow's
// store server on each node, read from the API rather than from anything a pod hands
// over (issue 42). Its credentials are the workflow's NATS user (revoked with the
// workflow), issued when the Secret is made and again once halfway to their expiry.
// renewAt is when they are next due (zero: never). Nothing is done without an agent
// namespace.
func (r *WorkflowReconciler) ensureAgentSecret(ctx context.Context, wf *v1alpha1.Workflow, names wfmeta.Names) (renewAt time.Time, err error) {
	if r.AgentNamespace == "" {
		return time.Time{}, nil
	}
	key := r.agentSecretKey(wf)
	var sec corev1.Secret
	err = r.Client.Get(ctx, key, &sec)
	if err != nil && !apierrors.IsNotFound(err) {
		return time.Time{}, fmt.Errorf("reading the agent Secret %s: %w", key, err)
	}
	exists := err == nil
	if exists && (sec.Labels[v1alpha1.LabelAgentNamespace] != wf.Namespace || sec.Labels[v1alpha1.LabelWorkflow] != wf.Name) {
		return time.Time{}, fmt.Errorf("the agent Secret %s exists and is not workflow %s/%s's", key, wf.Namespace, wf.Name)
	}
	conn := &podconfig.Connection{URL: r.NATSURL, Inbox: names.Inbox, CA: r.CA}
	if exists {
		conn.Creds = sec.Data[v1alpha1.SecretKeyNATSCreds]
		renewAt, err = natsauth.RenewAt(conn.Creds)
	}
	if !exists || err != nil || (!renewAt.IsZero() && !r.now().Before(renewAt)) {
		if conn.Creds, err = r.Streams.Credentials(ctx, wf.Namespace+"/"+wf.Name+" node agents", names); err != nil {
			return time.Time{}, fmt.Errorf("%w: %w", errNATSCredentials, err)
		}
		if renewAt, err = natsauth.RenewAt(conn.Creds); err != nil {
			return time.Time{}, fmt.Errorf("%w: %w", errNATSCredentials, err)
		}
	}
	data := conn.Data()
	if !exists {
		sec = corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace, Labels: map[string]string{
				v1alpha1.LabelManagedBy: v1alpha1.ManagedBy, v1alpha1.LabelAgentNamespace: wf.Namespace, v1alpha1.LabelWorkflow: wf.Name}},
			Type: corev1.SecretTypeOpaque,
			Data: data,
		}
		if err := r.Client.Create(ctx, &sec); err != nil {
			return time.Time{}, fmt.Errorf("creating the agent Secret %s: %w", key, err)
		}
		return renewAt, nil
	}
	return renewAt, r.updateSecretData(ctx, &sec, data)
}

// removeAgentSecret deletes the workflow's agent Secret (the workflow is deleted, or its
// temporary data removed): no store server of it starts after that. A Secret that is
// gone is a success.
func (r *WorkflowReconciler) removeAgentSecret(ctx context.Context, wf *v1alpha1.Workflow) error {
	if r.AgentNamespace == "" {
		return nil
	}
	key := r.agentSecretKey(wf)
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace}}
	if err := r.Client.Delete(ctx, sec); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("removing the agent Secret %s: %w", key, err)
	}
	return nil
}
