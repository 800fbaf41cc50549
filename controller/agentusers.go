package controller

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sluice-io/sluice/api/v1alpha1"
)

// AgentUsers is the range of Linux user IDs the controller gives workflows
// (status.agentUser): First, First+1, ... First+Count-1. The zero value gives none: every
// workflow's sidecars and store servers run as v1alpha1.DefaultAgentUser.
type AgentUsers struct {
	First, Count int64
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

// agentUserAllocator hands out user IDs of an AgentUsers range, none twice among the
// Workflows the controller's cache holds, and remembers the ones it gave until the cache
// shows them (a reconcile and the webhook may choose for two workflows at once).
type agentUserAllocator struct {
	mu sync.Mutex
	// given holds, by Workflow UID, the IDs chosen that the cache may not show yet, and
	// when.
	given map[types.UID]givenUser
}

// givenUser is a user ID chosen for a workflow at a time.
type givenUser struct {
	id int64
	at time.Time
}

// givenFor is how long a chosen user ID stays taken without the cache showing it: far
// longer than the cache lags, and then a workflow deleted before it showed frees it.
const givenFor = 10 * time.Minute

// errNoAgentUser is returned when every user ID of the range is taken.
var errNoAgentUser = fmt.Errorf("every user ID of the controller's --agent-users range is taken by a workflow")

// agentUser returns the user ID of wf's sidecars and store servers: its status's, else
// DefaultAgentUser when the controller has no range or wf was provisioned before it
// chose one per workflow (legacy: its node directories are that user's already), else the
// lowest of the range no other Workflow has; it does not write it. c lists the
// Workflows (the cache).
func (r *WorkflowReconciler) agentUser(ctx context.Context, c client.Reader, wf *v1alpha1.Workflow, provisioned bool) (int64, error) {
	if wf.Status.AgentUser != nil {
		return *wf.Status.AgentUser, nil
	}
	if r.AgentUsers.Count == 0 || provisioned {
		return v1alpha1.DefaultAgentUser, nil
	}
	al := &r.agentUsers
	al.mu.Lock()
	defer al.mu.Unlock()
	if g, ok := al.given[wf.UID]; ok {
		return g.id, nil
	}
	var list v1alpha1.WorkflowList
	if err := c.List(ctx, &list); err != nil {
		return 0, fmt.Errorf("listing the Workflows to choose a user ID: %w", err)
	}
	used := map[int64]bool{}
	for i := range list.Items {
		w := &list.Items[i]
		if w.Status.AgentUser != nil {
			used[*w.Status.AgentUser] = true
			delete(al.given, w.UID) // the cache shows it now
		}
	}
	now := r.now()
	for uid, g := range al.given {
		if now.Sub(g.at) > givenFor {
			delete(al.given, uid)
			continue
		}
		used[g.id] = true
	}
	for u := r.AgentUsers.First; u < r.AgentUsers.First+r.AgentUsers.Count; u++ {
		if !used[u] {
			if al.given == nil {
				al.given = map[types.UID]givenUser{}
			}
			al.given[wf.UID] = givenUser{id: u, at: now}
			return u, nil
		}
	}
	return 0, errNoAgentUser
}

// ensureAgentUser records wf's user ID (agentUser) in its status at once, with a patch of
// its own, before anything runs as it: a status lost with a later patch would have the
// next reconcile choose another. wf is updated.
func (r *WorkflowReconciler) ensureAgentUser(ctx context.Context, c client.Reader, wf *v1alpha1.Workflow, provisioned bool) error {
	if wf.Status.AgentUser != nil {
		return nil
	}
	u, err := r.agentUser(ctx, c, wf, provisioned)
	if err != nil {
		return err
	}
	before := wf.DeepCopy()
	wf.Status.AgentUser = &u
	if err := r.Client.Status().Patch(ctx, wf, client.MergeFrom(before)); err != nil {
		wf.Status.AgentUser = nil
		return fmt.Errorf("recording the workflow's user ID %d: %w", u, err)
	}
	return nil
}

// EnsureAgentUser gives wf its user ID (status.agentUser) now if it has none: what the
// webhook calls before it injects the first pod of a workflow the reconciler has not
// provisioned yet. wf is updated.
func (r *WorkflowReconciler) EnsureAgentUser(ctx context.Context, wf *v1alpha1.Workflow) error {
	provisioned := meta.IsStatusConditionTrue(wf.Status.Conditions, v1alpha1.ConditionReady)
	return r.ensureAgentUser(ctx, r.Client, wf, provisioned)
}
