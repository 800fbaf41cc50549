// Package runner is `sluice run`: it runs a Workflow on one machine, every step instance as
// local processes with its own view of the streaming volume, exactly the code paths a pod's
// sidecar uses (streamfs over a node store, the semantics engine).
package runner

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/nats-io/nats.go"

	"github.com/sluice-io/sluice/api/v1alpha1"

	"github.com/sluice-io/sluice/internal/objstore"
	"github.com/sluice-io/sluice/internal/pathpattern"
	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/streamfs"
	"github.com/sluice-io/sluice/internal/transport"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

// Options configure a run.
type Options struct {
	// WorkDir holds the node store, the views' mount points and the per-instance logs. Empty
	// means a new temporary directory, removed after a successful run unless Keep; a
	// relative one is taken from the current directory.
	WorkDir string
	// Keep keeps the work directory after a successful run (a failed run always keeps it).
	Keep bool
	// OutDir receives the permanent outputs when ObjStore is nil; empty means
	// ./sluice-out/<workflow>.
	OutDir string
	// ObjStore receives the permanent outputs (file:// or s3://); nil means OutDir.
	ObjStore objstore.Store
	// Timeout bounds the whole run; 0 means none.
	Timeout time.Duration
	// WaitTimeout bounds each wait on one file; 0 means the workflow's spec.waitTimeout,
	// or 1h.
	WaitTimeout time.Duration
	// SpaceWait bounds how long a write waits for space when the store is full; 0 means 10s.
	SpaceWait time.Duration
	// Passthrough says whether the views let the kernel serve committed and ungoverned
	// files from the node store itself (FUSE passthrough); the zero value is auto.
	Passthrough streamfs.PassthroughMode
	// StopGrace is how long processes get between SIGTERM and SIGKILL; 0 means 5s.
	StopGrace time.Duration
	// Progress receives the live progress view (nil: none).
	Progress Progress
	// Log receives structured log lines (failed waits, refused writes).
	Log logr.Logger
	// Env is the base environment of every process (nil: this process's environment).
	Env []string
	// Nodes is the number of node stores; instances are spread over them round-robin and
	// everything between them goes through NATS. 0 or 1: one node.
	Nodes int
	// NATSURL is the NATS server to use; empty means an embedded one (JetStream on disk
	// under the work directory) when Nodes > 1.
	NATSURL string
	// Credentials are the S3 keys of s3:// sources (spec.sources).
	Credentials objstore.Credentials
	// CountRequests counts each view's FUSE requests by opcode (InstanceReport.Requests),
	// through go-fuse's request log: slow, for measurements of what a file costs, not for
	// timing runs.
	CountRequests bool
	// StoreOnDisk keeps each node store's memory tier as a plain directory under WorkDir,
	// kept with it after the run, instead of a tmpfs of the run's own that goes with the
	// run (memtier.go): for tests that look at what the store held.
	StoreOnDisk bool
	// DeadlockGrace is how long every running instance must have waited on the rules,
	// with nothing changing, before the run fails as deadlocked (DeadlockError); 0 means
	// 3s.
	DeadlockGrace time.Duration
}

// Progress is told how a run goes.
type Progress interface {
	// Update is called about once a second with a snapshot.
	Update(s Snapshot)
	// Done is called once at the end.
	Done(s Snapshot)
}

// Snapshot is the state of a run at one moment.
type Snapshot struct {
	Workflow  string         // the workflow's name
	Elapsed   time.Duration  // since the run started
	Steps     []StepSnapshot // per step, in declaration order
	Committed int            // committed files and directories
	// BytesWritten and BytesRead sum every view's counters; BytesRead counts the reads
	// by passthrough as the size of each file opened so (Stats.BytesOpenedPassthrough).
	BytesWritten, BytesRead int64
	// StoreUsed is the bytes held in the node store.
	StoreUsed int64
}

