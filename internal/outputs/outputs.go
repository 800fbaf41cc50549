// Package outputs stores a node's permanent files in object storage as they commit (once,
// by the file's home node) and records every committed file's size and SHA-256 in the
// workflow's KV bucket. `sluice run` and the sidecar both use it.
package outputs

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/objstore"
	"github.com/sluice-io/sluice/internal/pathpattern"
	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/store"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

// Output is one permanent output stored.
type Output struct {
	// Path is the file's volume path.
	Path string `json:"path"`
	// URI is where it was stored (file:///... or s3://...).
	URI string `json:"uri"`
	// Size is in bytes.
	Size int64 `json:"size"`
	// SHA256 is the hex digest of what was stored, equal to the committed file's.
	SHA256 string `json:"sha256"`
	// Node is the node that stored it (the file's home node), with more than one node.
	Node string `json:"node,omitempty"`
}

// Copier handles the files a node is home for as they commit, on one worker goroutine
// so that the producer's close never waits: it stores permanent files in object storage
// (parts of one upload go in parallel) and, with a transport, records every committed
// file's size in the workflow's KV bucket, with the SHA-256 of a permanent one. Register
// its Committed and Created methods as the engine's observers.
type Copier struct {
	st    *store.Store
	rules *semantics.RuleSet
	obj   objstore.Store
	log   logr.Logger
	ctx   context.Context
	home  func(p string) bool // whether this node stores p
	meta  Recorder            // records commits in the KV bucket; nil without transport
	node  string              // this node's name

	mu sync.Mutex
	// streaming are the permanent NoUpdate files uploaded while written.
	streaming map[string]*stream
	// withdrawn are the generations withdrawn while their upload ran (Withdrawn).
	withdrawn map[uint64]bool
	uploads   sync.WaitGroup
	engine    *semantics.Engine
	// pending are committed files not stored or recorded yet, in commit order; wake
	// tells loop there are some (or that the copier closed). Committed runs on FUSE
	// requests (a writer's RELEASE) and must never block, so the list is unbounded.
	pending  []work
	wake     chan struct{}
	done     chan struct{}
	outputs  []Output
	errs     []error
	closed   bool
	inFlight int // uploads running now
	failures []Failure
}

// stream is an upload of a permanent NoUpdate file while it is written.
type stream struct {
	gen  uint64 // the file's Generation
	done bool   // the upload ended
}

// work is one item of the copier's loop: a commit to store and record, or a withdrawal
// to undo.
type work struct {
	commit   semantics.FileStatus
	withdraw *semantics.WithdrawnError
}

// Failure is an upload that failed.
type Failure struct {
	Err string    // what failed and why
	At  time.Time // when
}

// maxFailures bounds UploadStats.Failures.
const maxFailures = 20

// fail records an upload's failure err; called with c.mu held.
func (c *Copier) fail(err error) {
	c.errs = append(c.errs, err)
	c.failures = append(c.failures, Failure{Err: err.Error(), At: time.Now()})
	if len(c.failures) > maxFailures {
		c.failures = slices.Delete(c.failures, 0, len(c.failures)-maxFailures)
	}
}

// UploadStats counts a copier's work on permanent outputs.
type UploadStats struct {
	// InProgress counts uploads running now.
	InProgress int
	// Stored counts the outputs stored and Bytes their bytes.
	Stored int
	Bytes  int64
	// Failed counts the uploads that failed; Failures are the most recent of them, oldest
	// first.
	Failed   int
	Failures []Failure
}

// Stats returns the copier's upload counters.
func (c *Copier) Stats() UploadStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := UploadStats{InProgress: c.inFlight, Stored: len(c.outputs), Failed: len(c.errs), Failures: slices.Clone(c.failures)}
	for _, o := range c.outputs {
		s.Bytes += o.Size
	}
	return s
}

// started and ended bracket one upload (the counters of Stats).
func (c *Copier) started() { c.mu.Lock(); c.inFlight++; c.mu.Unlock() }
func (c *Copier) ended()   { c.mu.Lock(); c.inFlight--; c.mu.Unlock() }

