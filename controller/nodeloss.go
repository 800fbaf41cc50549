package controller

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/pathpattern"
	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

// What the controller does when a node is lost (docs/kubernetes.md, "Losing a node"): a
// node whose kubelet stopped answering keeps its pods Running in the API until the node
// lifecycle controller evicts them, minutes later, and their consumers elsewhere would
// wait on them. Once a node's Ready condition has been False or Unknown for the node-lost
// grace, or its Node object is deleted, the unfinished attempts on it count as failed
// (ReasonNodeLost) and are retried elsewhere within their backoffLimit, the files whose
// bytes were held only there are recorded lost (wfmeta.LostFile), and an instance that
// needs one of them and has yet to start fails the Workflow (ReasonInputLost).

// DefaultNodeLostGrace is WorkflowReconciler.NodeLostGrace's default. The node lifecycle
// controller marks a node Unknown once its kubelet has not reported for its
// node-monitor-grace-period (40 to 50 s); 40 s more lets a kubelet or network that comes
// straight back (a restart, a brief partition) keep its pods, and is still minutes before
// the lifecycle controller evicts them (300 s).
const DefaultNodeLostGrace = 40 * time.Second

// Reasons of node loss.
const (
	// ReasonNodeLost is the reason of an attempt whose pod's node was lost (its observed
	// status, the Workflow's Event when the pod is removed): the attempt counts as failed.
	ReasonNodeLost = "NodeLost"
	// ReasonFilesLost is the Event naming the files whose bytes went with a lost node.
	ReasonFilesLost = "FilesLost"
	// ReasonInputLost is the reason of a Workflow failed because an instance that has yet
	// to run needs a file lost with a node; the message names the file and the node.
	ReasonInputLost = "InputLost"
)

// nodeWatch remembers the Nodes deleted since the controller started: a pod bound to a
// node the cache does not hold is on a lost node only if the node was seen going (a pod
// of a test, or of a cluster whose node names are not Node objects, is not).
type nodeWatch struct {
	mu      sync.Mutex
	deleted map[string]time.Time
}

func (w *nodeWatch) noteDeleted(name string, at time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.deleted == nil {
		w.deleted = map[string]time.Time{}
	}
	w.deleted[name] = at
}

func (w *nodeWatch) noteCreated(name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.deleted, name)
}

func (w *nodeWatch) deletedAt(name string) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	at, ok := w.deleted[name]
	return at, ok
}

// nodeHandler enqueues every unfinished Workflow when a Node's readiness changes or the
// Node is deleted (rare events; which workflows hold bytes there is in their KV buckets,
// not in the cache), and records deletions.
func (r *WorkflowReconciler) nodeHandler() handler.EventHandler {
	all := func(ctx context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		var list v1alpha1.WorkflowList
		if err := r.Client.List(ctx, &list); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "listing Workflows after a Node changed")
			return
		}
		for i := range list.Items {
			if !isFinished(&list.Items[i]) {
				q.Add(reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
			}
		}
	}
	return handler.Funcs{
		CreateFunc: func(_ context.Context, e event.CreateEvent, _ workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			r.nodes.noteCreated(e.Object.GetName())
		},
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			o, ok1 := e.ObjectOld.(*corev1.Node)
			n, ok2 := e.ObjectNew.(*corev1.Node)
			if ok1 && ok2 && readyStatus(o) != readyStatus(n) {
				all(ctx, q)
			}
		},
		DeleteFunc: func(ctx context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			r.nodes.noteDeleted(e.Object.GetName(), r.now())
			all(ctx, q)
		},
	}
}

func readyStatus(n *corev1.Node) corev1.ConditionStatus {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status
		}
	}
	return corev1.ConditionUnknown
}

// lossOf says whether node n counts as lost at now: its Ready condition has been False or
// Unknown for grace (why, naming since when), or not yet (how long until it would; 0 when
// the node is Ready, or reports no Ready condition at all).
func lossOf(n *corev1.Node, grace time.Duration, now time.Time) (why string, after time.Duration) {
	for _, c := range n.Status.Conditions {
		if c.Type != corev1.NodeReady || c.Status == corev1.ConditionTrue {
			continue
		}
		since := c.LastTransitionTime.Time
		if left := since.Add(grace).Sub(now); left > 0 {
			return "", left
		}
		return fmt.Sprintf("its Ready condition has been %s since %s (%s), past the node-lost grace of %s",
			c.Status, since.UTC().Format(time.RFC3339), cmp.Or(c.Reason, "no reason given"), grace), 0
	}
	return "", 0
}

