package controller

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/podconfig"
)

// AgentUsers is the range of Linux user IDs the controller gives workflows
// (status.agentUser): First, First+1, ... First+Count-1. The zero value gives none: every
// workflow's sidecars and store servers run as v1alpha1.DefaultAgentUser.
type AgentUsers struct {
	// First is the range's lowest user ID.
	First int64
	// Count is how many IDs the range holds (0: none).
	Count int64
}

// ParseAgentUsers reads a range "FIRST-LAST" of user IDs (inclusive, both above 0 and
// below 2^31, so that no ID is root or overflows a kernel's signed uid); "" is the empty
// range. The error names the flag.
func ParseAgentUsers(s string) (AgentUsers, error) {
	if s == "" {
		return AgentUsers{}, nil
	}
	a, b, ok := strings.Cut(s, "-")
	first, err1 := strconv.ParseInt(a, 10, 64)
	last, err2 := strconv.ParseInt(b, 10, 64)
	if !ok || err1 != nil || err2 != nil || first < 1 || last < first || last >= 1<<31 {
		return AgentUsers{}, fmt.Errorf("--agent-users %q: want FIRST-LAST, user IDs with 0 < FIRST <= LAST < 2147483648", s)
	}
	return AgentUsers{First: first, Count: last - first + 1}, nil
}

// A user ID is a workflow's once the controller has created its claim: a ConfigMap
// named AgentUserClaim(id) in the agent namespace, labelled with the workflow's UID. The
// API server creates a name once, so no two controller processes (a rollout's old and new
// pods, replicas) give one ID to two workflows, whatever their caches show. A claim goes
// with its workflow (removeAgentUser).
const (
	// labelClaimWorkflowUID on a claim is the UID of the Workflow the user ID is for.
	labelClaimWorkflowUID = "sluice.io/workflow-uid"
	// labelClaim marks the claims among the agent namespace's ConfigMaps.
	labelClaim = "sluice.io/agent-user"
)

// AgentUserClaim is the name of the claim of user ID id in the agent namespace.
func AgentUserClaim(id int64) string { return "sluice-user-" + strconv.FormatInt(id, 10) }

// agentUserCursor is the ConfigMap of the agent namespace that holds (key "next") where
// the next search for a free user ID starts, across the controller's restarts.
const agentUserCursor = "sluice-users"

// agentUserAllocator remembers where the next search for a free user ID starts: after
// the last one given, so that an ID a deleted workflow leaves is given again only once
// the range has gone round (its pods, or an engine's that outlive it, have long ended).
type agentUserAllocator struct {
	mu     sync.Mutex
	next   int64 // 0: not known yet (after the highest claimed)
	loaded bool
}

// errNoAgentUser is returned when every user ID of the range is taken.
var errNoAgentUser = errors.New("every user ID of the controller's --agent-users range is taken by a workflow")

// perUser reports whether the controller gives workflows users of their own.
func (r *WorkflowReconciler) perUser() bool {
	return r.AgentUsers.Count > 0 && r.AgentNamespace != ""
}

// apiReader reads from the API server, uncached.
func (r *WorkflowReconciler) apiReader() client.Reader {
	if r.APIReader != nil {
		return r.APIReader
	}
	return r.Client
}

// claims returns the user IDs claimed in the agent namespace, by workflow UID.
func (r *WorkflowReconciler) claims(ctx context.Context) (map[types.UID]int64, map[int64]bool, error) {
	var list corev1.ConfigMapList
	if err := r.apiReader().List(ctx, &list, client.InNamespace(r.AgentNamespace), client.HasLabels{labelClaim}); err != nil {
		return nil, nil, fmt.Errorf("listing the claimed user IDs: %w", err)
	}
	byWorkflow, taken := map[types.UID]int64{}, map[int64]bool{}
	for _, cm := range list.Items {
		id, err := strconv.ParseInt(strings.TrimPrefix(cm.Name, "sluice-user-"), 10, 64)
		if err != nil || cm.Name != AgentUserClaim(id) {
			continue
		}
		taken[id] = true
		byWorkflow[types.UID(cm.Labels[labelClaimWorkflowUID])] = id
	}
	return byWorkflow, taken, nil
}