// Recorder is what a Copier needs of its node's transport peer (*transport.Peer): its
// name, a place to record and forget committed files (the workflow's KV bucket), and the
// bytes of a file written on another node.
type Recorder interface {
	// Name is the peer's name, recorded as a file's home.
	Name() string
	// RecordCommit records a committed file's size, home and, for a permanent file, its
	// checksum.
	RecordCommit(ctx context.Context, m wfmeta.FileMeta) error
	// ForgetCommit removes the record of p.
	ForgetCommit(ctx context.Context, p string) error
	// Fetch returns once bytes [off, end) of p are in the node store.
	Fetch(ctx context.Context, p string, off, end int64) error
}

// Config configures a Copier.
type Config struct {
	// Node names the copier's node in reports (empty on a single node).
	Node string
	// Engine is the node's engine, Store its node store, Rules the workflow's rules.
	Engine *semantics.Engine
	Store  *store.Store
	Rules  *semantics.RuleSet
	// Objects is where permanent files go.
	Objects objstore.Store
	// Log receives a line per stored file and per failure.
	Log logr.Logger
	// Home says whether this node stores the file p (semantics.RuleSet.Home).
	Home func(p string) bool
	// Meta is the node's transport peer; nil without transport (a single node).
	Meta Recorder
}

// New starts the copier of one node as cfg says. Uploads end when ctx does.
func New(ctx context.Context, cfg Config) *Copier {
	c := &Copier{node: cfg.Node, engine: cfg.Engine, st: cfg.Store, rules: cfg.Rules, obj: cfg.Objects, log: cfg.Log, ctx: ctx,
		home: cfg.Home, meta: cfg.Meta, streaming: map[string]*stream{}, withdrawn: map[uint64]bool{}, wake: make(chan struct{}, 1), done: make(chan struct{})}
	go c.loop()
	return c
}

// Created is the engine's creation observer (semantics.Observer.Create): a permanent NoUpdate file is uploaded while
// it is written when the object store can (S3 multipart, part by part as bytes are
// final), so that the upload ends right after the commit.
func (c *Copier) Created(s semantics.FileStatus) {
	if s.IsDir || !c.rules.IsPermanent(s.Path) || s.Fire != v1alpha1.FireNoUpdate || !c.home(s.Path) {
		return
	}
	streamer, ok := c.obj.(objstore.Streamer)
	if !ok {
		return
	}
	c.mu.Lock()
	if _, ok := c.streaming[s.Path]; c.closed || ok {
		c.mu.Unlock()
		return
	}
	up := &stream{gen: s.Generation}
	c.streaming[s.Path] = up
	c.uploads.Add(1)
	c.mu.Unlock()
	go func() {
		defer c.uploads.Done()
		c.started()
		src, done, err := c.openStored(s.Path)
		var o objstore.Object
		if err == nil {
			o, err = streamer.PutGrowing(c.ctx, s.Path, growing{path: s.Path, src: src, engine: c.engine, gen: s.Generation, meta: c.meta})
			done()
		}
		c.ended()
		c.mu.Lock()
		defer c.mu.Unlock()
		up.done = true
		if c.withdrawn[s.Generation] {
			// Its attempt failed while it was uploaded: the upload was aborted, or, had it
			// completed first, what it stored is taken back.
			delete(c.withdrawn, s.Generation)
			if err == nil {
				c.pending = append(c.pending, work{withdraw: &semantics.WithdrawnError{Path: s.Path, Reason: "its attempt failed while it was stored"}})
				c.signal()
			}
			return
		}
		if err != nil {
			err = fmt.Errorf("storing permanent output %s: %w", s.Path, err)
			c.fail(err)
			c.log.Error(err, "uploading a permanent output while it was written failed", "path", s.Path)
			return
		}
		c.outputs = append(c.outputs, Output{Path: s.Path, URI: o.URI, Size: o.Size, SHA256: o.SHA256, Node: c.node})
	}()
}

// growing adapts a file of the node's store being written to objstore.Growing; gen is
// the Generation of the file (a withdrawal ends the upload).
type growing struct {
	path, src string
	engine    *semantics.Engine
	gen       uint64
	meta      Recorder // when set, bytes written on other nodes are fetched
}

func (g growing) Path() string { return g.src }

func (g growing) Wait(ctx context.Context, off int64) (int64, bool, error) {
	n, eof, err := g.engine.WaitRead(ctx, g.path, g.gen, off)
	if err == nil && n > 0 && g.meta != nil {
		err = g.meta.Fetch(ctx, g.path, off, off+n)
	}
	return n, eof, err
}

