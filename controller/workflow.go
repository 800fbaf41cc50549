// Package controller is `sluice controller`: the Workflow reconciler, the pod injection
// webhook, the webhook's self-managed certificates and the NATS identities of the
// installation. It is built on controller-runtime; every reaction comes from a watch
// (Workflows, pods, Nodes, and the workflow's NATS KV bucket), nothing polls.
package controller

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/controller/inject"
	"github.com/sluice-io/sluice/internal/podconfig"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

// Event reasons (Kubernetes API conventions: UpperCamelCase).
const (
	ReasonInvalidSpec = "InvalidSpec"
	ReasonProvisioned = "Provisioned"
	ReasonNATSError   = "NATSError"
	ReasonCreatedPod  = "CreatedPod"
	ReasonScheduled   = "Scheduled"
	ReasonRetrying    = "Retrying"
	ReasonStepFailed  = "StepFailed"
	ReasonSucceeded   = "Succeeded"
	ReasonRunning     = "Running"
	ReasonPending     = "Pending"
	ReasonDataRemoved = "DataRemoved"
	// ReasonNoAgentUser: the workflow got no user ID of its own (every one of the
	// controller's --agent-users range is taken, or recording it failed); it waits.
	ReasonNoAgentUser    = "NoAgentUser"
	ReasonNotRemoved     = "NotRemoved"
	ReasonUnsupported    = "Unsupported"
	ReasonStorageMissing = "StorageMissing"
	// ReasonOutputsUnmet: every instance succeeded, but a declared literal output was never
	// committed, or a permanent one never stored; the message names each.
	ReasonOutputsUnmet = "OutputsUnmet"
	// ReasonWaitFailed: a request of a step's pod waited on the rules and failed (timed
	// out, or the file can never be complete); the Event names the pod, file and rule.
	ReasonWaitFailed = wfmeta.ProblemWaitFailed
	// ReasonUploadFailed: a permanent output could not be stored.
	ReasonUploadFailed = wfmeta.ProblemUploadFailed
)

// DefaultWorkers is WorkflowReconciler.Workers' default.
const DefaultWorkers = 4

// DefaultReconcileTimeout is WorkflowReconciler.ReconcileTimeout's default: a reconcile
// makes a few dozen API, NATS and object storage calls, each of seconds at most.
const DefaultReconcileTimeout = 2 * time.Minute