// StepSnapshot is the state of one step.
type StepSnapshot struct {
	Name string // the step's name
	// Replicas is the number of instances; Running, Done and Failed count them by state.
	Replicas, Running, Done, Failed int
	// BytesWritten and BytesRead sum the instances' views, as Snapshot's do.
	BytesWritten, BytesRead int64
	// Blocked is the number of requests waiting on the rules now.
	Blocked int64
	// Waiting names the step's oldest wait now, with its instance and age, e.g.
	// `c[0]: open of "late.txt" (OnClose:1, Update), 3s`; empty when none waits.
	Waiting string
	oldest  time.Time
}

// Run runs wf (validated, with its compiled rules) and returns the report. The error is
// non-nil when an instance failed, the run timed out or was interrupted, or a permanent
// output could not be stored; the report is filled in as far as the run got.
//
// A workflow that Check refuses is refused before anything is created; a run that fails
// before its steps start removes the temporary work directory it created.
func Run(ctx context.Context, wf *v1alpha1.Workflow, rules *semantics.RuleSet, opts Options) (*Report, error) {
	if errs := Check(wf); len(errs) > 0 {
		return nil, fmt.Errorf("sluice run cannot run workflow %s: %w", wf.Name, errs.ToAggregate())
	}
	r, err := newRun(ctx, wf, rules, opts)
	if err != nil {
		return nil, err
	}
	return r.run(ctx)
}

type run struct {
	wf     *v1alpha1.Workflow
	rules  *semantics.RuleSet
	opts   Options
	log    logr.Logger
	tmpDir bool
	id     string // this run's own ID: its stream and bucket names carry it

	nodes      []*node
	permCtx    context.Context
	permCancel context.CancelFunc
	placement  map[string]int // "step/instance" -> node index
	memTiers   []string       // the memory tiers' tmpfs mount points (memtier.go)
	nc         *nats.Conn
	embedded   *transport.Embedded
	names      wfmeta.Names

	instances []*instance

	poisonMu sync.Mutex
	poisoned map[string]string // path -> why it can never be complete

	truthMu sync.Mutex
	tainted []TaintedResult // instances that succeeded on a withdrawn input (taint)

	releaseMu     sync.Mutex
	released      map[string]bool // Consumed files deleted from the node stores
	releasedBytes int64
}

// punch is a node's punch observer (semantics.Observer.Punch): every consumer of the
// Consumed NoUpdate file p has read past upto, so those bytes leave this node's store.
func (r *run) punch(n *node, p string, upto int64) {
	freed, err := n.Store.Punch(p, upto)
	if err != nil {
		r.log.Error(err, "releasing what every consumer has read", "path", pathpattern.Printable(p), "node", n.name)
		return
	}
	r.releaseMu.Lock()
	r.releasedBytes += freed
	r.releaseMu.Unlock()
}

// release is a node's release observer (semantics.Observer.Release): the Consumed file's
// consumers have all exited, so its bytes leave this node's store, freeing its space.
func (r *run) release(n *node, st semantics.FileStatus) {
	size, err := n.Store.Remove(st.Path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		r.log.Error(err, "deleting a consumed file", "path", pathpattern.Printable(st.Path), "node", n.name)
		return
	}
	r.releaseMu.Lock()
	defer r.releaseMu.Unlock()
	if r.released == nil {
		r.released = map[string]bool{}
	}
	r.released[st.Path] = true
	r.releasedBytes += size
}

// noteWithdrawn is every node's withdrawal observer (semantics.Observer.Withdraw): a file
// that was incomplete is gone with the failed attempt that wrote it, and a retry may
// write it whole, so it no longer fails the run (unless it is poisoned again).
func (r *run) noteWithdrawn(w *semantics.WithdrawnError) {
	r.poisonMu.Lock()
	defer r.poisonMu.Unlock()
	delete(r.poisoned, w.Path)
}

