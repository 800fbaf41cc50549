// Package sidecar is `sluice sidecar`: the per-pod agent that serves a pod's streaming
// volume. It runs unprivileged as a native sidecar (an init container with
// restartPolicy: Always) and does for one step instance what `sluice run` does for all:
// it gets the pod's mounted /dev/fuse descriptor from the CSI node plugin, serves the
// workflow's files on it with the commit and firing rules (streamfs over the node store
// the workflow's pods on this node share), joins the workflow's NATS transport as one
// peer, and stores the permanent files it is home for in object storage.
//
// When the pod's app containers have exited the kubelet sends it SIGTERM: it waits for
// the app's last write handles to be released (so every close is counted), records the
// instance's termination (OnTermination commits) unless the controller recorded that the
// app containers failed, publishes everything, stores its permanent outputs, and exits.
package sidecar

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/csi-driver/handoff"
	"github.com/sluice-io/sluice/internal/objstore"
	"github.com/sluice-io/sluice/internal/outputs"
	"github.com/sluice-io/sluice/internal/pathpattern"
	"github.com/sluice-io/sluice/internal/podconfig"
	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/streamfs"
	"github.com/sluice-io/sluice/internal/transport"
	"github.com/sluice-io/sluice/internal/wfmeta"
	"github.com/sluice-io/sluice/internal/wfnode"
	"github.com/sluice-io/sluice/sidecar/directview"
)

// Options configure the sidecar.
type Options struct {
	// ControlDir is where the CSI node plugin publishes the pod's control volume: the
	// hand-off socket and workflow/{data,state}.
	ControlDir string
	// ConfigDir is where the workflow's Secret (package podconfig) is mounted.
	ConfigDir string
	// MetricsAddr serves /metrics, /readyz and /healthz; empty: none.
	MetricsAddr string
	// AttachWait bounds the wait for the CSI node plugin's hand-off (default 2m).
	AttachWait time.Duration
	// DrainTimeout bounds the work after SIGTERM: waiting for the app's write handles,
	// publishing, uploading (default 10m).
	DrainTimeout time.Duration
	// OutcomeWait bounds, on SIGTERM, the wait for the controller to record how the app
	// containers ended (wfmeta.Outcome): an attempt that failed does not record the
	// instance's termination, so its OnTermination files wait for the retry. When the
	// wait runs out the termination is recorded, as it would be with no controller. Zero
	// does not wait (a sidecar run without the controller).
	OutcomeWait time.Duration
	// SpaceWait bounds how long a write waits for space in a full node store (default 10s).
	SpaceWait time.Duration
	// CatchUpWait bounds how long the sidecar applies the workflow's events recorded before
	// it started, which it does before it serves the volume (default 4m, within the startup
	// probe's 300 s). A sidecar restarted under a running app must know every file the app
	// holds open or may look up before it answers the kernel's resent requests; when the
	// wait runs out, Start fails rather than answer them wrongly.
	CatchUpWait time.Duration
	// Passthrough says whether the view lets the kernel read committed files from the
	// node store itself (streamfs.PassthroughMode; the zero value is auto). Registering
	// backing files needs CAP_SYS_ADMIN, so auto falls back to serving every read in an
	// unprivileged sidecar; on fails Start there instead.
	Passthrough streamfs.PassthroughMode
	// Log receives structured logs.
	Log logr.Logger
}

