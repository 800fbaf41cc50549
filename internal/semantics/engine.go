package semantics

import (
	"sync"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/byterange"
	"github.com/sluice-io/sluice/internal/inflight"
	"github.com/sluice-io/sluice/internal/pathpattern"
)

// FileStatus is a snapshot of one path as the engine sees it.
type FileStatus struct {
	Resolution
	// Exists is true once the file or directory has been created.
	Exists bool
	// IsDir is true for directories.
	IsDir bool
	// Committed is true once the commit rule held; the file then never changes.
	Committed bool
	// Size is the size written so far in bytes (the end of the furthest write), or the
	// final size after commit.
	Size int64
	// Closes counts closes of descriptors opened for writing, summed over writers.
	Closes int
	// Entries counts a directory's entries; CommittedEntries those committed.
	Entries, CommittedEntries int
	// ProducersExited is true once every producer instance of the path has exited: a
	// path that does not exist by then never will.
	ProducersExited bool
	// Opened is true once a reader opened the file through a view of this node.
	Opened bool
	// Released is true once a committed Consumed file's consumers have all exited and
	// its bytes may be deleted from every node store (Observer.Release).
	Released bool
	// Generation identifies this file among every file that had its name on this node:
	// it changes when the file is withdrawn (Engine.Withdraw) or renamed away and the name
	// made again. 0 for a path the engine has no record of.
	Generation uint64
}

// fileState is the engine's record of one governed path. Guarded by Engine.mu.
type fileState struct {
	// path is the file's cleaned path; res its resolution, shared by every file of the
	// same rule and directory (Engine.resolution), with an empty Path.
	path      string
	res       *Resolution
	exists    bool
	isDir     bool
	committed bool
	// opened is set once a reader opened the file through a view of this node
	// (NoteOpened).
	opened  bool
	size    int64
	written byterange.Set
	closes  int
	// changed is closed on the next change, waking the waiters, and made anew by the
	// next waiter (waitCh): nil while nobody waits, so that the files nobody waits on (most
	// of a workflow's, once committed) hold no channel and a change makes none.
	changed chan struct{}
	// gen is the record's Generation.
	gen uint64
	// x holds what only some records need (directories, Consumed files, failed or
	// poisoned ones): nil for the plain files that are most of a workflow's, so that
	// their record stays small (issue 41: memory per file). Read it through the getters
	// below, which treat nil as empty; more allocates it.
	x *fileExtra
}

// fileExtra is the part of a file's record that most files never need (fileState.x).
type fileExtra struct {
	// directories: names of entries, and how many of them are committed
	entries          map[string]bool
	committedEntries int
	// failed, once set, ends every wait on the path (see Fail).
	failed error
	// poison, once set, keeps the file from committing and ends every wait on it (see
	// Poison); a truncation to 0 bytes clears it.
	poison error
	// consumers are the steps that declare the file as an input, for a Consumed file;
	// released is set once they have all exited (maybeRelease).
	consumers []string
	released  bool
	// progress is how far each consumer instance ("step/instance") has read a Consumed
	// NoUpdate file contiguously from its start; punched is where the bytes before were
	// released (maybePunch).
	progress map[string]int64
	// finished are the consumer instances ("step/instance") that read the committed file
	// to its end and closed it (ReadToEnd).
	finished map[string]bool
	punched  int64
}

// more returns the record's fileExtra, allocating it at first use.
func (fs *fileState) more() *fileExtra {
	if fs.x == nil {
		fs.x = &fileExtra{}
	}
	return fs.x
}

// poisoned returns the file's poison (see Poison), or nil.
func (fs *fileState) poisoned() error {
	if fs.x == nil {
		return nil
	}
	return fs.x.poison
}

// failure returns the error the file was marked with by Fail, or nil.
func (fs *fileState) failure() error {
	if fs.x == nil {
		return nil
	}
	return fs.x.failed
}

// consumerSteps returns the steps that declare a Consumed file as an input, or nil.
func (fs *fileState) consumerSteps() []string {
	if fs.x == nil {
		return nil
	}
	return fs.x.consumers
}

// isReleased reports whether a Consumed file was released (maybeRelease).
func (fs *fileState) isReleased() bool { return fs.x != nil && fs.x.released }