// abortReaders is node idx's withdrawal observer: a step instance of the node that
// opened the withdrawn file as an input and is still running is stopped and fails (then
// is retried by its backoffLimit, its own outputs withdrawn in turn), since what it makes
// may rest on the failed attempt's bytes. One that already finished successfully is
// tainted: its outputs are withdrawn and the run fails naming both (taint).
func (r *run) abortReaders(idx int, w *semantics.WithdrawnError) {
	for _, in := range r.instances {
		if in.node != idx || in.view == nil {
			continue
		}
		in.view.Invalidate(w.Path)
		if !in.view.OpenedInput(w.Generation) {
			continue
		}
		reason := fmt.Sprintf("its input %s was withdrawn: %s", pathpattern.Printable(w.Path), w.Reason)
		if in.abortAttempt(reason) {
			r.log.Info("stopping an instance that read a withdrawn file", "step", in.step, "instance", in.index, "path", pathpattern.Printable(w.Path))
		} else if st, _ := in.state(); st == stateSucceeded {
			r.taint(in, w)
		}
	}
}

// notePoison is every node's poison observer (semantics.Observer.Poison): the run fails
// naming the file. Every node hears of a poisoning; the first reason is kept.
func (r *run) notePoison(perr *semantics.PoisonError) {
	r.poisonMu.Lock()
	defer r.poisonMu.Unlock()
	if r.poisoned == nil {
		r.poisoned = map[string]string{}
	}
	if _, ok := r.poisoned[perr.Path]; !ok {
		r.poisoned[perr.Path] = perr.Reason
	}
}

func newRun(ctx context.Context, wf *v1alpha1.Workflow, rules *semantics.RuleSet, opts Options) (_ *run, err error) {
	if opts.WaitTimeout <= 0 {
		opts.WaitTimeout = time.Hour
		if wf.Spec.WaitTimeout != nil && wf.Spec.WaitTimeout.Duration > 0 {
			opts.WaitTimeout = wf.Spec.WaitTimeout.Duration
		}
	}
	if opts.SpaceWait <= 0 {
		opts.SpaceWait = 10 * time.Second
	}
	if opts.StopGrace <= 0 {
		opts.StopGrace = 5 * time.Second
	}
	if opts.Env == nil {
		opts.Env = os.Environ()
	}
	if opts.OutDir == "" {
		opts.OutDir = filepath.Join("sluice-out", wf.Name)
	}
	log := opts.Log
	if log.GetSink() == nil {
		log = discardLogger()
	}
	r := &run{wf: wf, rules: rules, opts: opts, log: log.WithValues("workflow", wf.Name), id: newRunID()}
	if r.opts.WorkDir != "" {
		// Steps run with their view as the working directory: a relative SLUICE_DIR (made
		// from the work directory) would name a place inside the view itself.
		abs, err := filepath.Abs(r.opts.WorkDir)
		if err != nil {
			return nil, fmt.Errorf("work directory %s: %w", r.opts.WorkDir, err)
		}
		r.opts.WorkDir = abs
		if err := r.clearWorkDir(); err != nil {
			return nil, err
		}
	}
	if r.opts.WorkDir == "" {
		d, mkErr := os.MkdirTemp("", "sluice-run-"+wf.Name+"-")
		if mkErr != nil {
			return nil, fmt.Errorf("creating work directory: %w", mkErr)
		}
		r.opts.WorkDir, r.tmpDir = d, true
		defer func() {
			if err != nil {
				os.RemoveAll(d) // a failed start leaves nothing behind
			}
		}()
	}
	for _, sub := range []string{"mounts", "logs"} {
		if err := os.MkdirAll(filepath.Join(r.opts.WorkDir, sub), 0o755); err != nil {
			return nil, fmt.Errorf("creating work directory: %w", err)
		}
	}
	if r.opts.ObjStore == nil {
		dir, err := objstore.NewDir(opts.OutDir)
		if err != nil {
			return nil, err
		}
		r.opts.ObjStore = dir
	}
	r.permCtx, r.permCancel = context.WithCancel(context.Background())
	if err := r.startNodes(ctx); err != nil {
		r.stopNodes()
		return nil, err
	}
	return r, nil
}

