package outputs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"sigs.k8s.io/yaml"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/objstore"
	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/store"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

// setup returns an engine over spec, a node store, and a copier storing into obj, with
// the copier's observers registered as sluice run and the sidecar register them.
func setup(t *testing.T, spec string, obj objstore.Store) (*semantics.Engine, *store.Store, *Copier) {
	t.Helper()
	return setupRecorded(t, spec, obj, nil)
}

// setupRecorded is setup with the copier recording commits to meta (a transport peer's
// part), when meta is not nil.
func setupRecorded(t *testing.T, spec string, obj objstore.Store, meta Recorder) (*semantics.Engine, *store.Store, *Copier) {
	t.Helper()
	var s v1alpha1.WorkflowSpec
	if err := yaml.UnmarshalStrict([]byte(spec), &s); err != nil {
		t.Fatal(err)
	}
	rules, errs, _ := semantics.Compile(context.Background(), &s)
	if len(errs) > 0 {
		t.Fatal(errs.ToAggregate())
	}
	st, err := store.New(filepath.Join(t.TempDir(), "store"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	e := semantics.NewEngine(rules)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c := New(ctx, Config{Engine: e, Store: st, Rules: rules, Objects: obj, Log: logr.Discard(), Home: func(string) bool { return true }, Meta: meta})
	e.Observe(semantics.Observer{Commit: c.Committed, Create: c.Created, Withdraw: c.Withdrawn})
	return e, st, c
}

// commitFile writes data to p in the store and commits it by its OnClose rule.
func commitFile(t *testing.T, e *semantics.Engine, st *store.Store, p, data string) {
	t.Helper()
	if err := st.MkdirAll(filepath.Dir(p)); err != nil {
		t.Fatal(err)
	}
	f, err := st.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(data)
	f.Close()
	e.Create(p, false)
	e.Write(p, 0, int64(len(data)))
	if err := e.Close(p); err != nil {
		t.Fatal(err)
	}
}

// signalledStore is an object store that sends each key it stored on stored.
type signalledStore struct {
	*objstore.Dir
	stored chan string
}

func (s *signalledStore) Put(ctx context.Context, key, src string) (objstore.Object, error) {
	o, err := s.Dir.Put(ctx, key, src)
	if err == nil {
		s.stored <- key
	}
	return o, err
}

// gatedStore is an object store whose first Put waits until release is closed, so that
// commits pile up while the copier's worker is busy.
type gatedStore struct {
	*objstore.Dir
	release chan struct{}
	entered chan struct{}
}

func (g *gatedStore) Put(ctx context.Context, key, src string) (objstore.Object, error) {
	select {
	case g.entered <- struct{}{}:
		<-g.release
	default:
	}
	return g.Dir.Put(ctx, key, src)
}

// The commit observer runs on a writer's FUSE RELEASE and must never block, however many
// commits arrive while an upload is slow: more commits than any fixed queue holds are
// taken at once, and every one is stored once the upload goes on.
func TestCommitsNeverWaitForUploads(t *testing.T) {
	dir, err := objstore.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	obj := &gatedStore{Dir: dir, release: make(chan struct{}), entered: make(chan struct{}, 1)}
	e, st, c := setup(t, `
permanent: ["out/*"]
steps:
- name: p
  outputs: [{path: "out/*", commit: {rule: OnClose}}]`, obj)
	const files = 3000
	committed := make(chan struct{})
	go func() {
		defer close(committed)
		for i := range files {
			commitFile(t, e, st, fmt.Sprintf("out/f%d", i), "x")
		}
	}()
	select {
	case <-committed:
	case <-time.After(60 * time.Second):
		t.Fatal("committing files blocked while the first upload was held")
	}
	close(obj.release)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := c.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	if got := len(c.Results()); got != files {
		t.Errorf("%d outputs stored, want %d", got, files)
	}
}

// A withdrawn permanent output (its attempt failed) is taken back from object storage and
// from the results; the retry's file of the same name is stored afresh.
func TestWithdrawnOutputIsRemovedFromObjectStorage(t *testing.T) {
	root := t.TempDir()
	dir, err := objstore.NewDir(root)
	if err != nil {
		t.Fatal(err)
	}
	e, st, c := setup(t, `
permanent: [a.txt, b.txt]
steps:
- name: p
  outputs: [{path: a.txt, commit: {rule: OnClose}}, {path: b.txt, commit: {rule: OnClose}}]`, dir)
	commitFile(t, e, st, "a.txt", "failed attempt")
	commitFile(t, e, st, "b.txt", "kept")
	if err := e.Withdraw("a.txt", "attempt 1 failed"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Remove("a.txt"); err != nil {
		t.Fatal(err)
	}
	commitFile(t, e, st, "a.txt", "retry")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "a.txt")); err != nil || string(b) != "retry" {
		t.Errorf("stored a.txt = %q (%v), want the retry's", b, err)
	}
	var paths []string
	for _, o := range c.Results() {
		paths = append(paths, o.Path)
	}
	if fmt.Sprint(paths) != "[a.txt b.txt]" {
		t.Errorf("results %v, want a.txt once (the retry's) and b.txt", paths)
	}

	// Withdrawn with no retry, after it was stored: the object is gone.
	stored := &signalledStore{Dir: dir, stored: make(chan string, 1)}
	e2, st2, c2 := setup(t, `
permanent: [only.txt]
steps:
- name: p
  outputs: [{path: only.txt, commit: {rule: OnClose}}]`, stored)
	commitFile(t, e2, st2, "only.txt", "x")
	select {
	case <-stored.stored: // so that removal is what is tested
	case <-ctx.Done():
		t.Fatal("only.txt was never stored")
	}
	e2.Withdraw("only.txt", "attempt 1 failed")
	if err := c2.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "only.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("only.txt is still stored after its withdrawal (%v)", err)
	}
	if len(c2.Results()) != 0 {
		t.Errorf("results %+v after the withdrawal, want none", c2.Results())
	}
}

