package controller

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/podconfig"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

// csiConfig is the package envtest's configuration impersonating the CSI node plugin's
// service account of deploy/base.
func csiConfig(te *envtest.Environment) *rest.Config {
	cfg := rest.CopyConfig(te.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:sluice-system:sluice-csi",
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:sluice-system", "system:authenticated"}}
	return cfg
}

// The store servers' NATS connection comes from the API, never from a pod (issue 42):
// with deploy/base's RBAC and admission policy, the controller keeps each workflow's
// agent Secret in the agent namespace, the CSI node plugin's service account reads it
// there and no other Secret (not the workflow's own, which its pods mount), and the
// Secret goes with the workflow.
func TestAgentSecretIsTheStoreServersConnection(t *testing.T) {
	te := clusterOf(t)
	ctx := context.Background()
	const ns = "agent-secret"
	asController, err := client.New(controllerConfig(te), client.Options{Scheme: te.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	// RBAC first, so that it outlives the policy's removal, which the cleanup checks
	// with a request of the controller's.
	agents := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.DefaultAgentNamespace}}
	if err := startClient(t, te).Create(ctx, agents); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	installFromDeployBase(t, startClient(t, te), "ClusterRole//sluice-controller", "ClusterRoleBinding//sluice-controller",
		"Role/sluice-agents/sluice-controller-agents", "RoleBinding/sluice-agents/sluice-controller-agents",
		"Role/sluice-agents/sluice-csi-agents", "RoleBinding/sluice-agents/sluice-csi-agents")
	withPolicy(t, "sluice-controller", ns, func(ctx context.Context) error {
		// Refused while the policy is in force: a Secret of the controller's that is not
		// Sluice's, outside its namespaces.
		stray := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "stray", Namespace: ns}}
		return asController.Create(ctx, stray, client.DryRunAll)
	})

	e := startEnvAs(t, te, controllerConfig(te), func(r *WorkflowReconciler) {
		r.AgentNamespace, r.AgentUsers = v1alpha1.DefaultAgentNamespace, AgentUsers{First: 2100000100, Count: 10}
	})
	t.Cleanup(func() { e.deleteWorkflows(t, ns) })
	wf := oneStepWorkflow(t, ns, "pipe")
	if err := e.k8s.Create(ctx, wf); err != nil {
		t.Fatal(err)
	}
	names := wfmeta.NamesForWorkflow(ns, wf.Name, string(wf.UID))
	key := types.NamespacedName{Namespace: v1alpha1.DefaultAgentNamespace, Name: podconfig.AgentSecretName(string(wf.UID))}

	asCSI, err := client.New(csiConfig(te), client.Options{Scheme: te.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	var sec corev1.Secret
	eventually(t, 30*time.Second, "the workflow's agent Secret, read as the CSI plugin", func() error { return asCSI.Get(ctx, key, &sec) })
	if sec.Labels[v1alpha1.LabelAgentNamespace] != ns || sec.Labels[v1alpha1.LabelWorkflow] != "pipe" || sec.Labels[v1alpha1.LabelManagedBy] != v1alpha1.ManagedBy {
		t.Errorf("the agent Secret's labels %v", sec.Labels)
	}
	conn, err := podconfig.ParseConnection(sec.Data)
	if err != nil {
		t.Fatal(err)
	}
	if conn.URL != "nats://sluice-nats:4222" || conn.Inbox != names.Inbox || !strings.Contains(string(conn.Creds), "BEGIN NATS USER JWT") {
		t.Errorf("the agent Secret's connection: URL %q, inbox %q (want %q), credentials %d bytes", conn.URL, conn.Inbox, names.Inbox, len(conn.Creds))
	}
	// The plugin reads no other Secret: not the workflow's own, and it lists none.
	err = asCSI.Get(ctx, types.NamespacedName{Namespace: ns, Name: podconfig.SecretName("pipe")}, &corev1.Secret{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("the CSI plugin's token reads the workflow's own Secret (err %v); want Forbidden", err)
	}
	if err := asCSI.List(ctx, &corev1.SecretList{}, client.InNamespace(v1alpha1.DefaultAgentNamespace)); !apierrors.IsForbidden(err) {
		t.Errorf("the CSI plugin's token lists the agent Secrets (err %v); want Forbidden", err)
	}

	// The controller claimed the workflow's user ID there too, with the same RBAC.
	got, err := e.workflow(ns, "pipe")
	if err != nil {
		t.Fatal(err)
	}
	if got.Status.AgentUser == nil {
		t.Fatal("no status.agentUser")
	}
	claim := types.NamespacedName{Namespace: v1alpha1.DefaultAgentNamespace, Name: AgentUserClaim(*got.Status.AgentUser)}
	if err := e.k8s.Get(ctx, claim, &corev1.ConfigMap{}); err != nil {
		t.Errorf("the claim of user ID %d: %v", *got.Status.AgentUser, err)
	}

	if err := e.k8s.Delete(ctx, wf); err != nil {
		t.Fatal(err)
	}
	for _, gone := range []client.Object{&corev1.Secret{}, &corev1.ConfigMap{}} {
		k := key
		if _, ok := gone.(*corev1.ConfigMap); ok {
			k = claim
		}
		eventually(t, 30*time.Second, "the agent Secret and the user ID's claim gone with the workflow", func() error {
			err := e.k8s.Get(ctx, k, gone)
			if err == nil {
				return fmt.Errorf("%s is still there", k)
			}
			return client.IgnoreNotFound(err)
		})
	}
}