func (r *run) run(ctx context.Context) (rep *Report, err error) {
	if r.opts.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.opts.Timeout)
		defer cancel()
	}
	ctx, cancelRun := context.WithCancelCause(ctx)
	defer cancelRun(nil)
	start := time.Now()
	if err := r.mountViews(); err != nil {
		r.unmountAll()
		r.stopNodes()
		if r.tmpDir {
			os.RemoveAll(r.opts.WorkDir) // a failed start leaves nothing behind
		}
		return nil, err
	}
	var wg sync.WaitGroup
	for _, in := range r.instances {
		wg.Add(1)
		go func(in *instance) {
			defer wg.Done()
			r.runAttempts(ctx, in)
			r.nodes[in.node].terminate(in.step, in.index, in.failure())
		}(in)
	}
	var stageIn *InstanceReport
	var stagingIn atomic.Bool
	if len(r.wf.Spec.Sources) > 0 {
		wg.Add(1)
		stagingIn.Store(true)
		go func() {
			defer wg.Done()
			defer stagingIn.Store(false)
			ir := r.stageIn(ctx)
			stageIn = &ir
		}()
	}
	watchDone := make(chan struct{})
	var watch waitWatch
	grace := r.opts.DeadlockGrace
	if grace <= 0 {
		grace = defaultDeadlockGrace
	}
	go r.watchDeadlock(&watch, grace, stagingIn.Load, watchDone, cancelRun)
	progressDone := make(chan struct{})
	var pwg sync.WaitGroup
	if r.opts.Progress != nil {
		pwg.Add(1)
		go func() { defer pwg.Done(); r.progressLoop(start, progressDone) }()
	}
	wg.Wait()
	close(watchDone)
	settleErr := r.settle(ctx)
	// Uploads in flight end with the run's context (interrupt, timeout).
	stopPerm := context.AfterFunc(ctx, r.permCancel)
	var permErr error
	for _, n := range r.nodes {
		if err := n.Copier.Finish(ctx); err != nil && permErr == nil {
			permErr = err
		}
	}
	stopPerm()
	r.permCancel()
	if permErr == nil {
		permErr = settleErr
	}
	end := time.Now()
	close(progressDone)
	pwg.Wait()
	if r.opts.Progress != nil {
		r.opts.Progress.Done(r.snapshot(start))
	}
	rep = r.report(start, end)
	if stageIn != nil {
		rep.Instances = append([]InstanceReport{*stageIn}, rep.Instances...)
	}
	if r.nc != nil {
		mctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		md, err := r.metadata(mctx)
		cancel()
		if err != nil {
			r.log.Error(err, "reading the workflow's metadata bucket")
		}
		rep.Metadata = &MetadataReport{Files: len(md.Files), Terminations: len(md.Terminations)}
		for _, f := range md.Files {
			rep.Metadata.Bytes += f.Size
		}
	}
	r.unmountAll()
	r.stopNodes()

	var failed []string
	for _, ir := range rep.Instances {
		if ir.ExitCode != 0 || ir.Error != "" {
			failed = append(failed, ir.Name())
		}
	}
	r.poisonMu.Lock()
	for p, reason := range r.poisoned {
		rep.Incomplete = append(rep.Incomplete, IncompleteFile{Path: p, Reason: reason})
	}
	r.poisonMu.Unlock()
	sort.Slice(rep.Incomplete, func(i, j int) bool { return rep.Incomplete[i].Path < rep.Incomplete[j].Path })
	rep.Tainted = r.taintedResults()
	rep.Unmet = r.unmetOutputs(rep)
	failing := len(failed) > 0 || len(rep.Incomplete) > 0 || len(rep.Unmet) > 0 || len(rep.Tainted) > 0 || ctx.Err() != nil
	if failing {
		if err := r.removeDerived(rep); err != nil && permErr == nil {
			permErr = err
		}
	}
	var deadlock *DeadlockError
	switch {
	case errors.As(context.Cause(ctx), &deadlock):
		err = deadlock
	case ctx.Err() != nil && errors.Is(context.Cause(ctx), context.DeadlineExceeded):
		err = fmt.Errorf("workflow %s timed out after %s", r.wf.Name, r.opts.Timeout)
		if ws := watch.snapshot(); len(ws) > 0 {
			err = fmt.Errorf("%w; waiting then:%s", err, describeWaits(ws))
		}
	case ctx.Err() != nil:
		err = fmt.Errorf("workflow %s interrupted", r.wf.Name)
	case failing:
		err = &FailedError{Report: rep, Failed: failed}
		if permErr != nil {
			// why an output was not stored (a symlink, a failed upload) says more than
			// "nothing was stored"
			err = fmt.Errorf("%w\n\nstoring the permanent outputs: %w", err, permErr)
		}
	case permErr != nil:
		err = permErr
	}
	rep.Succeeded = err == nil
	rep.WorkDir = r.opts.WorkDir
	if err == nil && r.tmpDir && !r.opts.Keep {
		if rmErr := os.RemoveAll(r.opts.WorkDir); rmErr == nil {
			rep.WorkDir = ""
		}
	}
	return rep, err
}

