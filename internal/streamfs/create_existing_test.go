package streamfs

import (
	"context"
	"sync"
	"testing"

	"github.com/sluice-io/sluice/internal/filestate"
	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/store"
)

// appearing is the engine, with a file made by another writer (another view, the
// transport's materialiser) at the moment a view first asks about it once armed: between
// the kernel's LOOKUP of the name, which found nothing, and its CREATE.
type appearing struct {
	*semantics.Engine
	path  string
	once  sync.Once
	armed chan struct{}
	make  func()
}

// Status makes the file, once armed, then answers as the engine.
func (a *appearing) Status(p string) semantics.FileStatus {
	if p == a.path {
		select {
		case <-a.armed:
			a.once.Do(a.make)
		default:
		}
	}
	return a.Engine.Status(p)
}

// An open(O_CREAT|O_TRUNC) of a name another writer made between the kernel's LOOKUP and
// its CREATE truncates that file as an open of an existing file does: the store stops
// counting its bytes and the rules hear of the truncation, so the file commits with the
// bytes it has, not with those it had.
func TestCreateTruncatesAFileMadeMeanwhile(t *testing.T) {
	a := &appearing{path: "out/f", armed: make(chan struct{})}
	h := newHarness(t, `
steps:
- name: p
  outputs:
  - {path: "out/*", commit: {rule: OnClose}}`, harnessOpts{sem: func(e *semantics.Engine) filestate.Semantics {
		a.Engine = e
		return a
	}})
	const n = 100000
	other := h.store.Files(h.engine)
	a.make = func() {
		f, err := other.Create("out/f")
		if err != nil {
			t.Error(err)
			return
		}
		defer f.Close()
		if _, err := other.WriteAt(context.Background(), "out/f", int(f.Fd()), make([]byte, n), 0); err != nil {
			t.Error(err)
		}
	}
	if out, code := h.sh("p", `mkdir "$V/out"`); code != 0 {
		t.Fatalf("mkdir: %s", out)
	}
	close(a.armed)
	if out, code := h.sh("p", `printf abc > "$V/out/f"`); code != 0 {
		t.Fatalf("printf abc > out/f: exit %d: %s", code, out)
	}
	h.until("out/f", func(s semantics.FileStatus) bool { return s.Committed })
	if s := h.engine.Status("out/f"); s.Size != 3 {
		t.Errorf("out/f committed with %d bytes, want the 3 it holds", s.Size)
	}
	if used := h.store.Used(); used != 3 {
		t.Errorf("the store counts %d bytes for out/f, want 3", used)
	}
	if b, err := readStore(h.store, "out/f"); err != nil || string(b) != "abc" {
		t.Errorf("the store's out/f: %q (%v), want abc", b, err)
	}
}

// readStore returns the bytes of the store file p.
func readStore(st *store.Store, p string) ([]byte, error) {
	f, err := st.OpenFile(p, 0, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := make([]byte, 1<<20)
	k, err := f.Read(b)
	return b[:k], err
}