// lostNodes returns which of nodes are lost now (name: why) and, of those failing but
// not yet past the grace, how long until the first would be (0: none).
func (r *WorkflowReconciler) lostNodes(ctx context.Context, nodes []string) (map[string]string, time.Duration) {
	lost := map[string]string{}
	var after time.Duration
	for _, name := range nodes {
		var n corev1.Node
		err := r.Client.Get(ctx, types.NamespacedName{Name: name}, &n)
		if apierrors.IsNotFound(err) {
			if at, ok := r.nodes.deletedAt(name); ok {
				lost[name] = "its Node object was deleted at " + at.UTC().Format(time.RFC3339)
			}
			continue
		}
		if err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "reading a Node to tell whether it is lost", "node", name)
			continue
		}
		why, left := lossOf(&n, r.nodeLostGrace(), r.now())
		if why != "" {
			lost[name] = why
		} else if left > 0 && (after == 0 || left < after) {
			after = left
		}
	}
	return lost, after
}

func (r *WorkflowReconciler) nodeLostGrace() time.Duration {
	return cmp.Or(r.NodeLostGrace, DefaultNodeLostGrace)
}

// peerNodes maps each instance's transport peer (wfmeta.InstancePeer) to the node of its
// latest attempt bound to one: where the files it created are.
func peerNodes(inst map[instanceKey][]attempt) map[string]string {
	out := map[string]string{}
	for k, at := range inst {
		for _, a := range at {
			if a.pod.Spec.NodeName != "" {
				out[wfmeta.InstancePeer(k.step, k.instance)] = a.pod.Spec.NodeName
			}
		}
	}
	return out
}

// fileNodes are the nodes holding the bytes of committed file f as written there: its
// holders, or, for a record that names none, its home peer's node.
func fileNodes(f wfmeta.FileMeta, nodeOf map[string]string) []string {
	if len(f.Holders) > 0 {
		return f.Holders
	}
	if n := nodeOf[f.Home]; n != "" {
		return []string{n}
	}
	return nil
}

// watchedNodes are the nodes whose loss matters to a workflow: those of its unfinished
// attempts and those holding its committed files' bytes, sorted.
func watchedNodes(inst map[instanceKey][]attempt, files []wfmeta.FileMeta, nodeOf map[string]string) []string {
	set := map[string]bool{}
	for _, at := range inst {
		for _, a := range at {
			if done, _ := podDone(a.pod); !done && a.pod.Spec.NodeName != "" {
				set[a.pod.Spec.NodeName] = true
			}
		}
	}
	for _, f := range files {
		for _, n := range fileNodes(f, nodeOf) {
			set[n] = true
		}
	}
	return slices.Sorted(maps.Keys(set))
}

// lostAttempt is an unfinished attempt whose pod is bound to a lost node.
type lostAttempt struct {
	key  instanceKey
	pod  *corev1.Pod
	node string
}

// failLostAttempts makes each unfinished attempt of wf's own pods that is bound to a lost
// node count as failed in the observed copy (Failed, ReasonNodeLost, a message naming the
// node and why it is lost), so that its instance is retried within its step's
// backoffLimit, and returns them in spec order. Pods of other tools (a Job's) are left to
// their owners.
func failLostAttempts(wf *v1alpha1.Workflow, inst map[instanceKey][]attempt, lost map[string]string) []lostAttempt {
	if len(lost) == 0 {
		return nil
	}
	var out []lostAttempt
	for _, s := range wf.Spec.Steps {
		for i := 0; i < int(ptr.Deref(s.Replicas, 1)); i++ {
			k := instanceKey{s.Name, i}
			for _, a := range inst[k] {
				p := a.pod
				why, ok := lost[p.Spec.NodeName]
				if done, _ := podDone(p); done || !ok || !metav1.IsControlledBy(p, wf) {
					continue
				}
				p.Status.Phase, p.Status.Reason = corev1.PodFailed, ReasonNodeLost
				p.Status.Message = fmt.Sprintf("node %s was lost: %s", p.Spec.NodeName, why)
				out = append(out, lostAttempt{key: k, pod: p, node: p.Spec.NodeName})
			}
		}
	}
	return out
}

// replicated reports whether file p's bytes travel through the stream (`replicate:
// Stream`): every node's materialiser stores them, so they outlive their home node.
func replicated(rules *semantics.RuleSet, p string) bool {
	res := rules.Resolve(p)
	return res.Rule != nil && res.Rule.Replicate == v1alpha1.ReplicateStream
}