// agentUser returns the user ID of wf (the API server's latest, ensureAgentUser reads
// it) for its sidecars and store servers, claiming one of the range for it if it has
// none: its status's; else the one
// claimed for it before (a status patch that failed); else DefaultAgentUser when the
// controller gives no users of their own, or when an earlier controller provisioned wf
// (made its configuration Secret) before users were given per workflow, since its node
// directories are that user's already; else the first free ID after the last given.
func (r *WorkflowReconciler) agentUser(ctx context.Context, wf *v1alpha1.Workflow) (int64, error) {
	if wf.Status.AgentUser != nil {
		return *wf.Status.AgentUser, nil
	}
	if !r.perUser() {
		return v1alpha1.DefaultAgentUser, nil
	}
	al := &r.agentUsers
	al.mu.Lock()
	defer al.mu.Unlock()
	byWorkflow, taken, err := r.claims(ctx)
	if err != nil {
		return 0, err
	}
	if id, ok := byWorkflow[wf.UID]; ok {
		return id, nil
	}
	var sec corev1.Secret
	err = r.apiReader().Get(ctx, types.NamespacedName{Namespace: wf.Namespace, Name: podconfig.SecretName(wf.Name)}, &sec)
	if err == nil && metav1.IsControlledBy(&sec, wf) {
		return v1alpha1.DefaultAgentUser, nil // provisioned by a controller before this one
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return 0, fmt.Errorf("reading the workflow's Secret: %w", err)
	}
	first, n := r.AgentUsers.First, r.AgentUsers.Count
	if !al.loaded {
		al.next = r.loadCursor(ctx, taken)
		al.loaded = true
	}
	start := al.next
	if start < first || start >= first+n {
		start = first
	}
	for i := int64(0); i < n; i++ {
		id := first + (start-first+i)%n
		if taken[id] {
			continue
		}
		claim := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: AgentUserClaim(id), Namespace: r.AgentNamespace,
			Labels: map[string]string{v1alpha1.LabelManagedBy: v1alpha1.ManagedBy, labelClaim: "true", labelClaimWorkflowUID: string(wf.UID)}},
			Data: map[string]string{"workflow": wf.Namespace + "/" + wf.Name}}
		err := r.Client.Create(ctx, claim)
		if apierrors.IsAlreadyExists(err) {
			continue // another controller process claimed it a moment ago
		}
		if err != nil {
			return 0, fmt.Errorf("claiming user ID %d: %w", id, err)
		}
		al.next = id + 1
		r.saveCursor(ctx, al.next)
		return id, nil
	}
	return 0, errNoAgentUser
}

// loadCursor returns where the search for a free user ID starts: the cursor the last
// controller saved, else after the highest ID claimed.
func (r *WorkflowReconciler) loadCursor(ctx context.Context, taken map[int64]bool) int64 {
	var cm corev1.ConfigMap
	if err := r.apiReader().Get(ctx, types.NamespacedName{Namespace: r.AgentNamespace, Name: agentUserCursor}, &cm); err == nil {
		if next, err := strconv.ParseInt(cm.Data["next"], 10, 64); err == nil {
			return next
		}
	}
	var next int64
	for id := range taken {
		next = max(next, id+1)
	}
	return next
}

// saveCursor keeps next as the cursor for the next controller (best effort: the claims,
// not the cursor, keep IDs apart; a cursor lost only shortens the time before an ID a
// deleted workflow left is given again).
func (r *WorkflowReconciler) saveCursor(ctx context.Context, next int64) {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: agentUserCursor, Namespace: r.AgentNamespace,
		Labels: map[string]string{v1alpha1.LabelManagedBy: v1alpha1.ManagedBy}}, Data: map[string]string{"next": strconv.FormatInt(next, 10)}}
	err := r.Client.Update(ctx, cm)
	if apierrors.IsNotFound(err) {
		err = r.Client.Create(ctx, cm)
	}
	if err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "saving where the next user ID is looked for", "next", next)
	}
}

// ensureAgentUser records wf's user ID (agentUser) in its status at once, before anything
// runs as it, with a patch of its own on the API's latest Workflow that fails if that is
// not the latest any more (a stale copy must not overwrite the user another process
// recorded); on such a conflict it reads the Workflow again and tries again. wf's status
// gets the ID.
func (r *WorkflowReconciler) ensureAgentUser(ctx context.Context, wf *v1alpha1.Workflow) error {
	if wf.Status.AgentUser != nil {
		return nil
	}
	var u int64
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var fresh v1alpha1.Workflow
		if err := r.apiReader().Get(ctx, client.ObjectKeyFromObject(wf), &fresh); err != nil {
			return fmt.Errorf("reading the Workflow: %w", err)
		}
		if fresh.UID != wf.UID {
			return fmt.Errorf("workflow %s/%s was made again (UID %s, not %s)", wf.Namespace, wf.Name, fresh.UID, wf.UID)
		}
		if fresh.Status.AgentUser != nil {
			u = *fresh.Status.AgentUser
			return nil
		}
		var err error
		if u, err = r.agentUser(ctx, &fresh); err != nil {
			return err
		}
		before := fresh.DeepCopy()
		fresh.Status.AgentUser = &u
		return r.Client.Status().Patch(ctx, &fresh, client.MergeFromWithOptions(before, client.MergeFromWithOptimisticLock{}))
	})
	if err != nil {
		return fmt.Errorf("recording the workflow's user ID: %w", err)
	}
	wf.Status.AgentUser = &u
	return nil
}

// EnsureAgentUser gives wf its user ID (status.agentUser) now if it has none: what the
// webhook calls before it injects the first pod of a workflow the reconciler has not
// provisioned yet. wf is updated.
func (r *WorkflowReconciler) EnsureAgentUser(ctx context.Context, wf *v1alpha1.Workflow) error {
	return r.ensureAgentUser(ctx, wf)
}

// removeAgentUser deletes the claim of a deleted workflow's user ID.
func (r *WorkflowReconciler) removeAgentUser(ctx context.Context, wf *v1alpha1.Workflow) error {
	if r.AgentNamespace == "" {
		return nil
	}
	var list corev1.ConfigMapList
	if err := r.apiReader().List(ctx, &list, client.InNamespace(r.AgentNamespace),
		client.MatchingLabels{labelClaim: "true", labelClaimWorkflowUID: string(wf.UID)}); err != nil {
		return fmt.Errorf("listing the claim of the workflow's user ID: %w", err)
	}
	for i := range list.Items {
		if err := r.Client.Delete(ctx, &list.Items[i]); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("removing the claim of the workflow's user ID: %w", err)
		}
	}
	return nil
}