// WorkflowReconciler reconciles Workflows: it provisions their streams, writes the
// sidecars' configuration Secret, creates the templated steps' pods (placed near their
// inputs, retried up to each step's backoffLimit), reports status, and cleans up.
type WorkflowReconciler struct {
	// Client reads through the manager's cache, Secrets aside (ManagerClientOptions),
	// and writes to the API server.
	Client client.Client
	// APIReader reads from the API server what must be current: the users' storage
	// Secrets, a Workflow's templates as stored. Nil reads through Client.
	APIReader client.Reader
	// Recorder emits Events on Workflows.
	Recorder record.EventRecorder
	// Streams provisions and reads the workflows' NATS state.
	Streams Streams
	// Inject are the sidecar's settings (image, driver).
	Inject inject.Options
	// NATSURL is the URL sidecars connect to.
	NATSURL string
	// CA is the installation's CA certificate its NATS and object storage serve TLS with
	// (empty: none); every workflow's configuration Secret carries it (never its key).
	CA []byte
	// AgentUsers is the range of user IDs the workflows' sidecars and store servers run
	// as, one per workflow (status.agentUser); empty: all run as DefaultAgentUser.
	AgentUsers AgentUsers
	// agentUsers chooses from AgentUsers.
	agentUsers agentUserAllocator
	// AgentNamespace is the namespace of the workflows' agent Secrets (ensureAgentSecret),
	// which the CSI node plugins read; empty: none are made.
	AgentNamespace string
	// Storage is the installation's object storage, used by workflows whose
	// spec.storage names no endpoint or credentials; nil if there is none.
	Storage *podconfig.Storage
	// StorageReady reports whether the installation's bucket exists; nil means it does.
	// Until it does, workflows that store permanent files there get no configuration
	// Secret (their sidecars wait for it), so no upload can fail for a missing bucket.
	StorageReady func() bool
	// StorageAccounts makes the keys of each workflow that stores in the installation's
	// storage, reaching only its own prefix; nil means there is no way to make them, and
	// such workflows need spec.storage with a secretRef.
	StorageAccounts StorageAccounts
	// WorkflowMemoryMax and WorkflowDiskMax are the installation's largest memory and
	// disk tier of one workflow on a node, in bytes (the CSI plugins' flags of the same
	// name; 0: none): a Workflow whose spec.volume asks for more is refused before it is
	// provisioned (Ready=False, ReasonSizeNotPermitted).
	WorkflowMemoryMax, WorkflowDiskMax int64
	// Now is the clock (tests); nil means time.Now.
	Now func() time.Time
	// templatesChecked holds, by Workflow UID, the generation whose pod templates passed
	// templateErrors.
	templatesChecked sync.Map
	// Workers is how many Workflows are reconciled at once (controller-runtime's
	// MaxConcurrentReconciles); 0 means DefaultWorkers. One workflow whose reconcile is
	// slow (a large KV bucket, an object store that does not answer) holds one worker,
	// not the controller.
	Workers int
	// ReconcileTimeout bounds one reconcile (controller-runtime's ReconciliationTimeout):
	// its context ends then, and every NATS, object storage and API call in it returns,
	// so a call that would hang (a KV listing whose consumer a server restart lost, a
	// store behind a dead address) frees its worker, and the workflow is retried. 0
	// means DefaultReconcileTimeout.
	ReconcileTimeout time.Duration
	// DeadlockGrace is how long a workflow whose every unfinished instance waits on the
	// rules must show no progress before it fails as deadlocked (ReasonDeadlocked); 0
	// means DefaultDeadlockGrace, a negative value turns the check off.
	DeadlockGrace time.Duration
	// AccountCheckEvery is how often a running workflow's object storage account is
	// checked and made again if it is gone; 0 means DefaultAccountCheckEvery. A pod's
	// report of an upload refused for an unknown key has it checked at once.
	AccountCheckEvery time.Duration
	// NodeLostGrace is how long a node's Ready condition must have been False or Unknown
	// before the controller takes it for lost (nodeloss.go): its pods' attempts fail and
	// are retried elsewhere, the files held only there are lost. 0 means
	// DefaultNodeLostGrace, a negative value turns the check off.
	NodeLostGrace time.Duration

	watchMu  sync.Mutex // guards watches and outcomes
	watches  map[types.UID]context.CancelFunc
	outcomes map[types.UID]map[types.UID]bool // workflow -> pods whose outcome is recorded
	// compiled is each Workflow's compiled rule set, kept for its UID and generation:
	// compiling is bounded (semantics.MaxCompileWork) but not free, and a reconcile
	// happens on every pod event.
	compiledMu sync.Mutex
	compiled   map[types.NamespacedName]compiledRules
	// reported is, per workflow and pod, the time of the newest problem an Event reported.
	reportedMu sync.Mutex
	reported   map[types.UID]map[string]time.Time
	changes    chan event.GenericEvent
	stalls     stallWatch
	nodes      nodeWatch
	accountCache
}

// SetupWithManager registers the reconciler: it watches Workflows, every pod labelled
// with a workflow (created by it or injected by the webhook), the Jobs whose pod template
// carries that label, the Nodes (to tell a lost one), and the KV buckets of running
// workflows. It watches no Secrets (the manager must read them uncached:
// ManagerClientOptions), so the controller needs no list or watch of Secrets.
func (r *WorkflowReconciler) SetupWithManager(mgr ctrl.Manager) error {
	r.watches = map[types.UID]context.CancelFunc{}
	r.changes = make(chan event.GenericEvent, 1024)
	r.stalls.grace = cmp.Or(r.DeadlockGrace, DefaultDeadlockGrace)
	toWorkflow := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		wf := o.GetLabels()[v1alpha1.LabelWorkflow]
		if wf == "" {
			return nil
		}
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: wf}}}
	})
	jobWorkflow := func(o client.Object) string {
		if j, ok := o.(*batchv1.Job); ok {
			return j.Spec.Template.Labels[v1alpha1.LabelWorkflow]
		}
		return ""
	}
	jobToWorkflow := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		if wf := jobWorkflow(o); wf != "" {
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: wf}}}
		}
		return nil
	})
	jobHasWorkflow := predicate.NewPredicateFuncs(func(o client.Object) bool { return jobWorkflow(o) != "" })
	hasWorkflow := predicate.NewPredicateFuncs(func(o client.Object) bool { return o.GetLabels()[v1alpha1.LabelWorkflow] != "" })
	return ctrl.NewControllerManagedBy(mgr).
		WithOptions(controller.Options{MaxConcurrentReconciles: cmp.Or(r.Workers, DefaultWorkers),
			ReconciliationTimeout: cmp.Or(r.ReconcileTimeout, DefaultReconcileTimeout)}).
		For(&v1alpha1.Workflow{}).
		Watches(&corev1.Pod{}, toWorkflow, builder.WithPredicates(hasWorkflow)).
		// A labelled Job's pods fail the workflow only once the Job gives up: its status.
		Watches(&batchv1.Job{}, jobToWorkflow, builder.WithPredicates(jobHasWorkflow)).
		// A lost node fails its pods' attempts and loses the files held only there.
		Watches(&corev1.Node{}, r.nodeHandler()).
		WatchesRawSource(source.Channel(r.changes, &handler.EnqueueRequestForObject{})).
		Complete(r)
}

