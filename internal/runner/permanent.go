package runner

import (
	"context"
	"fmt"
	"sort"
	"sync"

	"github.com/go-logr/logr"

	"github.com/sluice-io/sluice/internal/objstore"
	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/store"
)

// OutputReport is one permanent output stored.
type OutputReport struct {
	// Path is the file's volume path.
	Path string `json:"path"`
	// URI is where it was stored (file:///... or s3://...).
	URI string `json:"uri"`
	// Size is in bytes.
	Size int64 `json:"size"`
	// SHA256 is the hex digest of what was stored, equal to the committed file's.
	SHA256 string `json:"sha256"`
}

// permanentCopier stores permanent files in object storage as they commit, on one worker
// goroutine so that the producer's close never waits for the upload (parts of one upload
// go in parallel).
type permanentCopier struct {
	st    *store.Store
	rules *semantics.RuleSet
	obj   objstore.Store
	log   logr.Logger
	ctx   context.Context
	home  func(p string) bool // whether this node stores p

	mu      sync.Mutex
	queue   chan string
	done    chan struct{}
	outputs []OutputReport
	errs    []error
	closed  bool
}

func newPermanentCopier(ctx context.Context, st *store.Store, rules *semantics.RuleSet, obj objstore.Store, log logr.Logger, home func(string) bool) *permanentCopier {
	c := &permanentCopier{st: st, rules: rules, obj: obj, log: log, ctx: ctx, home: home, queue: make(chan string, 1024), done: make(chan struct{})}
	go c.loop()
	return c
}

// committed is the engine's commit observer.
func (c *permanentCopier) committed(s semantics.FileStatus) {
	if s.IsDir || !s.Exists || !c.rules.IsPermanent(s.Path) || !c.home(s.Path) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		c.queue <- s.Path
	}
}

func (c *permanentCopier) loop() {
	defer close(c.done)
	for p := range c.queue {
		o, err := c.copy(p)
		c.mu.Lock()
		if err != nil {
			c.errs = append(c.errs, err)
			c.log.Error(err, "storing permanent output failed", "path", p)
		} else {
			c.outputs = append(c.outputs, o)
			c.log.V(1).Info("stored permanent output", "path", p, "uri", o.URI, "bytes", o.Size)
		}
		c.mu.Unlock()
	}
}

// copy stores one committed file.
func (c *permanentCopier) copy(p string) (OutputReport, error) {
	src, err := c.st.Path(p)
	if err != nil {
		return OutputReport{}, err
	}
	o, err := c.obj.Put(c.ctx, p, src)
	if err != nil {
		return OutputReport{}, fmt.Errorf("storing permanent output %s: %w", p, err)
	}
	return OutputReport{Path: p, URI: o.URI, Size: o.Size, SHA256: o.SHA256}, nil
}

// finish waits for the queued copies and returns the first error.
func (c *permanentCopier) finish(ctx context.Context) error {
	c.mu.Lock()
	if !c.closed {
		c.closed = true
		close(c.queue)
	}
	c.mu.Unlock()
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

func (c *permanentCopier) results() []OutputReport {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := append([]OutputReport(nil), c.outputs...)
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}