// runAttempts runs the instance until an attempt succeeds or its step's backoffLimit
// retries are spent (as the controller does on a cluster). After every attempt, once the
// kernel has released its write handles (so its closes are in), a failed attempt
// withdraws the files it wrote (streamfs.View.Withdraw): a retry writes them anew, and
// no reader opens what the failed attempt left.
func (r *run) runAttempts(ctx context.Context, in *instance) {
	limit := 0
	if in.spec.BackoffLimit != nil {
		limit = int(*in.spec.BackoffLimit)
	}
	for attempt := 0; ; attempt++ {
		actx, stop := context.WithCancel(ctx)
		in.mu.Lock()
		in.stop, in.aborted = stop, ""
		in.mu.Unlock()
		in.run(actx)
		stop()
		in.mu.Lock()
		if in.aborted != "" {
			in.st, in.err = stateFailed, in.aborted
			if in.exitCode == 0 {
				in.exitCode = -1
			}
		}
		in.mu.Unlock()
		wctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := in.view.WaitWritersClosed(wctx); err != nil {
			r.log.Info("instance exited with write handles open", "step", in.step, "instance", in.index, "err", err.Error())
		}
		cancel()
		code, msg := in.exit()
		if code == 0 && msg == "" {
			return
		}
		why := fmt.Sprintf("exit code %d", code)
		if msg != "" {
			why = msg
		}
		reason := fmt.Sprintf("attempt %d of step %s instance %d, which wrote it, failed (%s)", attempt+1, in.step, in.index, why)
		paths, err := in.view.Withdraw(reason)
		if err != nil {
			r.log.Error(err, "withdrawing a failed attempt's outputs", "step", in.step, "instance", in.index)
		}
		in.mu.Lock()
		in.withdrawn = append(in.withdrawn, paths...)
		in.mu.Unlock()
		if attempt >= limit || ctx.Err() != nil {
			return
		}
		// An attempt that failed because an input was withdrawn (its read got EIO) may
		// end before the withdrawal's observer (abortReaders) has run; let it run first,
		// or it would stop the retry, which has not read the withdrawn bytes.
		if err := r.nodes[in.node].Engine.Quiesce(ctx); err != nil {
			return
		}
		r.log.Info("retrying a failed instance", "step", in.step, "instance", in.index,
			"attempt", attempt+2, "of", limit+1, "reason", why)
	}
}

