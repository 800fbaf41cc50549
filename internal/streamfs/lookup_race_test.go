package streamfs

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/sluice-io/sluice/internal/filestate"
	"github.com/sluice-io/sluice/internal/semantics"
)

// committing is the engine, with a file written whole and committed by its producer at the
// moment a view first asks whether it may be opened, once armed: between what a lookup
// reads of the file and what it decides about it, whichever comes first.
type committing struct {
	*semantics.Engine
	path   string
	once   sync.Once
	armed  chan struct{}
	commit func()
}

// CanOpen commits the file, once armed, then answers as the engine.
func (c *committing) CanOpen(p string) bool {
	if p == c.path {
		select {
		case <-c.armed:
			c.once.Do(c.commit)
		default:
		}
	}
	return c.Engine.CanOpen(p)
}

// A consumer's lookup of an Update input that commits while the lookup runs answers with
// the committed file's attributes, never with those it had before its bytes were written:
// stat says its final size, and read(2) of it returns its bytes, with passthrough on and
// off (the kernel caches the attributes of a committed file for an hour). A Python reader
// of 10,000 small files read a few of them as empty (passthrough off) before the fix.
func TestLookupOfAFileCommittingMeanwhileGivesItsFinalSize(t *testing.T) {
	c := &committing{path: "in/f", armed: make(chan struct{})}
	h := newHarness(t, `
steps:
- name: p
  outputs:
  - {path: "in/*", commit: {rule: OnClose}}
- name: c
  inputs: ["in/*"]`, harnessOpts{sem: func(e *semantics.Engine) filestate.Semantics {
		c.Engine = e
		return c
	}})
	files := h.store.Files(h.engine)
	if out, code := h.sh("p", `mkdir "$V/in"`); code != 0 {
		t.Fatalf("mkdir: %s", out)
	}
	f, err := files.Create("in/f")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fd := int(f.Fd())
	committed := make(chan struct{})
	c.commit = func() {
		defer close(committed)
		if _, err := files.WriteAt(context.Background(), "in/f", fd, []byte(strings.Repeat("x", 1024)), 0); err != nil {
			t.Error(err)
		}
		if err := h.engine.Close("in/f"); err != nil {
			t.Error(err)
		}
	}
	close(c.armed)
	out, code := h.sh("c", `stat -c %s "$V/in/f"; wc -c < "$V/in/f"`)
	<-committed // before f is closed
	if code != 0 || strings.Fields(out)[0] != "1024" || strings.Fields(out)[1] != "1024" {
		t.Errorf("stat and read of in/f, committed during its lookup: %q (exit %d); want 1024 and 1024", out, code)
	}
}