// Committed is the engine's commit observer (semantics.Observer.Commit): it queues the file for
// storing (if permanent) and recording.
func (c *Copier) Committed(s semantics.FileStatus) {
	if s.IsDir || !s.Exists || !(c.rules.IsPermanent(s.Path) || c.meta != nil) || !c.home(s.Path) {
		return
	}
	c.mu.Lock()
	if _, streamed := c.streaming[s.Path]; c.closed || streamed && c.meta == nil { // the upload in progress stores it
		c.mu.Unlock()
		return
	}
	c.pending = append(c.pending, work{commit: s})
	c.mu.Unlock()
	c.signal()
}

// Withdrawn is the engine's withdrawal observer (semantics.Observer.Withdraw): a file its attempt's
// failure took back is not stored, and what was stored of it is removed (docs/
// semantics.md, "A failed attempt withdraws its outputs"). Commits queued before it are
// handled first, so the object of the failed attempt is removed before a retry's is
// stored. It never blocks.
func (c *Copier) Withdrawn(w *semantics.WithdrawnError) {
	if !c.rules.IsPermanent(w.Path) && c.meta == nil || !c.home(w.Path) {
		return
	}
	c.mu.Lock()
	if up, ok := c.streaming[w.Path]; ok {
		delete(c.streaming, w.Path)
		if !up.done {
			// The upload in progress ends with the withdrawal (its wait fails) and
			// takes back what it stored, should it have completed first.
			c.withdrawn[up.gen] = true
			c.mu.Unlock()
			return
		}
	}
	if c.closed {
		c.mu.Unlock()
		return
	}
	// Its commit, if still queued, is not stored at all.
	c.pending = slices.DeleteFunc(c.pending, func(x work) bool { return x.withdraw == nil && x.commit.Path == w.Path })
	c.pending = append(c.pending, work{withdraw: w})
	c.mu.Unlock()
	c.signal()
}

// signal wakes loop without blocking.
func (c *Copier) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// next returns the oldest pending commit, waiting for one; ok is false once the copier
// is closed and nothing is pending.
func (c *Copier) next() (w work, ok bool) {
	for {
		c.mu.Lock()
		if len(c.pending) > 0 {
			w = c.pending[0]
			c.pending[0] = work{}
			c.pending = c.pending[1:]
			c.mu.Unlock()
			return w, true
		}
		closed := c.closed
		c.mu.Unlock()
		if closed {
			return w, false
		}
		<-c.wake
	}
}

func (c *Copier) loop() {
	defer close(c.done)
	for {
		w, ok := c.next()
		if !ok {
			return
		}
		if w.withdraw != nil {
			c.undo(w.withdraw)
			continue
		}
		s := w.commit
		p := s.Path
		meta := wfmeta.FileMeta{Path: p, Size: s.Size, Closes: s.Closes}
		var err error
		c.mu.Lock()
		_, streamed := c.streaming[p]
		c.mu.Unlock()
		if c.rules.IsPermanent(p) && !streamed {
			var o Output
			o, err = c.copy(p)
			if err != nil && c.engine.Status(p).Generation != s.Generation {
				// Withdrawn while it was being stored: nothing of it is to be kept.
				c.log.V(1).Info("a permanent output was withdrawn before it was stored", "path", p)
				continue
			}
			c.mu.Lock()
			if err != nil {
				c.fail(err)
				c.log.Error(err, "storing permanent output failed", "path", p)
			} else {
				c.outputs = append(c.outputs, o)
				c.log.V(1).Info("stored permanent output", "path", p, "uri", o.URI, "bytes", o.Size)
			}
			c.mu.Unlock()
			meta.SHA256, meta.URI, meta.Size = o.SHA256, o.URI, o.Size
		} else if c.rules.IsPermanent(p) {
			// Uploaded while written (NoUpdate): the record carries the digest of the
			// committed bytes, which the upload could not know until the end.
			if src, done, perr := c.openStored(p); perr == nil {
				meta.Size, meta.SHA256, err = objstore.FileSHA256(c.ctx, src)
				done()
			}
		}
		// A temporary file's record carries its size and no digest: nothing reads one,
		// and hashing every byte that crosses nodes cost the home node a SHA-256 pass
		// over each file (docs/transport.md, "Measured").
		if c.meta != nil && err == nil {
			meta.Home = c.meta.Name()
			if err := c.meta.RecordCommit(c.ctx, meta); err != nil {
				c.log.Error(err, "recording a commit", "path", p)
			}
		}
	}
}