// Sidecar is a running sidecar.
type Sidecar struct {
	opts  Options
	log   logr.Logger
	vol   handoff.Volume
	peer  string // transport peer name: the step instance (wfmeta.InstancePeer)
	cfg   *podconfig.Config
	rules *semantics.RuleSet
	nc    *nats.Conn
	// node is the workflow's node this sidecar runs: the node store it shares with the
	// workflow's other pods on the node, its engine, its transport peer and its copier.
	node   *wfnode.Node
	view   *streamfs.View   // fuse mode
	direct *directview.View // direct mode
	ready  atomic.Bool
	// served is the view once it serves (mount), for observers running on the
	// transport's goroutines.
	served atomic.Pointer[streamfs.View]
	// releasedFiles and releasedBytes count the Consumed files this sidecar deleted from
	// the node store (release).
	releasedFiles, releasedBytes atomic.Int64
	// retryProblems are the pod's latest uploads retried for an unknown key
	// (noteUploadRetry), under retryMu.
	retryMu       sync.Mutex
	retryProblems []wfmeta.PodProblem
	http          *http.Server
	// uploadCtx ends the uploads in progress (after DrainTimeout).
	uploadCtx    context.Context
	uploadCancel context.CancelFunc
	// statsDone is closed when the stats loop has returned.
	statsDone chan struct{}
	// taintMu guards tainted: the inputs withdrawn while the app ran, after it had
	// opened them (noteWithdrawn).
	taintMu sync.Mutex
	tainted []wfmeta.WithdrawnInput
}

// statsInterval is how often a running sidecar records its pod's stats (wfmeta.PodStats:
// counters, waits, failed waits and uploads) for the Workflow's status and Events, when
// they changed; it records them once more at drain.
const statsInterval = 5 * time.Second

// Start attaches to the pod's volume and serves it. Errors name what failed: the hand-off,
// the configuration file, NATS, the object storage or the mount.
func Start(ctx context.Context, opts Options) (*Sidecar, error) {
	if opts.AttachWait <= 0 {
		opts.AttachWait = 2 * time.Minute
	}
	if opts.DrainTimeout <= 0 {
		opts.DrainTimeout = v1alpha1.DefaultDrainTimeout
	}
	if opts.SpaceWait <= 0 {
		opts.SpaceWait = 10 * time.Second
	}
	if opts.CatchUpWait <= 0 {
		opts.CatchUpWait = 4 * time.Minute
	}
	if opts.Log.GetSink() == nil {
		opts.Log = logr.Discard()
	}
	s := &Sidecar{opts: opts}
	s.uploadCtx, s.uploadCancel = context.WithCancel(context.Background())
	if err := s.start(ctx); err != nil {
		s.stop()
		return nil, err
	}
	return s, nil
}

