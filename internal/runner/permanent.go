package runner

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"sync"

	"github.com/go-logr/logr"

	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/store"
)

// OutputReport is one permanent output copied out of the volume.
type OutputReport struct {
	// Path is the file's volume path; Dest where it was stored.
	Path, Dest string
	// Size is in bytes.
	Size int64
	// SHA256 is the hex digest of what was stored.
	SHA256 string
}

// permanentCopier copies permanent files out of the node store as they commit, on one
// worker goroutine so that the producer's close never waits for the copy.
type permanentCopier struct {
	st    *store.Store
	rules *semantics.RuleSet
	out   string
	log   logr.Logger

	mu      sync.Mutex
	queue   chan string
	done    chan struct{}
	outputs []OutputReport
	errs    []error
	closed  bool
}

func newPermanentCopier(st *store.Store, rules *semantics.RuleSet, out string, log logr.Logger) *permanentCopier {
	c := &permanentCopier{st: st, rules: rules, out: out, log: log, queue: make(chan string, 1024), done: make(chan struct{})}
	go c.loop()
	return c
}

// committed is the engine's commit observer.
func (c *permanentCopier) committed(s semantics.FileStatus) {
	if s.IsDir || !s.Exists || !c.rules.IsPermanent(s.Path) {
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
		}
		c.mu.Unlock()
	}
}

// copy stores one committed file: to a temporary name first, renamed when complete, so a
// half-written output never carries the final name.
func (c *permanentCopier) copy(p string) (OutputReport, error) {
	src, err := c.st.Path(p)
	if err != nil {
		return OutputReport{}, err
	}
	dest := filepath.Join(c.out, filepath.FromSlash(p))
	if err := os.MkdirAll(filepath.Dir(dest), 0o755); err != nil {
		return OutputReport{}, fmt.Errorf("storing %s: %w", p, err)
	}
	in, err := os.Open(src)
	if err != nil {
		return OutputReport{}, fmt.Errorf("storing %s: %w", p, err)
	}
	defer in.Close()
	tmp, err := os.CreateTemp(filepath.Dir(dest), ".sluice-"+filepath.Base(dest)+"-*")
	if err != nil {
		return OutputReport{}, fmt.Errorf("storing %s: %w", p, err)
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), in)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), dest)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return OutputReport{}, fmt.Errorf("storing %s: %w", p, err)
	}
	return OutputReport{Path: p, Dest: dest, Size: n, SHA256: hex.EncodeToString(h.Sum(nil))}, nil
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