// lostFiles returns the committed files whose bytes went with the lost nodes: every node
// that held them as written there is lost, they were not replicated through the stream
// and no permanent copy was stored (a URI). Sorted by path.
func lostFiles(rules *semantics.RuleSet, files []wfmeta.FileMeta, lost map[string]string, nodeOf map[string]string) []wfmeta.LostFile {
	if len(lost) == 0 {
		return nil
	}
	var out []wfmeta.LostFile
	for _, f := range files {
		nodes := fileNodes(f, nodeOf)
		if f.URI != "" || len(nodes) == 0 || replicated(rules, f.Path) ||
			slices.ContainsFunc(nodes, func(n string) bool { return lost[n] == "" }) {
			continue
		}
		out = append(out, wfmeta.LostFile{Path: f.Path, Node: nodes[0], Reason: lost[nodes[0]]})
	}
	slices.SortFunc(out, func(a, b wfmeta.LostFile) int { return strings.Compare(a.Path, b.Path) })
	return out
}

// inputLoss names the first instance, in spec order, that needs a lost file and cannot
// get it: an instance of a step whose inputs match the file, that has not succeeded and
// has no attempt running (none yet, one Pending, or its latest failed, to be retried or
// not). A running attempt may hold the bytes already (fetched to its node); if it reads
// them and cannot, its read fails naming the node and the file, and so does its
// attempt. "" when there is none.
func inputLoss(wf *v1alpha1.Workflow, rules *semantics.RuleSet, inst map[instanceKey][]attempt, lost []wfmeta.LostFile) string {
	if len(lost) == 0 {
		return ""
	}
	for _, s := range wf.Spec.Steps {
		si, ok := rules.Step(s.Name)
		if !ok || len(si.Inputs) == 0 {
			continue
		}
		i := slices.IndexFunc(lost, func(l wfmeta.LostFile) bool { return rules.MatchesAny(si.Inputs, l.Path) })
		if i < 0 {
			continue
		}
		for n := 0; n < int(ptr.Deref(s.Replicas, 1)); n++ {
			at := inst[instanceKey{s.Name, n}]
			if slices.ContainsFunc(at, func(a attempt) bool { return a.pod.Status.Phase == corev1.PodSucceeded }) {
				continue
			}
			if len(at) > 0 && at[len(at)-1].pod.Status.Phase == corev1.PodRunning {
				continue
			}
			l := lost[i]
			return fmt.Sprintf("step %s instance %d needs %s, whose bytes were lost with node %s (held only there: not `replicate: Stream`, not stored permanently; %s)",
				s.Name, n, pathpattern.Printable(l.Path), l.Node, l.Reason)
		}
	}
	return ""
}

// mergeLost adds to recorded the lost files not recorded yet, sorted by path.
func mergeLost(recorded, found []wfmeta.LostFile) []wfmeta.LostFile {
	out := slices.Clone(recorded)
	for _, f := range found {
		if !slices.ContainsFunc(out, func(r wfmeta.LostFile) bool { return r.Path == f.Path }) {
			out = append(out, f)
		}
	}
	slices.SortFunc(out, func(a, b wfmeta.LostFile) int { return strings.Compare(a.Path, b.Path) })
	return out
}

// lostRecorder is the Streams that can record lost files (JetStreams); a Streams without
// it (a test's) leaves them unrecorded and reports them by Event each time.
type lostRecorder interface {
	// RecordLost records f unless a record of its path exists, and reports whether it
	// wrote one.
	RecordLost(ctx context.Context, names wfmeta.Names, f wfmeta.LostFile) (bool, error)
}

// RecordLost implements lostRecorder: a KV create of wfmeta.LostKey, so that the first
// record of a file stands and the controller reports each lost file once.
func (s *JetStreams) RecordLost(ctx context.Context, names wfmeta.Names, f wfmeta.LostFile) (bool, error) {
	_, kv, err := s.bucket(ctx, names)
	if err != nil {
		return false, err
	}
	b, err := json.Marshal(f)
	if err != nil {
		return false, err
	}
	if _, err := kv.Create(ctx, wfmeta.LostKey(f.Path), b); errors.Is(err, jetstream.ErrKeyExists) {
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("recording the loss of %s in %s: %w", f.Path, names.Bucket, err)
	}
	return true, nil
}

// maxLostInEvent bounds the paths one FilesLost Event names.
const maxLostInEvent = 10