func (s *Sidecar) start(ctx context.Context) error {
	sock := filepath.Join(s.opts.ControlDir, handoff.SocketName)
	att, err := handoff.Attach(ctx, sock, s.opts.AttachWait)
	if err != nil {
		return err
	}
	s.vol = att.Volume
	s.peer = wfmeta.InstancePeer(s.vol.Step, s.vol.Instance)
	s.log = s.opts.Log.WithValues("namespace", s.vol.Namespace, "pod", s.vol.Pod, "workflow", s.vol.Workflow,
		"step", s.vol.Step, "instance", s.vol.Instance, "node", s.vol.Node)
	direct := s.vol.Mode == v1alpha1.ModeDirect
	if direct && att.FUSE != nil {
		att.FUSE.Close()
		att.FUSE = nil
	}
	if !direct && att.FUSE == nil {
		return fmt.Errorf("the CSI node plugin handed over no FUSE descriptor for the %q volume", s.vol.Mode)
	}
	if s.cfg, err = podconfig.Load(s.opts.ConfigDir); err != nil {
		return err
	}
	wf := s.cfg.Workflow
	if wf.Name != s.vol.Workflow || (wf.Namespace != "" && wf.Namespace != s.vol.Namespace) {
		return fmt.Errorf("the configuration in %s is for workflow %s/%s, the volume for %s/%s", s.opts.ConfigDir, wf.Namespace, wf.Name, s.vol.Namespace, s.vol.Workflow)
	}
	rules, errs, _ := semantics.Compile(ctx, &wf.Spec)
	if len(errs) > 0 {
		return fmt.Errorf("workflow %s: %w", wf.Name, errs.ToAggregate())
	}
	s.rules = rules
	if _, ok := rules.Step(s.vol.Step); !ok {
		return fmt.Errorf("workflow %s declares no step %q (volume attribute sluice.io/step)", wf.Name, s.vol.Step)
	}
	if err := s.connect(); err != nil {
		return err
	}
	wdir := filepath.Join(s.opts.ControlDir, "workflow")
	spill := wfnode.SpillAll
	if direct {
		// In direct mode the app opens the store's files by their memory tier path: a
		// file being written must stay there.
		spill = wfnode.SpillCommitted
	}
	if s.node, err = wfnode.New(wfnode.Config{Workflow: wf, Rules: rules, StoreDir: filepath.Join(wdir, "data"),
		DiskDir: filepath.Join(s.opts.ControlDir, "disk"), SpaceWait: s.opts.SpaceWait, Spill: spill,
		MemoryLimit: s.vol.MemoryLimit, DiskLimit: s.vol.DiskLimit}); err != nil {
		return err
	}
	if direct {
		// Watch the app's directory and take commits before the transport replays the
		// workflow's history, so that nothing written or committed is missed.
		s.direct, err = directview.New(handoff.DirectDir(wdir, s.vol.PodUID), s.node.Store, directview.Options{
			Step: s.vol.Step, Instance: s.vol.Instance, Log: s.log.WithName("direct"),
		})
		if err != nil {
			return err
		}
		s.node.Engine.Observe(semantics.Observer{Commit: s.direct.Committed})
	}
	err = s.node.Join(ctx, transport.Config{
		Conn: s.nc, Names: wfmeta.NamesForWorkflow(s.vol.Namespace, s.vol.Workflow, string(wf.UID)),
		// Credentials come from the controller, which created the stream and bucket and
		// gave the sidecars no right to create them.
		Provisioned: len(s.cfg.NATSCreds) > 0,
		Node:        s.peer, Host: s.vol.Node, StateDir: filepath.Join(wdir, "state"),
		Log: s.log.WithName("transport"),
		// A sidecar killed before the server acknowledged its last events loses none: its
		// next life (the same peer) publishes again what the stream lacks (Recover).
		JournalDir: filepath.Join(wdir, "state", "journal", wfmeta.Token(s.peer)),
	})
	if err != nil {
		return err
	}
	// The pod's sidecar serves the node store's bytes while it runs; the CSI node plugin's
	// store server serves them after every pod of the workflow on this node has ended,
	// connected as the workflow's agent Secret says (docs/transport.md, "On a cluster").
	if err := s.catchUp(ctx); err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, s.opts.CatchUpWait)
	n, err := s.node.Peer.Recover(rctx)
	cancel()
	if err != nil {
		return fmt.Errorf("publishing again what the sidecar's previous life had not had acknowledged: %w", err)
	}
	if n > 0 {
		s.log.Info("published again the events the sidecar's previous life lost", "messages", n)
	}
	obj, err := s.objectStore(ctx)
	if err != nil {
		return err
	}
	s.node.Output(s.uploadCtx, outputs.Config{Node: s.peer, Objects: obj, Log: s.log.WithName("outputs"), Home: s.home})
	s.node.Engine.Observe(semantics.Observer{
		Withdraw: func(w *semantics.WithdrawnError) {
			if v := s.served.Load(); v != nil {
				v.Invalidate(w.Path) // a retry may make it again under a reused inode number
				if v.OpenedInput(w.Generation) {
					s.noteTainted(w)
				}
			}
		},
		Release: s.release,
		Punch: func(p string, upto int64) {
			freed, err := s.node.Store.Punch(p, upto)
			if err != nil {
				s.log.Error(err, "releasing what every consumer has read", "path", pathpattern.Printable(p))
				return
			}
			s.releasedBytes.Add(freed)
		},
	})

	if direct {
		s.direct.Start(s.node.Peer)
	} else if err := s.mount(att, sock); err != nil {
		return err
	}
	if s.opts.MetricsAddr != "" {
		s.serveHTTP()
	}
	s.statsDone = make(chan struct{})
	go s.recordStats()
	s.ready.Store(true)
	s.log.Info("serving the pod's streaming volume", "mode", s.vol.Mode)
	return nil
}