// punchedTo returns where the bytes before were released (maybePunch), or 0.
func (fs *fileState) punchedTo() int64 {
	if fs.x == nil {
		return 0
	}
	return fs.x.punched
}

// entryCounts returns a directory's entries and how many of them are committed (0, 0
// for a file).
func (fs *fileState) entryCounts() (entries, committed int) {
	if fs.x == nil {
		return 0, 0
	}
	return len(fs.x.entries), fs.x.committedEntries
}

// notify wakes whoever waits on the file's next change. Called with the engine's lock.
func (fs *fileState) notify() {
	if fs.changed != nil {
		close(fs.changed)
		fs.changed = nil
	}
}

// waitCh returns a channel closed at the file's next change (notify). Called with the
// engine's lock.
func (fs *fileState) waitCh() <-chan struct{} {
	if fs.changed == nil {
		fs.changed = make(chan struct{})
	}
	return fs.changed
}

// Engine is the per-workflow state machine of the CAPIO-CL semantics. It is fed events
// (created, written, closed, renamed, instance terminated) and answers whether a reader may
// open a path, how many bytes it may read and whether a directory listing is complete. Its
// waits are woken by events, never by polling. All methods are safe for concurrent use.
//
// Paths given to the Engine are cleaned paths (pathpattern.Clean); events on paths no rule
// governs return ErrNotGoverned and change nothing.
type Engine struct {
	rules *RuleSet

	mu    sync.Mutex
	files map[string]*fileState
	// resolutions are the resolutions the files share (resolution).
	resolutions map[resolutionKey]*Resolution
	terminated  map[string]map[int]bool
	// failures holds, for the terminated instances that failed with no retries left
	// (TerminateFailed), how each failed.
	failures map[string]map[int]string
	// pending holds uncommitted files whose commit depends on something other than their
	// own events: OnTermination (instances exiting) and OnFile (other files committing).
	pending   map[*fileState]struct{}
	committed int
	// observers are told of every update's changes (Observe, finish).
	observers []Observer
	// lastGen is the last Generation given; withdrawn holds why each withdrawn
	// generation was withdrawn (Withdraw), for the readers that still hold it.
	lastGen   uint64
	withdrawn map[uint64]*WithdrawnError
	// consumed lists the records of Consumed files not released yet.
	consumed map[*fileState]struct{}
	// observing counts the batches whose observers are being called (finish), for
	// Quiesce.
	observing inflight.Count
	// changes is closed, and replaced, at every creation, commit, withdrawal, poisoning
	// and termination the engine records (AnyChange).
	changes chan struct{}
}

// NewEngine returns an engine for the workflow whose rules are rs.
func NewEngine(rs *RuleSet) *Engine {
	return &Engine{
		rules:      rs,
		files:      map[string]*fileState{},
		terminated: map[string]map[int]bool{},
		failures:   map[string]map[int]string{},
		pending:    map[*fileState]struct{}{},
		withdrawn:  map[uint64]*WithdrawnError{},
		consumed:   map[*fileState]struct{}{},
		changes:    make(chan struct{}),
	}
}

// Rules returns the engine's rule set.
func (e *Engine) Rules() *RuleSet { return e.rules }

// state returns the record of p, creating it when a rule governs p; nil otherwise.
// Called with e.mu held.
func (e *Engine) state(p string) *fileState {
	if fs, ok := e.files[p]; ok {
		return fs
	}
	res := e.rules.Resolve(p)
	if res.Rule == nil {
		return nil
	}
	e.lastGen++
	fs := &fileState{path: p, res: e.resolution(res), gen: e.lastGen}
	if res.Dir == "" && res.Rule.Type == v1alpha1.FileTypeDirectory {
		fs.isDir = true
		fs.more().entries = map[string]bool{}
	}
	e.files[p] = fs
	if res.Dir == "" && res.Rule.Lifetime == v1alpha1.LifetimeConsumed {
		fs.more().consumers = e.rules.Consumers(p)
		e.consumed[fs] = struct{}{}
	}
	if fs.res.Commit == v1alpha1.CommitOnTermination || fs.res.Commit == v1alpha1.CommitOnFile ||
		fs.isDir && fs.res.Commit == v1alpha1.CommitOnClose {
		e.pending[fs] = struct{}{}
	}
	return fs
}