// recorder is a transport peer's Recorder that sends every commit record on records.
type recorder struct{ records chan wfmeta.FileMeta }

func (r *recorder) Name() string { return "node-a" }
func (r *recorder) RecordCommit(_ context.Context, m wfmeta.FileMeta) error {
	r.records <- m
	return nil
}
func (r *recorder) ForgetCommit(context.Context, string) error        { return nil }
func (r *recorder) Fetch(context.Context, string, int64, int64) error { return nil }

// A temporary file's commit record carries its size and home and no digest: its bytes
// are never read for it (hashing them cost a SHA-256 pass over every byte a stream sent
// across nodes). A permanent file's record still carries its digest.
func TestTemporaryCommitsAreRecordedWithoutHashing(t *testing.T) {
	dir, err := objstore.NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{records: make(chan wfmeta.FileMeta, 2)}
	e, st, c := setupRecorded(t, `
permanent: ["out/*"]
steps:
- name: p
  outputs: [{path: "out/*", commit: {rule: OnClose}}, {path: "tmp/*", commit: {rule: OnClose}}]`, dir, rec)
	commitFile(t, e, st, "tmp/t", "temporary bytes")
	commitFile(t, e, st, "out/p", "permanent bytes")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := c.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	close(rec.records)
	got := map[string]wfmeta.FileMeta{}
	for m := range rec.records {
		got[m.Path] = m
	}
	if m := got["tmp/t"]; m.Size != int64(len("temporary bytes")) || m.Home != "node-a" || m.SHA256 != "" {
		t.Errorf("the temporary file's record: %+v, want size %d, home node-a, no sha256", m, len("temporary bytes"))
	}
	sum := sha256.Sum256([]byte("permanent bytes"))
	if m := got["out/p"]; m.SHA256 != hex.EncodeToString(sum[:]) || m.URI == "" {
		t.Errorf("the permanent file's record: %+v, want sha256 %x and its URI", m, sum)
	}
}