// catchUp applies the workflow's events recorded so far before the volume is served. The
// kernel resends a dead sidecar's requests to its successor at once, and requests name
// files (node IDs of the earlier server, paths looked up again) that only the replay makes
// known: served earlier, they resolve to placeholders or fail with EIO in the app.
func (s *Sidecar) catchUp(ctx context.Context) error {
	start := time.Now()
	cctx, cancel := context.WithTimeout(ctx, s.opts.CatchUpWait)
	defer cancel()
	if err := s.node.Peer.CaughtUp(cctx); err != nil {
		return fmt.Errorf("applying the workflow's events before serving the volume (catch-up wait %s): %w", s.opts.CatchUpWait, err)
	}
	s.log.V(1).Info("applied the workflow's events before serving", "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// mount serves the pod's FUSE mount on the handed descriptor.
func (s *Sidecar) mount(att *handoff.Attached, sock string) error {
	wait := time.Hour
	if wt := s.cfg.Workflow.Spec.WaitTimeout; wt != nil && wt.Duration > 0 {
		wait = wt.Duration
	}
	var err error
	s.view, err = streamfs.Mount("/dev/fd/"+strconv.Itoa(int(att.FUSE.Fd())), s.node.Store, s.node.Peer, streamfs.Options{
		Step: s.vol.Step, Instance: s.vol.Instance, WaitTimeout: wait, Log: s.log.WithName("fs"),
		Passthrough: s.opts.Passthrough,
		Device:      att.FUSE, Init: att.Init,
		SaveInit: func(b []byte) error { return handoff.SaveInit(sock, b) },
		NodeLog:  filepath.Join(s.opts.ControlDir, "workflow", "state", "views", s.vol.PodUID),
	})
	if err != nil {
		return err
	}
	s.served.Store(s.view)
	if att.Init != nil {
		s.log.Info("took over the pod's mount after a restart")
	}
	switch {
	case s.opts.Passthrough == streamfs.PassthroughOff:
		s.log.Info("FUSE passthrough is off: the sidecar serves every read of committed files itself", "reason", "passthrough mode off")
	case !s.view.Passthrough():
		// Registering backing files needs CAP_SYS_ADMIN, which the sidecar does not have;
		// reads stay correct, served by the sidecar (metric sluice_passthrough 0).
		s.log.Info("FUSE passthrough is off: the sidecar serves every read of committed files itself", "reason", "no CAP_SYS_ADMIN, or a kernel older than 6.9")
	}
	return nil
}

// connect connects to NATS with the workflow's credentials.
func (s *Sidecar) connect() error {
	o := transport.ConnOptions{
		Name:          "sluice-sidecar " + s.vol.Namespace + "/" + s.vol.Pod,
		ReconnectWait: 250 * time.Millisecond, Inbox: s.cfg.NATSInbox, CA: s.cfg.CA,
	}
	if len(s.cfg.NATSCreds) > 0 {
		o.CredsFile = filepath.Join(s.opts.ConfigDir, v1alpha1.SecretKeyNATSCreds)
	}
	nc, err := transport.Connect(s.cfg.NATSURL, o)
	if err != nil {
		return err
	}
	s.nc = nc
	return nil
}

// objectStore opens the object storage of permanent outputs. Without one, permanent
// outputs are refused at commit with a clear error, and everything else works.
func (s *Sidecar) objectStore(ctx context.Context) (objstore.Store, error) {
	st := s.cfg.Storage
	if st == nil {
		return noStorage{}, nil
	}
	s3, err := st.Open(ctx, s.cfg.CA) // the installation's CA, when its storage serves TLS
	if err != nil {
		return nil, err
	}
	// The controller makes the workflow's account again if it is gone (deleted by a
	// workflow of the namespace, or an operator): retry an unknown key meanwhile, and
	// tell the controller at once through the pod's problems.
	s3.RetryUnknownKeys = true
	s3.OnRetry = s.noteUploadRetry
	return s3, nil
}

// maxRetryProblems bounds the retried upload errors a pod records, retryProblemEvery how
// often it records one.
const (
	maxRetryProblems  = 5
	retryProblemEvery = 30 * time.Second
)

// noteUploadRetry records an upload error that is being retried, if it is an unknown key,
// among the pod's problems (podStats), at most every retryProblemEvery: the controller
// checks the workflow's account when it reads one.
func (s *Sidecar) noteUploadRetry(err error) {
	if !objstore.IsUnknownKey(err) {
		return
	}
	s.retryMu.Lock()
	defer s.retryMu.Unlock()
	if n := len(s.retryProblems); n > 0 && time.Since(s.retryProblems[n-1].At) < retryProblemEvery {
		return // one report in a while is enough for the controller, and for Events
	}
	s.retryProblems = append(s.retryProblems, wfmeta.PodProblem{Kind: wfmeta.ProblemUploadFailed,
		Message: "retrying an upload: " + err.Error(), At: time.Now().UTC()})
	if n := len(s.retryProblems); n > maxRetryProblems {
		s.retryProblems = slices.Delete(s.retryProblems, 0, n-maxRetryProblems)
	}
}

// noStorage refuses permanent outputs when the workflow has no object storage.
type noStorage struct{}

func (noStorage) URI(key string) string { return "" }
func (noStorage) Put(context.Context, string, string) (objstore.Object, error) {
	return objstore.Object{}, errors.New("the workflow has permanent outputs but no object storage (spec.storage, or the storage Sluice was deployed with)")
}

// home says whether this pod stores permanent file p: the pod that created it (home node
// policy Create, and Hashing, whose node set is not fixed on a cluster), or the pod of the
// step instance a Manual policy pins it to; for a permanent file whose creator pod has
// exited, the one running pod that adopts it (transport.Peer.Adopt).
func (s *Sidecar) home(p string) bool {
	if home := s.rules.Home(p); home.Policy == v1alpha1.HomeNodeManual {
		return home.Step == s.vol.Step && home.Instance == s.vol.Instance
	}
	creator := s.node.Peer.Creator(p)
	if creator == s.peer {
		return true
	}
	// A file that commits after its creator's pod exited (OnTermination over several
	// instances, OnFile) is adopted by one of the pods still running when it is
	// permanent: someone must store it, and only pods hold the object storage's
	// credentials. Any other such file is recorded by the store server of the node its
	// bytes are on (storeserver.Server), which reads them there: a pod here would fetch
	// them all to hash them, a node with no reader receiving the whole file.
	if !s.rules.IsPermanent(p) {
		return false
	}
	ctx, cancel := context.WithTimeout(s.uploadCtx, 10*time.Second)
	defer cancel()
	ok, err := s.node.Peer.AdoptOrphan(ctx, p)
	if err != nil {
		s.log.Error(err, "adopting a file whose home pod has exited", "path", p, "creator", creator)
		return false
	}
	if ok {
		s.log.Info("adopted a file whose home pod has exited", "path", p, "creator", creator)
	}
	return ok
}

// release is the engine's release observer (semantics.Observer.Release): a Consumed
// file's consumers have all exited, so its bytes leave this node's store. Every sidecar of
// the node hears of it; the first one deletes it.
func (s *Sidecar) release(st semantics.FileStatus) {
	size, err := s.node.Store.Remove(st.Path)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			s.log.Error(err, "deleting a consumed file", "path", pathpattern.Printable(st.Path))
		}
		return // another sidecar of the node deleted it
	}
	s.releasedFiles.Add(1)
	s.releasedBytes.Add(size)
	s.log.V(1).Info("deleted a consumed file", "path", pathpattern.Printable(st.Path))
}