// mountViews mounts one view per step instance and prepares its processes.
func (r *run) mountViews() error {
	for _, s := range r.wf.Spec.Steps {
		replicas := 1
		if s.Replicas != nil {
			replicas = int(*s.Replicas)
		}
		if s.Template == nil {
			return fmt.Errorf("step %s has no pod template: sluice run needs the programs to run", s.Name)
		}
		for i := 0; i < replicas; i++ {
			name := fmt.Sprintf("%s-%d", s.Name, i)
			nd := r.nodeOfInstance(s.Name, i)
			mnt := filepath.Join(r.opts.WorkDir, "mounts", name)
			if err := os.MkdirAll(mnt, 0o755); err != nil {
				return fmt.Errorf("creating mount point: %w", err)
			}
			vo := streamfs.Options{
				Step: s.Name, Instance: i, WaitTimeout: r.opts.WaitTimeout, Passthrough: r.opts.Passthrough,
				Log: r.log.WithValues("step", s.Name, "instance", i, "node", r.nodes[nd].name),
			}
			var requests *streamfs.RequestCounter
			if r.opts.CountRequests {
				requests = &streamfs.RequestCounter{}
				vo.RequestLog = requests
			}
			v, err := streamfs.Mount(mnt, r.nodes[nd].Store, r.nodes[nd].Semantics(), vo)
			if err != nil {
				return err
			}
			r.instances = append(r.instances, &instance{
				r: r, step: s.Name, index: i, replicas: replicas, spec: s, node: nd,
				view: v, logPath: filepath.Join(r.opts.WorkDir, "logs", name+".log"), requests: requests,
			})
		}
	}
	return nil
}

func (r *run) unmountAll() {
	for _, in := range r.instances {
		if err := in.view.Unmount(); err != nil {
			r.log.Error(err, "unmount failed", "mountpoint", in.view.Mountpoint())
		}
	}
}

func (r *run) progressLoop(start time.Time, done <-chan struct{}) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
			r.opts.Progress.Update(r.snapshot(start))
		}
	}
}

func (r *run) snapshot(start time.Time) Snapshot {
	s := Snapshot{Workflow: r.wf.Name, Elapsed: time.Since(start), Committed: r.committed()}
	for _, n := range r.nodes {
		s.StoreUsed += n.Store.Used()
	}
	index := map[string]int{}
	for _, in := range r.instances {
		k, ok := index[in.step]
		if !ok {
			k = len(s.Steps)
			index[in.step] = k
			s.Steps = append(s.Steps, StepSnapshot{Name: in.step, Replicas: in.replicas})
		}
		ss := &s.Steps[k]
		switch state, _ := in.state(); state {
		case stateRunning:
			ss.Running++
		case stateSucceeded:
			ss.Done++
		case stateFailed:
			ss.Failed++
		}
		st := in.view.Stats()
		ss.BytesWritten += st.BytesWritten
		ss.BytesRead += st.BytesRead + st.BytesOpenedPassthrough
		ss.Blocked += st.Blocked
		if len(st.Waits) > 0 && (ss.oldest.IsZero() || st.Waits[0].Since.Before(ss.oldest)) {
			w := st.Waits[0]
			ss.oldest = w.Since
			ss.Waiting = fmt.Sprintf("%s[%d]: %s, %s", in.step, in.index, w.What, time.Since(w.Since).Round(time.Second))
		}
		s.BytesWritten += st.BytesWritten
		s.BytesRead += st.BytesRead + st.BytesOpenedPassthrough
	}
	return s
}

func discardLogger() logr.Logger { return logr.Discard() }

// committed returns the number of committed paths: the most any node has seen.
func (r *run) committed() int {
	most := 0
	for _, n := range r.nodes {
		if c := n.Engine.Counters(); c > most {
			most = c
		}
	}
	return most
}

// FailedError is returned when step instances failed or files are incomplete (a write to
// them failed); its message names them, with the last lines of the instances' logs and
// the reason of each incomplete file.
type FailedError struct {
	Report *Report  // the run's report
	Failed []string // the failed instances, as step[i]
}

