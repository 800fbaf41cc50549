package directview

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/store"
	"github.com/sluice-io/sluice/internal/testenv"
)

const spec = `
steps:
- name: produce
  outputs:
  - {path: stream.bin, commit: {rule: OnClose}, fire: NoUpdate}
  - {path: final.txt, commit: {rule: OnTermination}}
  - {path: parts, type: Directory, commit: {rule: OnNFiles, count: 2}}
  - {path: "parts/*", commit: {rule: OnClose}}
- name: consume
  inputs: [stream.bin, final.txt, parts]
`

// fixture is one node: a store, an engine, a producer's and a consumer's direct views.
type fixture struct {
	t                  *testing.T
	store              *store.Store
	engine             *semantics.Engine
	prodDir, consDir   string
	producer, consumer *View
}

func newFixture(t *testing.T, before func(prodDir string)) *fixture {
	t.Helper()
	var s v1alpha1.WorkflowSpec
	if err := yaml.UnmarshalStrict([]byte(spec), &s); err != nil {
		t.Fatal(err)
	}
	rs, errs, _ := semantics.Compile(context.Background(), &s)
	if len(errs) > 0 {
		t.Fatal(errs.ToAggregate())
	}
	dir := t.TempDir()
	st, err := store.New(filepath.Join(dir, "data"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, store: st, engine: semantics.NewEngine(rs),
		prodDir: filepath.Join(dir, "direct", "prod"), consDir: filepath.Join(dir, "direct", "cons")}
	for _, d := range []string{f.prodDir, f.consDir} {
		if err := os.MkdirAll(d, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	if before != nil {
		before(f.prodDir)
	}
	f.producer = f.view(f.prodDir, "produce")
	f.consumer = f.view(f.consDir, "consume")
	return f
}

func (f *fixture) view(dir, step string) *View {
	v, err := New(dir, f.store, Options{Step: step})
	if err != nil {
		f.t.Fatal(err)
	}
	f.engine.Observe(semantics.Observer{Commit: v.Committed})
	v.Start(f.engine)
	f.t.Cleanup(v.Stop)
	return v
}

// committed waits until the engine commits p.
func (f *fixture) committed(p string) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		s := f.engine.Status(p)
		if s.Committed {
			return
		}
		select {
		case <-f.engine.Changed(p):
		case <-ctx.Done():
			f.t.Fatalf("%s not committed after 20 s: %+v", p, s)
		}
	}
}

// appears waits until the consumer's directory shows p with content want.
func (f *fixture) appears(p string, want []byte) {
	f.t.Helper()
	got, err := testenv.WaitFile(filepath.Join(f.consDir, p), want, 20*time.Second)
	if err != nil || !bytes.Equal(got, want) {
		f.t.Fatalf("the consumer's directory shows %s as %d bytes (%v), want the %d committed", p, len(got), err, len(want))
	}
}

func (f *fixture) absent(p string) {
	f.t.Helper()
	if _, err := os.Lstat(filepath.Join(f.consDir, p)); !os.IsNotExist(err) {
		f.t.Fatalf("%s is in the consumer's directory before its commit (%v)", p, err)
	}
}

func random(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// A producer's file, written with plain POSIX calls in its directory, commits at its close
// and appears byte for byte in the consumer's directory, not before; the node store holds
// it once per node (the consumer's entry is a read-only copy).
func TestOutputsCommitAndAppearInConsumers(t *testing.T) {
	f := newFixture(t, nil)
	data := random(3<<20 + 17)
	w, err := os.Create(filepath.Join(f.prodDir, "stream.bin"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(data[:1<<20]); err != nil {
		t.Fatal(err)
	}
	f.absent("stream.bin")
	if s := f.engine.Status("stream.bin"); s.Committed {
		t.Fatalf("stream.bin committed while its writer holds it open: %+v", s)
	}
	if _, err := w.Write(data[1<<20:]); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f.committed("stream.bin")
	f.appears("stream.bin", data)
	if got := f.engine.Status("stream.bin").Size; got != int64(len(data)) {
		t.Errorf("the engine committed %d bytes, want %d", got, len(data))
	}
	var a, b os.FileInfo
	a, _ = os.Stat(filepath.Join(f.consDir, "stream.bin"))
	b, _ = os.Stat(filepath.Join(f.store.Dir(), "stream.bin"))
	if os.SameFile(a, b) || a.Mode().Perm() != 0o444 {
		t.Errorf("the consumer's entry is the node store's file, or writable (%v): the app could change what others read", a.Mode())
	}
	if got := f.store.Used(); got != int64(len(data)) {
		t.Errorf("the store accounts %d bytes, want %d", got, len(data))
	}
}

// An OnTermination output stays invisible after its close; the producer's Sync (its
// sidecar's drain) and its termination commit it.
func TestOnTerminationOutputsCommitAfterSync(t *testing.T) {
	f := newFixture(t, nil)
	want := []byte("result\n")
	if err := os.WriteFile(filepath.Join(f.prodDir, "final.txt"), want, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := f.producer.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s := f.engine.Status("final.txt"); s.Committed || s.Size != int64(len(want)) || s.Closes != 1 {
		t.Fatalf("before the termination final.txt is %+v, want %d bytes, one close, not committed", s, len(want))
	}
	f.absent("final.txt")
	f.engine.Terminate("produce", 0)
	f.committed("final.txt")
	f.appears("final.txt", want)
}

// Files the app wrote before the view started (a restarted sidecar, or a race with
// mkdir) are ingested at once; Sync counts the close the view never saw.
func TestFilesWrittenBeforeTheViewAreIngested(t *testing.T) {
	data := random(70000)
	f := newFixture(t, func(dir string) {
		if err := os.WriteFile(filepath.Join(dir, "stream.bin"), data, 0o644); err != nil {
			t.Fatal(err)
		}
	})
	if err := f.producer.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.committed("stream.bin")
	f.appears("stream.bin", data)
}

// Write to a temporary name, then rename: the renamed file commits (OnClose counts the
// rename as its close) and the temporary name never reaches the store.
func TestWriteThenRename(t *testing.T) {
	f := newFixture(t, nil)
	data := random(5000)
	tmp := filepath.Join(f.prodDir, "stream.bin.part")
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(f.prodDir, "stream.bin")); err != nil {
		t.Fatal(err)
	}
	f.committed("stream.bin")
	f.appears("stream.bin", data)
	if err := f.producer.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(f.store.Dir(), "stream.bin.part")); !os.IsNotExist(err) {
		t.Errorf("the temporary name is still in the node store (%v)", err)
	}
	if got := f.store.Used(); got != int64(len(data)) {
		t.Errorf("the store accounts %d bytes, want %d", got, len(data))
	}
}

// A directory output commits when it holds two committed files (OnNFiles); its files
// appear in the consumer's directory under it. The files are written right after the
// mkdir, before the view can watch the new directory, so their closes may go unseen: the
// producer's Sync (its sidecar's drain, once the app exited) counts them.
func TestDirectoryOutputs(t *testing.T) {
	f := newFixture(t, nil)
	if err := os.Mkdir(filepath.Join(f.prodDir, "parts"), 0o755); err != nil {
		t.Fatal(err)
	}
	want := map[string][]byte{}
	for i := range 2 {
		p := fmt.Sprintf("parts/%d.txt", i)
		want[p] = random(100 + i)
		if err := os.WriteFile(filepath.Join(f.prodDir, p), want[p], 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.producer.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.committed("parts")
	for p, b := range want {
		f.appears(p, b)
	}
}

// A governed file the step does not declare stays in the app's directory: it reaches
// neither the store nor the engine. Removing an output before its commit removes it from
// both.
func TestUndeclaredAndRemovedFiles(t *testing.T) {
	f := newFixture(t, nil)
	// final.txt is produce's output: consume may not write it.
	if err := os.WriteFile(filepath.Join(f.consDir, "final.txt"), []byte("forged"), 0o644); err != nil {
		t.Fatal(err)
	}
	w, err := os.Create(filepath.Join(f.prodDir, "final.txt"))
	if err != nil {
		t.Fatal(err)
	}
	w.Write([]byte("draft"))
	w.Close()
	if err := os.Remove(filepath.Join(f.prodDir, "final.txt")); err != nil {
		t.Fatal(err)
	}
	for _, v := range []*View{f.producer, f.consumer} {
		if err := v.Sync(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if s := f.engine.Status("final.txt"); s.Exists {
		t.Errorf("final.txt exists for the engine after the producer removed it and the consumer forged it: %+v", s)
	}
	if _, err := os.Lstat(filepath.Join(f.store.Dir(), "final.txt")); !os.IsNotExist(err) {
		t.Errorf("final.txt is in the node store (%v)", err)
	}
	if got := f.store.Used(); got != 0 {
		t.Errorf("the store accounts %d bytes, want 0", got)
	}
}

// An app that replaces an output with a symlink (to the sidecar's credentials, say) gets
// nothing of the link's target into the node store (issue 32, finding 10).
func TestIngestFollowsNoSymlink(t *testing.T) {
	secret := filepath.Join(t.TempDir(), "nats.creds")
	if err := os.WriteFile(secret, []byte("-----BEGIN NATS USER JWT-----"), 0o600); err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, nil)
	if err := os.Symlink(secret, filepath.Join(f.prodDir, "final.txt")); err != nil {
		t.Fatal(err)
	}
	_ = f.producer.Sync(context.Background())
	if b, err := os.ReadFile(filepath.Join(f.store.Dir(), "final.txt")); err == nil && len(b) > 0 {
		t.Fatalf("the node store holds the symlink's target: %q", b)
	}
}

// A committed file placed in a consumer's directory is the consumer's own copy: writing
// it (as the app may, whatever user it runs as) leaves the node store's bytes, which other
// readers get, unchanged (issue 32, finding 10).
func TestPlacedFilesAreNotTheStores(t *testing.T) {
	f := newFixture(t, nil)
	data := random(4096)
	if err := os.WriteFile(filepath.Join(f.prodDir, "stream.bin"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	f.committed("stream.bin")
	f.appears("stream.bin", data)
	placed := filepath.Join(f.consDir, "stream.bin")
	_ = os.Chmod(placed, 0o644) // an app running as the sidecar's user may
	if w, err := os.OpenFile(placed, os.O_WRONLY, 0); err == nil {
		_, _ = w.WriteAt([]byte("tampered"), 0)
		w.Close()
	}
	if got, err := os.ReadFile(filepath.Join(f.store.Dir(), "stream.bin")); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the node store's stream.bin was changed through the consumer's directory (%v)", err)
	}
}

// An output the app removes leaves the engine and the store's accounting even when the
// node store's copy cannot be unlinked: gone already (ENOENT), or refusing (here a
// directory in its place, EISDIR). The app's file is gone: no rule may commit it.
func TestRemovedOutputLeavesTheEngineWhateverTheStoreSays(t *testing.T) {
	for name, spoil := range map[string]func(p string) error{
		"gone":     os.Remove,
		"refusing": func(p string) error { return errors.Join(os.Remove(p), os.Mkdir(p, 0o755)) },
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, nil)
			app := filepath.Join(f.prodDir, "final.txt")
			if err := os.WriteFile(app, []byte("draft"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := f.producer.Sync(context.Background()); err != nil {
				t.Fatal(err)
			}
			if s := f.engine.Status("final.txt"); !s.Exists || s.Size != 5 || f.store.Used() != 5 {
				t.Fatalf("final.txt before its removal: %+v, store counts %d; want 5 bytes in both", s, f.store.Used())
			}
			if err := spoil(filepath.Join(f.store.Dir(), "final.txt")); err != nil {
				t.Fatal(err)
			}
			if err := os.Remove(app); err != nil {
				t.Fatal(err)
			}
			_ = f.producer.Sync(context.Background()) // a refused unlink is a failure to report
			if s := f.engine.Status("final.txt"); s.Exists {
				t.Errorf("final.txt exists for the engine after the app removed it: %+v", s)
			}
			if got := f.store.Used(); got != 0 {
				t.Errorf("the store accounts %d bytes after the app removed final.txt, want 0", got)
			}
		})
	}
}

// A view started over a directory whose files an earlier view ingested (a restarted
// sidecar) ingests them again from their start: the store's copy of a file the app
// rewrote meanwhile, shorter, holds its bytes now, and the engine the same size, not the
// bytes it was told of before.
func TestRestartedViewIngestsRewrittenFilesAnew(t *testing.T) {
	f := newFixture(t, nil)
	app := filepath.Join(f.prodDir, "final.txt")
	if err := os.WriteFile(app, []byte("0123456789"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := f.producer.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.producer.Stop()
	if err := os.WriteFile(app, []byte("abc"), 0o644); err != nil {
		t.Fatal(err)
	}
	f.producer = f.view(f.prodDir, "produce")
	if err := f.producer.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.engine.Terminate("produce", 0)
	f.committed("final.txt")
	if s := f.engine.Status("final.txt"); s.Size != 3 {
		t.Errorf("final.txt committed with %d bytes, want the 3 the app's file holds", s.Size)
	}
	if got, err := os.ReadFile(filepath.Join(f.store.Dir(), "final.txt")); err != nil || string(got) != "abc" {
		t.Errorf("the node store's final.txt: %q (%v), want abc", got, err)
	}
	if got := f.store.Used(); got != 3 {
		t.Errorf("the store accounts %d bytes, want 3", got)
	}
	f.appears("final.txt", []byte("abc"))
}