func (r *WorkflowReconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// Reconcile implements reconcile.Reconciler.
func (r *WorkflowReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	var wf v1alpha1.Workflow
	if err := r.Client.Get(ctx, req.NamespacedName, &wf); err != nil {
		if apierrors.IsNotFound(err) {
			r.forgetRules(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	names := wfmeta.NamesForWorkflow(wf.Namespace, wf.Name, string(wf.UID))

	if !wf.DeletionTimestamp.IsZero() {
		r.stopWatch(wf.UID)
		r.forgetRules(req.NamespacedName)
		r.reportedMu.Lock()
		delete(r.reported, wf.UID)
		r.reportedMu.Unlock()
		if !controllerutil.ContainsFinalizer(&wf, v1alpha1.Finalizer) {
			return ctrl.Result{}, nil
		}
		if err := r.Streams.Delete(ctx, names); err != nil {
			r.Recorder.Eventf(&wf, corev1.EventTypeWarning, ReasonNotRemoved, "removing stream %s: %v", names.Stream, err)
			return ctrl.Result{}, fmt.Errorf("removing the data of workflow %s: %w", req, err)
		}
		if err := r.removeAccount(ctx, &wf); err != nil {
			r.Recorder.Eventf(&wf, corev1.EventTypeWarning, ReasonNotRemoved, "%v", err)
			return ctrl.Result{}, fmt.Errorf("removing the data of workflow %s: %w", req, err)
		}
		if err := r.removeAgentSecret(ctx, &wf); err != nil {
			r.Recorder.Eventf(&wf, corev1.EventTypeWarning, ReasonNotRemoved, "%v", err)
			return ctrl.Result{}, fmt.Errorf("removing the data of workflow %s: %w", req, err)
		}
		if err := r.removeAgentUser(ctx, &wf); err != nil {
			r.Recorder.Eventf(&wf, corev1.EventTypeWarning, ReasonNotRemoved, "%v", err)
			return ctrl.Result{}, fmt.Errorf("removing the data of workflow %s: %w", req, err)
		}
		log.Info("workflow deleted: stream, metadata and object storage keys removed", "stream", names.Stream)
		patch := client.MergeFrom(wf.DeepCopy())
		controllerutil.RemoveFinalizer(&wf, v1alpha1.Finalizer)
		return ctrl.Result{}, client.IgnoreNotFound(r.Client.Patch(ctx, &wf, patch))
	}
	if !controllerutil.ContainsFinalizer(&wf, v1alpha1.Finalizer) {
		patch := client.MergeFrom(wf.DeepCopy())
		controllerutil.AddFinalizer(&wf, v1alpha1.Finalizer)
		if err := r.Client.Patch(ctx, &wf, patch); err != nil {
			return ctrl.Result{}, fmt.Errorf("adding finalizer to %s: %w", req, err)
		}
	}

	orig := wf.DeepCopy()
	st := &wf.Status
	res, err := r.reconcile(ctx, &wf, names)
	st.ObservedGeneration = wf.Generation
	if !equalStatus(orig.Status, wf.Status) {
		if perr := r.Client.Status().Patch(ctx, &wf, client.MergeFrom(orig)); perr != nil {
			return ctrl.Result{}, errors.Join(err, fmt.Errorf("updating status of %s: %w", req, perr))
		}
	}
	return res, err
}

func (r *WorkflowReconciler) reconcile(ctx context.Context, wf *v1alpha1.Workflow, names wfmeta.Names) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	st := &wf.Status
	if meta.IsStatusConditionTrue(st.Conditions, v1alpha1.ConditionDataRemoved) {
		return ctrl.Result{}, nil
	}
	rules, errs, err := r.rulesOf(ctx, wf)
	if err != nil {
		return ctrl.Result{}, err
	}
	if len(errs) == 0 {
		terrs, err := r.templateErrors(ctx, wf)
		if err != nil {
			return ctrl.Result{}, err
		}
		errs = terrs
	}
	if len(errs) > 0 {
		msg := errs.ToAggregate().Error()
		r.setFailed(wf, ReasonInvalidSpec, msg)
		r.Recorder.Event(wf, corev1.EventTypeWarning, ReasonInvalidSpec, msg)
		return ctrl.Result{}, nil
	}
	if len(wf.Spec.Sources) > 0 {
		msg := "spec.sources (stage-in) runs with `sluice run` only; on a cluster, stage inputs with a step"
		r.setFailed(wf, ReasonUnsupported, msg)
		return ctrl.Result{}, nil
	}

	// Provision once. A reconcile working from a cached Workflow older than the one that
	// recorded DataRemoved must not create the stream again after the TTL removed it.
	provisioned := meta.IsStatusConditionTrue(st.Conditions, v1alpha1.ConditionReady)
	if msg := sizeNotPermitted(wf, r.WorkflowMemoryMax, r.WorkflowDiskMax); msg != "" && !provisioned {
		setCondition(wf, v1alpha1.ConditionReady, metav1.ConditionFalse, ReasonSizeNotPermitted, msg)
		r.Recorder.Event(wf, corev1.EventTypeWarning, ReasonSizeNotPermitted, msg)
		return ctrl.Result{}, nil
	}
	if err := r.ensureStreams(ctx, provisioned, names, podsAtOnce(wf)); err != nil {
		setCondition(wf, v1alpha1.ConditionReady, metav1.ConditionFalse, ReasonNATSError, err.Error())
		r.Recorder.Eventf(wf, corev1.EventTypeWarning, ReasonNATSError, "provisioning stream %s: %v", names.Stream, err)
		return ctrl.Result{}, fmt.Errorf("provisioning the streams of %s/%s: %w", wf.Namespace, wf.Name, err)
	}
	if wf.Spec.Storage == nil && len(wf.Spec.Permanent) > 0 && r.Storage != nil && r.StorageReady != nil && !r.StorageReady() {
		msg := fmt.Sprintf("waiting for the installation's bucket %q at %s to exist", r.Storage.Bucket, r.Storage.Endpoint)
		setCondition(wf, v1alpha1.ConditionReady, metav1.ConditionFalse, ReasonStorageMissing, msg)
		return ctrl.Result{RequeueAfter: 2 * time.Second}, nil
	}
	if err := r.ensureAgentUser(ctx, wf); err != nil {
		setCondition(wf, v1alpha1.ConditionReady, metav1.ConditionFalse, ReasonNoAgentUser, err.Error())
		if errors.Is(err, errNoAgentUser) {
			r.Recorder.Event(wf, corev1.EventTypeWarning, ReasonNoAgentUser, err.Error())
			return ctrl.Result{RequeueAfter: 10 * time.Second}, nil
		}
		return ctrl.Result{}, err
	}
	renewAt, err := r.ensureSecret(ctx, wf, names)
	if isStorageNotPermitted(err) {
		setCondition(wf, v1alpha1.ConditionReady, metav1.ConditionFalse, ReasonStorageNotPermitted, err.Error())
		r.Recorder.Event(wf, corev1.EventTypeWarning, ReasonStorageNotPermitted, err.Error())
		return ctrl.Result{}, nil
	} else if err != nil {
		reason := ReasonStorageMissing
		if errors.Is(err, errNATSCredentials) {
			reason = ReasonNATSError
		}
		setCondition(wf, v1alpha1.ConditionReady, metav1.ConditionFalse, reason, err.Error())
		return ctrl.Result{}, err
	}
	agentRenewAt, err := r.ensureAgentSecret(ctx, wf, names)
	if err != nil {
		setCondition(wf, v1alpha1.ConditionReady, metav1.ConditionFalse, ReasonNATSError, err.Error())
		return ctrl.Result{}, err
	}
	if renewAt.IsZero() || (!agentRenewAt.IsZero() && agentRenewAt.Before(renewAt)) {
		renewAt = agentRenewAt
	}
	if !provisioned {
		r.Recorder.Eventf(wf, corev1.EventTypeNormal, ReasonProvisioned, "stream %s, KV bucket and configuration Secret %s ready", names.Stream, podconfig.SecretName(wf.Name))
	}
	setCondition(wf, v1alpha1.ConditionReady, metav1.ConditionTrue, ReasonProvisioned, "stream, KV bucket and sidecar configuration are set up")

	md, err := r.Streams.Metadata(ctx, names)
	if err != nil {
		log.Error(err, "reading workflow metadata; counters not refreshed")
	} else {
		countFiles(wf, md)
	}
	files := md.Files

	var pods corev1.PodList
	if err := r.Client.List(ctx, &pods, client.InNamespace(wf.Namespace), client.MatchingLabels{v1alpha1.LabelWorkflow: wf.Name}); err != nil {
		return ctrl.Result{}, fmt.Errorf("listing pods of %s/%s: %w", wf.Namespace, wf.Name, err)
	}
	// The pods of other tools that ended and were deleted still count, from their outcomes.
	all := recordedPods(wf, pods.Items, md.Outcomes)
	inst := groupPods(all)
	jobs, err := r.jobsOf(ctx, all)
	if err != nil {
		return ctrl.Result{}, err
	}

	finished := isFinished(wf)
	wasFinished := finished
	if !finished {
		r.recordOutcomes(ctx, wf.UID, names, pods.Items)
		stepOf := map[string]string{}
		for k, at := range inst {
			for _, a := range at {
				stepOf[a.pod.Name] = k.step
			}
		}
		taints, err := taintedPods(ctx, rules, md, stepOf)
		switch {
		case errors.Is(err, errTaintCheckTooCostly):
			why := err.Error()
			ctrl.LoggerFrom(ctx).Error(nil, "the workflow's withdrawals cannot be checked: the workflow fails", "why", why)
			r.setFailed(wf, ReasonTaintCheckTooCostly, why)
			r.Recorder.Event(wf, corev1.EventTypeWarning, ReasonTaintCheckTooCostly, why)
			finished = true
		case err != nil:
			return ctrl.Result{}, fmt.Errorf("checking %s/%s's reads against its withdrawals: %w", wf.Namespace, wf.Name, err)
		default:
			if why := applyTaints(wf, inst, taints); why != "" {
				ctrl.LoggerFrom(ctx).Error(nil, "a step instance succeeded on a withdrawn input: the workflow fails", "why", why)
				r.setFailed(wf, ReasonTaintedResult, why)
				r.Recorder.Event(wf, corev1.EventTypeWarning, ReasonTaintedResult, why)
				finished = true
			}
		}
	}
	var loss nodeLoss
	if !finished {
		loss = r.checkNodeLoss(ctx, wf, rules, inst, md, names)
		if loss.failure != "" {
			ctrl.LoggerFrom(ctx).Error(nil, "an input lost with its node is needed: the workflow fails", "why", loss.failure)
			r.setFailed(wf, ReasonInputLost, loss.failure)
			r.Recorder.Event(wf, corev1.EventTypeWarning, ReasonInputLost, loss.failure)
			finished = true
		}
	}
	if !finished {
		if err := r.createPods(ctx, wf, rules, inst, files, loss.avoid()); err != nil {
			return ctrl.Result{}, err
		}
	}
	obs := observed{instances: inst, jobs: jobs, stats: md.Pods}
	// The outputs are checked against metadata read after the pods were listed: a
	// sidecar records its commits and uploads before its pod can show Succeeded.
	delivered := func() ([]unmetOutput, error) {
		md, err := r.Streams.Metadata(ctx, names)
		if err != nil {
			return nil, err
		}
		return unmetOutputs(rules, md.Files), nil
	}
	var res ctrl.Result
	if r.summarise(ctx, wf, obs, delivered) {
		res.RequeueAfter = 2 * time.Second
	}
	if !renewAt.IsZero() {
		// The NATS credentials are renewed by the reconcile at or after renewAt.
		if after := max(renewAt.Sub(r.now()), time.Second); res.RequeueAfter == 0 || after < res.RequeueAfter {
			res.RequeueAfter = after
		}
	}
	r.removeLostPods(ctx, wf, inst, loss.attempts)
	if loss.after > 0 && (res.RequeueAfter == 0 || loss.after < res.RequeueAfter) {
		res.RequeueAfter = loss.after
	}
	if !finished && r.hasAccount(wf) {
		after := r.accountCheckEvery()
		if r.forgetAccountCheck(wf, md.Pods) {
			after = time.Second // a pod's upload met an unknown key: check the account now
		}
		if res.RequeueAfter == 0 || after < res.RequeueAfter {
			res.RequeueAfter = after
		}
	}
	if !finished && (res.RequeueAfter == 0 || res.RequeueAfter > secretCheckEvery) {
		// No Secret is watched: a running workflow's Secret deleted or changed is put
		// back at the next reconcile, within secretCheckEvery.
		res.RequeueAfter = secretCheckEvery
	}
	if !finished {
		r.reportProblems(wf, md.Pods)
		if after := r.checkDeadlock(ctx, wf, obs, md.Files); after > 0 && (res.RequeueAfter == 0 || after < res.RequeueAfter) {
			res.RequeueAfter = after
		}
	}

	if isFinished(wf) {
		r.stopWatch(wf.UID)
		// The Failed status lands first (Reconcile writes it when this one returns): the
		// removal talks to object storage, which may be slow or unreachable, so it runs from
		// the next reconcile on, each pass bounded.
		again := !wasFinished && wf.Status.Phase == v1alpha1.WorkflowFailed
		if wasFinished {
			rctx, cancel := context.WithTimeout(ctx, removalPass)
			var err error
			again, err = r.removeDerivedOutputs(rctx, wf, rules, pods.Items, files)
			cancel()
			if err != nil {
				ctrl.LoggerFrom(ctx).Error(err, "removing the stored outputs of a failed workflow; looking again")
			}
		}
		res, err := r.afterFinish(ctx, wf, names)
		if again && (res.RequeueAfter == 0 || res.RequeueAfter > 2*time.Second) {
			res.RequeueAfter = 2 * time.Second
		}
		return res, err
	}
	r.startWatch(ctx, wf, names)
	return res, nil
}

// checkDeadlock fails wf as deadlocked (ReasonDeadlocked) once every unfinished instance
// has waited on the rules with no progress for the deadlock grace, naming each wait in
// the Failed condition and a Warning Event, and stops its pods. Until then it returns
// when to look again (0: not stalled, or the check is off).
func (r *WorkflowReconciler) checkDeadlock(ctx context.Context, wf *v1alpha1.Workflow, obs observed, files []wfmeta.FileMeta) time.Duration {
	if r.DeadlockGrace < 0 || r.stalls.grace <= 0 {
		return 0
	}
	waiting, stalled := allWaiting(wf, obs)
	mark := ""
	if stalled { // the digest of every sidecar's stats only when it can matter
		mark = progressMark(obs, files)
	}
	waits, after := r.stalls.check(wf.UID, waiting, stalled, mark, r.now())
	if waits == nil {
		return after
	}
	msg := deadlockMessage(r.stalls.grace, waits)
	ctrl.LoggerFrom(ctx).Error(nil, "workflow deadlocked: its pods are stopped", "waits", waits)
	r.setFailed(wf, ReasonDeadlocked, msg)
	r.Recorder.Event(wf, corev1.EventTypeWarning, ReasonDeadlocked, msg)
	r.stopPods(ctx, wf, obs.instances)
	return 0
}

// reportProblems emits a Warning Event for every failed wait and failed upload the pods'
// sidecars recorded that no Event reported yet (kubectl describe swf lists them).
func (r *WorkflowReconciler) reportProblems(wf *v1alpha1.Workflow, stats []wfmeta.PodStats) {
	r.reportedMu.Lock()
	defer r.reportedMu.Unlock()
	if r.reported == nil {
		r.reported = map[types.UID]map[string]time.Time{}
	}
	seen := r.reported[wf.UID]
	if seen == nil {
		seen = map[string]time.Time{}
		r.reported[wf.UID] = seen
	}
	for _, ps := range stats {
		for _, p := range ps.Problems {
			if !p.At.After(seen[ps.Pod]) {
				continue
			}
			seen[ps.Pod] = p.At
			r.Recorder.Eventf(wf, corev1.EventTypeWarning, p.Kind, "pod %s: %s", ps.Pod, p.Message)
		}
	}
}

// summarise writes the status computeStatus derives from the pods, its conditions and
// events, and stops the remaining pods of a failed workflow. A workflow whose instances
// all succeeded succeeds only if delivered finds every declared output delivered
// (unmetOutputs); otherwise it fails naming them (ReasonOutputsUnmet). When delivered
// cannot tell (its metadata read failed), the phase stays and summarise reports true:
// look again soon.
func (r *WorkflowReconciler) summarise(ctx context.Context, wf *v1alpha1.Workflow, obs observed, delivered func() ([]unmetOutput, error)) (again bool) {
	st := &wf.Status
	prevPhase := st.Phase
	c := computeStatus(wf, obs)
	r.reportPlacements(wf, c.Steps)
	st.Steps, st.Progress, st.StepProgress, st.Waiting = c.Steps, c.Progress, c.StepProgress, c.Waiting
	switch c.Phase {
	case v1alpha1.WorkflowFailed:
		r.stopPods(ctx, wf, obs.instances) // every time: the cache may not have shown every pod yet
		if prevPhase != v1alpha1.WorkflowFailed {
			r.Recorder.Event(wf, corev1.EventTypeWarning, ReasonStepFailed, c.Failure)
			r.setFailed(wf, ReasonStepFailed, c.Failure)
		}
	case v1alpha1.WorkflowSucceeded:
		if prevPhase == v1alpha1.WorkflowSucceeded {
			break
		}
		unmet, err := delivered()
		if err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "reading the workflow's metadata to check its outputs; looking again")
			setCondition(wf, v1alpha1.ConditionProgressing, metav1.ConditionTrue, ReasonRunning, "every step succeeded; checking that every declared output was delivered")
			return true
		}
		if len(unmet) > 0 {
			msg := unmetMessage(unmet)
			for i, u := range unmet {
				if i == maxUnmetEvents {
					break
				}
				r.Recorder.Event(wf, corev1.EventTypeWarning, ReasonOutputsUnmet, "output not delivered: "+u.String())
			}
			r.setFailed(wf, ReasonOutputsUnmet, msg)
			break
		}
		st.Phase = v1alpha1.WorkflowSucceeded
		setCondition(wf, v1alpha1.ConditionSucceeded, metav1.ConditionTrue, ReasonSucceeded, "every instance of every step exited 0 and every declared output was delivered")
		setCondition(wf, v1alpha1.ConditionProgressing, metav1.ConditionFalse, ReasonSucceeded, "finished")
		r.Recorder.Eventf(wf, corev1.EventTypeNormal, ReasonSucceeded, "workflow succeeded: %d files committed", st.Files.Committed)
	case v1alpha1.WorkflowRunning:
		st.Phase = v1alpha1.WorkflowRunning
		if c.Running {
			setCondition(wf, v1alpha1.ConditionProgressing, metav1.ConditionTrue, ReasonRunning, fmt.Sprintf("%s steps done", st.Progress))
		} else {
			setCondition(wf, v1alpha1.ConditionProgressing, metav1.ConditionTrue, ReasonPending, "waiting for step pods to start")
		}
	default:
		st.Phase = v1alpha1.WorkflowPending
		setCondition(wf, v1alpha1.ConditionProgressing, metav1.ConditionTrue, ReasonPending, "waiting for step pods to start")
	}
	return false
}

// reportPlacements records an Event (ReasonScheduled) for each instance whose latest
// attempt is bound to a node that wf's status does not show yet: where each instance runs.
func (r *WorkflowReconciler) reportPlacements(wf *v1alpha1.Workflow, steps []v1alpha1.StepStatus) {
	shown := map[string]bool{} // pod/node in the status
	for _, s := range wf.Status.Steps {
		for _, in := range s.Instances {
			shown[in.Pod+"/"+in.Node] = true
		}
	}
	for _, s := range steps {
		for _, in := range s.Instances {
			if in.Node != "" && !shown[in.Pod+"/"+in.Node] {
				r.Recorder.Eventf(wf, corev1.EventTypeNormal, ReasonScheduled, "step %s instance %d: pod %s on node %s", s.Name, in.Instance, in.Pod, in.Node)
			}
		}
	}
}

func (r *WorkflowReconciler) setFailed(wf *v1alpha1.Workflow, reason, msg string) {
	wf.Status.Phase = v1alpha1.WorkflowFailed
	setCondition(wf, v1alpha1.ConditionFailed, metav1.ConditionTrue, reason, msg)
	setCondition(wf, v1alpha1.ConditionProgressing, metav1.ConditionFalse, reason, "stopped")
}

func isFinished(wf *v1alpha1.Workflow) bool {
	return wf.Status.Phase == v1alpha1.WorkflowSucceeded || wf.Status.Phase == v1alpha1.WorkflowFailed
}

// finishedAt is when the workflow's Succeeded or Failed condition became True.
func finishedAt(wf *v1alpha1.Workflow) time.Time {
	for _, t := range []string{v1alpha1.ConditionSucceeded, v1alpha1.ConditionFailed} {
		if c := meta.FindStatusCondition(wf.Status.Conditions, t); c != nil && c.Status == metav1.ConditionTrue {
			return c.LastTransitionTime.Time
		}
	}
	return time.Time{}
}

// ensureStreams creates the workflow's stream and KV bucket, for pods pods at once,
// unless they were provisioned.
func (r *WorkflowReconciler) ensureStreams(ctx context.Context, provisioned bool, names wfmeta.Names, pods int) error {
	if provisioned {
		return nil
	}
	return r.Streams.Ensure(ctx, names, pods)
}

// podsAtOnce is how many pods of wf may run at once: its steps' replicas together (every
// instance may run at the same time; a retry replaces its failed attempt).
func podsAtOnce(wf *v1alpha1.Workflow) int {
	n := 0
	for _, s := range wf.Spec.Steps {
		n += int(ptr.Deref(s.Replicas, 1))
	}
	return n
}

// afterFinish removes the temporary data ttlSecondsAfterFinished after the end.
func (r *WorkflowReconciler) afterFinish(ctx context.Context, wf *v1alpha1.Workflow, names wfmeta.Names) (ctrl.Result, error) {
	if wf.Spec.TTLSecondsAfterFinished == nil {
		return ctrl.Result{}, nil
	}
	due := finishedAt(wf).Add(time.Duration(*wf.Spec.TTLSecondsAfterFinished) * time.Second)
	if wait := due.Sub(r.now()); wait > 0 {
		return ctrl.Result{RequeueAfter: wait}, nil
	}
	if err := r.Streams.Delete(ctx, names); err != nil {
		r.Recorder.Eventf(wf, corev1.EventTypeWarning, ReasonNotRemoved, "removing stream %s: %v", names.Stream, err)
		return ctrl.Result{}, fmt.Errorf("removing the data of %s/%s: %w", wf.Namespace, wf.Name, err)
	}
	if err := r.removeAgentSecret(ctx, wf); err != nil {
		r.Recorder.Eventf(wf, corev1.EventTypeWarning, ReasonNotRemoved, "%v", err)
		return ctrl.Result{}, fmt.Errorf("removing the data of %s/%s: %w", wf.Namespace, wf.Name, err)
	}
	setCondition(wf, v1alpha1.ConditionDataRemoved, metav1.ConditionTrue, ReasonDataRemoved,
		"ttlSecondsAfterFinished passed: stream, metadata and node stores removed; permanent outputs stay in object storage")
	r.Recorder.Event(wf, corev1.EventTypeNormal, ReasonDataRemoved, "temporary data removed")
	return ctrl.Result{}, nil
}

// countFiles sets the file counters and permanent outputs from the workflow's metadata:
// committed files and their bytes, permanent outputs and the bytes stored, and the bytes
// the pods' peers received from other nodes.
func countFiles(wf *v1alpha1.Workflow, md wfmeta.Meta) {
	var c v1alpha1.FileCounters
	var outs []v1alpha1.PermanentOutput
	for _, f := range md.Files {
		c.Committed++
		c.BytesWritten += f.Size
		if f.URI != "" && !slices.ContainsFunc(wf.Status.RemovedOutputs, func(o v1alpha1.RemovedOutput) bool { return o.Path == f.Path }) {
			c.BytesStored += f.Size
			outs = append(outs, v1alpha1.PermanentOutput{Path: f.Path, URI: f.URI, Size: f.Size, SHA256: f.SHA256})
		}
	}
	nodes := map[string]*v1alpha1.NodeStoreStatus{}
	for _, p := range md.Pods {
		c.BytesStreamed += p.BytesReceived
		if p.Host == "" {
			continue
		}
		n := nodes[p.Host]
		if n == nil {
			n = &v1alpha1.NodeStoreStatus{Name: p.Host}
			nodes[p.Host] = n
		}
		n.MemoryBytes += p.MemoryBytes
		n.DiskBytes += p.DiskBytes
		n.SpilledBytes += p.SpilledBytes
		n.ReleasedBytes += p.ReleasedBytes
		n.ReceivedBytes += p.BytesReceived
	}
	slices.SortFunc(outs, func(a, b v1alpha1.PermanentOutput) int { return cmp.Compare(a.Path, b.Path) })
	wf.Status.Files = c
	wf.Status.Outputs = outs
	wf.Status.Nodes = nil
	for _, n := range nodes {
		wf.Status.Nodes = append(wf.Status.Nodes, *n)
	}
	slices.SortFunc(wf.Status.Nodes, func(a, b v1alpha1.NodeStoreStatus) int { return cmp.Compare(a.Name, b.Name) })
}

// startWatch follows the workflow's KV bucket while it runs.
func (r *WorkflowReconciler) startWatch(ctx context.Context, wf *v1alpha1.Workflow, names wfmeta.Names) {
	if r.changes == nil {
		return
	}
	r.watchMu.Lock()
	defer r.watchMu.Unlock()
	if _, ok := r.watches[wf.UID]; ok {
		return
	}
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	obj := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: wf.Namespace, Name: wf.Name}}
	err := r.Streams.Watch(wctx, names, func() {
		select {
		case r.changes <- event.GenericEvent{Object: obj}:
		default: // the queue already holds a reconcile of some workflow; counters catch up then
		}
	})
	if err != nil {
		cancel()
		ctrl.LoggerFrom(ctx).Error(err, "watching workflow metadata")
		return
	}
	r.watches[wf.UID] = cancel
}

func (r *WorkflowReconciler) stopWatch(uid types.UID) {
	r.stalls.forget(uid)
	r.watchMu.Lock()
	defer r.watchMu.Unlock()
	if cancel, ok := r.watches[uid]; ok {
		cancel()
		delete(r.watches, uid)
	}
	delete(r.outcomes, uid)
}

func setCondition(wf *v1alpha1.Workflow, t string, s metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&wf.Status.Conditions, metav1.Condition{
		Type: t, Status: s, Reason: reason, Message: msg, ObservedGeneration: wf.Generation,
	})
}

func equalStatus(a, b v1alpha1.WorkflowStatus) bool {
	return equality.Semantic.DeepEqual(a, b)
}