// undo takes back what the copier did for a withdrawn file: its stored object is removed
// (when the object store can remove, see remover) and dropped from Results, and its
// commit record is deleted from the KV bucket.
func (c *Copier) undo(w *semantics.WithdrawnError) {
	p := w.Path
	if c.rules.IsPermanent(p) {
		c.mu.Lock()
		stored := slices.ContainsFunc(c.outputs, func(o Output) bool { return o.Path == p })
		c.outputs = slices.DeleteFunc(c.outputs, func(o Output) bool { return o.Path == p })
		c.mu.Unlock()
		if rm, ok := c.obj.(remover); ok && stored {
			if err := rm.Remove(c.ctx, p); err != nil {
				c.mu.Lock()
				c.fail(fmt.Errorf("removing withdrawn permanent output %s: %w", pathpattern.Printable(p), err))
				c.mu.Unlock()
			} else {
				c.log.Info("removed a withdrawn permanent output", "path", pathpattern.Printable(p), "uri", c.obj.URI(p), "reason", w.Reason)
			}
		}
	}
	if c.meta != nil {
		if err := c.meta.ForgetCommit(c.ctx, p); err != nil {
			c.log.Error(err, "deleting a withdrawn file's commit record", "path", pathpattern.Printable(p))
		}
	}
}

// remover is an object store that can take an object back (objstore.Dir, objstore.S3).
type remover interface {
	// Remove deletes the object under key; a missing object is not an error.
	Remove(ctx context.Context, key string) error
}

// copy stores one committed file.
func (c *Copier) copy(p string) (Output, error) {
	src, done, err := c.openStored(p)
	if err != nil {
		return Output{}, fmt.Errorf("storing permanent output %s: %w", p, err)
	}
	defer done()
	c.started()
	defer c.ended()
	o, err := c.obj.Put(c.ctx, p, src)
	if err != nil {
		return Output{}, fmt.Errorf("storing permanent output %s: %w", p, err)
	}
	return Output{Path: p, URI: o.URI, Size: o.Size, SHA256: o.SHA256, Node: c.node}, nil
}

// openStored opens the regular file p of the node store, resolved beneath the store's
// root with no symlink followed anywhere (store.Store.Open), and returns a path naming
// exactly that open file (/proc/self/fd/N: reopening it opens the same inode, whatever
// happens to the name since) and the function that closes it. A symlink or any other
// non-regular file is refused: only regular files' bytes are stored, and a step that
// renames a symlink onto a permanent output's name never gets its target uploaded.
func (c *Copier) openStored(p string) (string, func(), error) {
	if c.meta != nil {
		// Written on another node: its bytes are fetched first (transport.Peer.Fetch).
		if err := c.meta.Fetch(c.ctx, p, 0, c.engine.Status(p).Size); err != nil {
			return "", nil, err
		}
	}
	fd, err := c.st.Open(p, syscall.O_RDONLY, 0)
	if errors.Is(err, syscall.ELOOP) {
		return "", nil, fmt.Errorf("%s is a symbolic link (or lies under one); only regular files are stored: %w", pathpattern.Printable(p), err)
	}
	if err != nil {
		return "", nil, err
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		syscall.Close(fd)
		if err == nil {
			err = fmt.Errorf("%s is not a regular file (mode %#o); only regular files are stored", pathpattern.Printable(p), st.Mode)
		}
		return "", nil, err
	}
	return "/proc/self/fd/" + strconv.Itoa(fd), func() { syscall.Close(fd) }, nil
}

// Finish waits for the uploads in progress and the queued copies, and returns the first
// error. Commits after Finish are ignored.
func (c *Copier) Finish(ctx context.Context) error {
	uploaded := make(chan struct{})
	go func() { c.uploads.Wait(); close(uploaded) }()
	select {
	case <-uploaded:
	case <-ctx.Done():
		return fmt.Errorf("storing permanent outputs: %w", ctx.Err())
	}
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.signal()
	select {
	case <-c.done:
	case <-ctx.Done():
		return fmt.Errorf("storing permanent outputs: %w", ctx.Err())
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.errs) > 0 {
		return c.errs[0]
	}
	return nil
}

// Results returns the outputs stored so far, by path.
func (c *Copier) Results() []Output {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := append([]Output(nil), c.outputs...)
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}