func (e *FailedError) Error() string {
	var b strings.Builder
	what := slices.Clone(e.Failed)
	for _, f := range e.Report.Incomplete {
		what = append(what, "incomplete file "+pathpattern.Printable(f.Path))
	}
	for _, u := range e.Report.Unmet {
		what = append(what, "missing output "+pathpattern.Printable(u.Path))
	}
	for _, t := range e.Report.Tainted {
		what = append(what, t.Instance+" read withdrawn "+pathpattern.Printable(t.Input))
	}
	fmt.Fprintf(&b, "workflow %s failed: %s", e.Report.Workflow, strings.Join(what, ", "))
	for _, f := range e.Report.Incomplete {
		fmt.Fprintf(&b, "\n\n%s: never committed nor stored: %s", pathpattern.Printable(f.Path), f.Reason)
	}
	for _, u := range e.Report.Unmet {
		fmt.Fprintf(&b, "\n\n%s: declared output of %s, which succeeded: %s", pathpattern.Printable(u.Path), strings.Join(u.Steps, ", "), u.Reason)
	}
	for _, t := range e.Report.Tainted {
		fmt.Fprintf(&b, "\n\n%s: succeeded on %s, withdrawn since (%s); its outputs were withdrawn too: %s",
			t.Instance, pathpattern.Printable(t.Input), t.Reason, strings.Join(t.Withdrawn, ", "))
	}
	if len(e.Report.Removed) > 0 {
		b.WriteString("\n\nremoved from the stored outputs, as they may rest on what failed:")
		for _, o := range e.Report.Removed {
			fmt.Fprintf(&b, "\n  %s (%s)", pathpattern.Printable(o.Path), o.Reason)
		}
	}
	sort.Strings(e.Failed)
	for _, ir := range e.Report.Instances {
		if ir.ExitCode == 0 && ir.Error == "" {
			continue
		}
		fmt.Fprintf(&b, "\n\n%s: ", ir.Name())
		if ir.Error != "" {
			b.WriteString(ir.Error)
		} else {
			fmt.Fprintf(&b, "exit code %d", ir.ExitCode)
		}
		fmt.Fprintf(&b, "; last lines of %s:\n%s", ir.Log, tail(ir.Log, 10))
		for _, rf := range slices.Compact(slices.Clone(ir.Refused)) {
			fmt.Fprintf(&b, "\n  (the view refused a %s)", rf)
		}
	}
	return b.String()
}

// workDirParts are what a run keeps in its work directory: the node store and its disk
// tier (one node), the node stores (several), the embedded NATS server's JetStream, the
// views' mount points and the per-instance logs.
var workDirParts = []string{"store", "disk", "nodes", "jetstream", "mounts", "logs"}

// clearWorkDir empties a reused work directory of what an earlier run left, so that no
// byte, event or log of it reaches this run (a step appending to a file would otherwise
// append to the earlier run's file, and that would be stored as the permanent output).
// Mounts left by a runner that was killed are detached first. Other files are left alone.
func (r *run) clearWorkDir() error {
	detached, err := streamfs.DetachStale(filepath.Join(r.opts.WorkDir, "mounts"))
	if err != nil {
		return err
	}
	tiers, err := detachStaleTiers(r.opts.WorkDir)
	if err != nil {
		return err
	}
	for _, mp := range append(detached, tiers...) {
		r.log.Info("detached a stale mount left by an earlier run", "mountpoint", mp)
	}
	for _, part := range workDirParts {
		p := filepath.Join(r.opts.WorkDir, part)
		if _, err := os.Lstat(p); errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err := os.RemoveAll(p); err != nil {
			return fmt.Errorf("clearing the earlier run's %s from the work directory %s: %w", part, r.opts.WorkDir, err)
		}
		r.log.Info("cleared what an earlier run left in the work directory", "path", p)
	}
	return nil
}

// newRunID returns 8 random hexadecimal characters naming one run.
func newRunID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