func (e *Engine) snapshot(fs *fileState) FileStatus {
	entries, committedEntries := fs.entryCounts()
	st := FileStatus{
		Resolution: fs.resolution(), Exists: fs.exists, IsDir: fs.isDir, Committed: fs.committed,
		Size: fs.size, Closes: fs.closes, Entries: entries, CommittedEntries: committedEntries,
		ProducersExited: e.producersGone(fs),
		Opened:          fs.opened,
		Generation:      fs.gen,
		Released:        fs.isReleased(),
	}
	return st
}

// resolution returns the file's resolution, with its path.
func (fs *fileState) resolution() Resolution {
	r := *fs.res
	r.Path = fs.path
	return r
}

// resolutionKey is what a resolution depends on besides its path.
type resolutionKey struct {
	rule *Rule
	dir  string
}

// resolution returns the interned copy of res without its path: the files of one rule
// (and, for a Directory rule, one directory) share it, so that a file's record holds a
// pointer, not a copy of the rule's effective commit and firing rules. Called with e.mu
// held.
func (e *Engine) resolution(res Resolution) *Resolution {
	k := resolutionKey{rule: res.Rule, dir: res.Dir}
	if r, ok := e.resolutions[k]; ok {
		return r
	}
	res.Path = ""
	r := &res
	if e.resolutions == nil {
		e.resolutions = map[resolutionKey]*Resolution{}
	}
	e.resolutions[k] = r
	return r
}

// Status returns a snapshot of p. A path no rule governs has Governed() false.
func (e *Engine) Status(p string) FileStatus {
	e.mu.Lock()
	defer e.mu.Unlock()
	if fs, ok := e.files[p]; ok {
		return e.snapshot(fs)
	}
	st := FileStatus{Resolution: e.rules.Resolve(p)}
	if st.Rule != nil {
		st.ProducersExited = e.exited(st.Rule) >= st.Rule.Instances
	}
	return st
}

// Visible reports whether the entry child of a governed directory is listed to readers now:
// under NoUpdate as soon as it exists, under Update once it is committed. Paths no rule
// governs are always visible.
func (e *Engine) Visible(child string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	fs, ok := e.files[child]
	if !ok {
		return e.rules.Resolve(child).Rule == nil
	}
	if !fs.exists {
		return false
	}
	fire := fs.res.Fire
	if parent, ok := e.files[pathpattern.Parent(child)]; ok && parent.isDir {
		fire = parent.res.Fire
	}
	return fire == v1alpha1.FireNoUpdate || fs.committed
}

// Counters returns the number of committed paths.
func (e *Engine) Counters() (committed int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.committed
}

// PendingListing returns the producer steps, in declaration order (the stage-in step of
// spec.sources last), that may still make an entry of directory dir that step declares
// as an input, and have instances that have not exited: the rules whose pattern can match
// a path under dir (not dir itself), that step consumes and does not produce
// (RuleSet.ListingRules). A consumer's listing of dir is complete once none is left
// (docs/semantics.md, "Listings"). Empty when dir is not such a directory.
func (e *Engine) PendingListing(dir, step string) []string {
	rules := e.rules.ListingRules(dir, step)
	if len(rules) == 0 {
		return nil
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, name := range e.rules.producerOrder() {
		for _, r := range rules {
			if r.producedBy(name) {
				if len(e.terminated[name]) < e.rules.steps[name].Replicas {
					out = append(out, name)
				}
				break
			}
		}
	}
	return out
}

// AnyChange returns a channel that is closed at the next creation, commit, withdrawal,
// poisoning or step instance termination the engine records, on any path, and at the
// creation of a plain directory that governed files will live in (RuleSet.ImpliedDir):
// what a listing of a plain directory, and a lookup of one not made yet, wait for
// (PendingListing).
func (e *Engine) AnyChange() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.changes
}

// broadcast wakes AnyChange's waiters. Called with e.mu held.
func (e *Engine) broadcast() {
	close(e.changes)
	e.changes = make(chan struct{})
}

// Changed returns a channel closed at the next change of p (nil for a path no rule
// governs), for callers that multiplex a wait with other events.
func (e *Engine) Changed(p string) <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	if fs := e.state(p); fs != nil {
		return fs.waitCh()
	}
	return nil
}