// recordLost records the files found lost in the workflow's bucket and emits one Warning
// Event per node naming the files first recorded now.
func (r *WorkflowReconciler) recordLost(ctx context.Context, wf *v1alpha1.Workflow, names wfmeta.Names, found []wfmeta.LostFile) {
	rec, _ := r.Streams.(lostRecorder)
	fresh := map[string][]string{} // node -> paths
	for _, f := range found {
		f.At = r.now().UTC()
		if rec != nil {
			wrote, err := rec.RecordLost(ctx, names, f)
			if err != nil {
				ctrl.LoggerFrom(ctx).Error(err, "recording a file lost with its node", "path", pathpattern.Printable(f.Path), "node", f.Node)
			}
			if !wrote {
				continue
			}
		}
		fresh[f.Node] = append(fresh[f.Node], pathpattern.Printable(f.Path))
	}
	for _, node := range slices.Sorted(maps.Keys(fresh)) {
		paths := fresh[node]
		shown := paths[:min(len(paths), maxLostInEvent)]
		msg := fmt.Sprintf("node %s was lost with %d file(s) held only there (not `replicate: Stream`, not stored permanently): %s",
			node, len(paths), strings.Join(shown, ", "))
		if len(paths) > len(shown) {
			msg += fmt.Sprintf("; and %d more", len(paths)-len(shown))
		}
		ctrl.LoggerFrom(ctx).Error(nil, "files lost with their node", "node", node, "files", len(paths))
		r.Recorder.Event(wf, corev1.EventTypeWarning, ReasonFilesLost, msg)
	}
}

// nodeLoss is what one reconcile found of lost nodes.
type nodeLoss struct {
	// nodes are the lost nodes a workflow's pods or files are on (name: why).
	nodes map[string]string
	// attempts are the unfinished attempts on them, now counted as failed.
	attempts []lostAttempt
	// failure says why the workflow fails (ReasonInputLost); "" if it does not.
	failure string
	// after is when to look again: a node failing but not yet past the grace.
	after time.Duration
}

// avoid lists the lost nodes, for the placement of new pods.
func (l nodeLoss) avoid() []string { return slices.Sorted(maps.Keys(l.nodes)) }

// checkNodeLoss finds the lost nodes among those wf's unfinished pods and committed files
// are on, makes the attempts there count as failed, records the files lost with them,
// and says whether an instance that needs one of them makes the workflow fail.
func (r *WorkflowReconciler) checkNodeLoss(ctx context.Context, wf *v1alpha1.Workflow, rules *semantics.RuleSet, inst map[instanceKey][]attempt, md wfmeta.Meta, names wfmeta.Names) nodeLoss {
	if r.NodeLostGrace < 0 {
		return nodeLoss{}
	}
	nodeOf := peerNodes(inst)
	lost, after := r.lostNodes(ctx, watchedNodes(inst, md.Files, nodeOf))
	loss := nodeLoss{nodes: lost, after: after}
	loss.attempts = failLostAttempts(wf, inst, lost)
	found := lostFiles(rules, md.Files, lost, nodeOf)
	r.recordLost(ctx, wf, names, found)
	loss.failure = inputLoss(wf, rules, inst, mergeLost(md.Lost, found))
	return loss
}

// removeLostPods force-deletes (grace 0: the kubelet of a lost node never confirms) the
// pods of lost attempts once nothing needs them in the API: a later attempt of their
// instance exists (so the attempt count stands), or the workflow has finished. Each
// removal is a Warning Event naming the node, the instance and what follows.
func (r *WorkflowReconciler) removeLostPods(ctx context.Context, wf *v1alpha1.Workflow, inst map[instanceKey][]attempt, lost []lostAttempt) {
	for _, l := range lost {
		at := inst[l.key]
		later := at[len(at)-1].pod != l.pod
		if !later && !isFinished(wf) {
			continue
		}
		if !l.pod.DeletionTimestamp.IsZero() && ptr.Deref(l.pod.DeletionGracePeriodSeconds, 1) == 0 {
			continue
		}
		err := r.Client.Delete(ctx, l.pod, client.GracePeriodSeconds(0), client.Preconditions{UID: &l.pod.UID})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			continue
		}
		if err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "removing the pod of a lost node", "pod", klog.KObj(l.pod), "node", l.node)
			continue
		}
		next := "not retried: the workflow has finished"
		if later {
			next = "retried as pod " + at[len(at)-1].pod.Name + " on another node"
		}
		r.Recorder.Eventf(wf, corev1.EventTypeWarning, ReasonNodeLost, "step %s instance %d (pod %s) failed: %s; %s",
			l.key.step, l.key.instance, l.pod.Name, l.pod.Status.Message, next)
	}
}