// Ready reports whether the volume is being served.
func (s *Sidecar) Ready() bool { return s.ready.Load() }

// Drain is what the sidecar does on SIGTERM, after the app containers have exited: wait
// for their write handles to be released, record the instance's termination (when the
// attempt succeeded, appSucceeded), publish everything, store the permanent outputs this
// pod is home for, and stop serving. It
// returns the first error; the sidecar exits either way.
func (s *Sidecar) Drain() error {
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.DrainTimeout)
	defer cancel()
	stopUploads := context.AfterFunc(ctx, s.uploadCancel)
	defer stopUploads()
	var errs []error
	if s.view != nil {
		if err := s.view.WaitWritersClosed(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if s.direct != nil {
		// Ingest what the app left and count the closes no event reported.
		if err := s.direct.Sync(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	ok, why := s.appSucceeded(ctx)
	if t := s.taints(); ok && len(t) > 0 {
		// What it made may rest on bytes that no longer exist: the attempt counts as
		// failed (the controller retries it or fails the workflow naming the input).
		ok, why = false, fmt.Sprintf("it read %s, withdrawn since (%s)", pathpattern.Printable(t[0].Path), t[0].Reason)
		s.log.Error(nil, "the app succeeded, but an input it had opened was withdrawn since: its outputs are withdrawn",
			"path", pathpattern.Printable(t[0].Path), "reason", t[0].Reason, "inputs", len(t))
	}
	if s.view != nil {
		reads := wfmeta.Reads{Pod: s.vol.Pod, Inputs: s.view.OpenedInputs(), Withdrawn: s.taints()}
		if err := s.node.Peer.RecordReads(ctx, s.vol.PodUID, reads); err != nil {
			errs = append(errs, err)
		}
	}
	switch {
	case ok:
		s.node.Peer.Terminate(s.vol.Step, s.vol.Instance)
		s.log.Info("recorded the instance's termination")
	case s.view != nil:
		// The attempt failed: what it wrote is taken back on every node before anything
		// of it is stored, so that its retry can write it and nobody opens it meanwhile.
		reason := fmt.Sprintf("the attempt of step %s instance %d in pod %s/%s, which wrote it, failed (%s)",
			s.vol.Step, s.vol.Instance, s.vol.Namespace, s.vol.Pod, why)
		if _, err := s.view.Withdraw(reason); err != nil {
			errs = append(errs, fmt.Errorf("withdrawing the failed attempt's outputs: %w", err))
		}
	default:
		s.log.Info("the attempt failed; a direct-mode volume does not withdraw what it wrote (docs/semantics.md)")
	}
	if err := s.node.Peer.Sync(ctx); err != nil {
		errs = append(errs, fmt.Errorf("publishing the pod's last events: %w", err))
	}
	if err := s.node.Copier.Finish(ctx); err != nil {
		errs = append(errs, err)
	}
	s.uploadCancel() // ends the stats loop too
	if s.statsDone != nil {
		<-s.statsDone
	}
	if _, err := s.node.Peer.RecordStats(ctx, s.vol.PodUID, s.podStats()); err != nil {
		errs = append(errs, err)
	}
	for _, o := range s.node.Copier.Results() {
		s.log.Info("stored permanent output", "path", o.Path, "uri", o.URI, "bytes", o.Size, "sha256", o.SHA256)
	}
	s.stop()
	return errors.Join(errs...)
}

// noteTainted records that w, withdrawn now, is an input the app had opened.
func (s *Sidecar) noteTainted(w *semantics.WithdrawnError) {
	s.taintMu.Lock()
	defer s.taintMu.Unlock()
	s.tainted = append(s.tainted, wfmeta.WithdrawnInput{Path: w.Path, Reason: w.Reason})
}

// taints returns the inputs withdrawn after the app had opened them.
func (s *Sidecar) taints() []wfmeta.WithdrawnInput {
	s.taintMu.Lock()
	defer s.taintMu.Unlock()
	return slices.Clone(s.tainted)
}

// appSucceeded reports whether the instance's termination is to be recorded: unless the
// controller records, within OutcomeWait, that the app containers failed. A failed
// attempt is retried by whoever runs the pod (the controller, a Job); the retry's
// sidecar records the termination. When the attempt failed, why is the controller's
// reason.
func (s *Sidecar) appSucceeded(ctx context.Context) (ok bool, why string) {
	if s.opts.OutcomeWait <= 0 || s.vol.PodUID == "" {
		return true, ""
	}
	wctx, cancel := context.WithTimeout(ctx, s.opts.OutcomeWait)
	defer cancel()
	start := time.Now()
	o, err := s.node.Peer.AwaitOutcome(wctx, s.vol.PodUID)
	switch {
	case err != nil:
		s.log.Error(err, "no outcome of the app containers from the controller; recording the instance's termination as if they succeeded",
			"waited", time.Since(start).Round(time.Millisecond))
		return true, ""
	case !o.Succeeded:
		s.log.Info("the app containers failed: not recording the instance's termination, its outputs wait for a retry",
			"reason", o.Reason)
		return false, o.Reason
	}
	s.log.V(1).Info("the app containers succeeded", "waited", time.Since(start).Round(time.Millisecond))
	return true, ""
}

// recordStats records the pod's transport counters every statsInterval while they
// change, until uploadCtx ends. A failed write is logged and tried at the next tick.
func (s *Sidecar) recordStats() {
	defer close(s.statsDone)
	t := time.NewTicker(statsInterval)
	defer t.Stop()
	for {
		select {
		case <-s.uploadCtx.Done():
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(s.uploadCtx, 10*time.Second)
		if _, err := s.node.Peer.RecordStats(ctx, s.vol.PodUID, s.podStats()); err != nil {
			s.log.Error(err, "recording the pod's stats")
		}
		cancel()
	}
}

// maxRecordedWaits bounds the waits a pod records for the Workflow's status.
const maxRecordedWaits = 5

// podStats is what the pod records for the Workflow's status and Events: its waits now
// (oldest first) and its recent failed waits and uploads.
func (s *Sidecar) podStats() wfmeta.PodStats {
	st := wfmeta.PodStats{Pod: s.vol.Pod, ReleasedBytes: s.releasedBytes.Load()}
	if s.node != nil {
		st.MemoryBytes, st.DiskBytes = s.node.Store.Used(), s.node.Store.DiskUsed()
		_, st.SpilledBytes = s.node.Store.Spilled()
	}
	if s.view != nil {
		vs := s.view.Stats()
		for _, w := range vs.Waits[:min(len(vs.Waits), maxRecordedWaits)] {
			st.Waits = append(st.Waits, wfmeta.WaitStat{What: w.What, Since: w.Since.UTC().Truncate(time.Second)})
		}
		for _, f := range vs.FailedWaits {
			st.Problems = append(st.Problems, wfmeta.PodProblem{Kind: wfmeta.ProblemWaitFailed, Message: f.What + ": " + f.Err, At: f.At.UTC()})
		}
	}
	if s.node != nil && s.node.Copier != nil {
		for _, f := range s.node.Copier.Stats().Failures {
			st.Problems = append(st.Problems, wfmeta.PodProblem{Kind: wfmeta.ProblemUploadFailed, Message: f.Err, At: f.At.UTC()})
		}
	}
	s.retryMu.Lock()
	st.Problems = append(st.Problems, s.retryProblems...)
	s.retryMu.Unlock()
	return st
}

// stop stops serving and releases everything (the mount stays: the CSI node plugin
// removes it when the kubelet unpublishes the volume).
func (s *Sidecar) stop() {
	s.ready.Store(false)
	s.uploadCancel()
	if s.statsDone != nil {
		<-s.statsDone
	}
	if s.view != nil {
		_ = s.view.Unmount()
	}
	if s.direct != nil {
		s.direct.Stop()
	}
	if s.node != nil {
		s.node.Stop()
	}
	if s.nc != nil {
		s.nc.Close()
	}
	if s.http != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = s.http.Shutdown(ctx)
		cancel()
	}
	s.uploadCancel()
}
