package semantics

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Every commit rule under both firing rules: what a reader may do before and after the
// event that commits the file.
func TestCommitRulesTimesFiringRules(t *testing.T) {
	type step struct {
		name string
		do   func(e *Engine)
	}
	cases := []struct {
		name string
		spec string
		// events before commit; after them the file must not yet be committed
		before []step
		// the event that commits it
		commit step
	}{
		{
			name: "OnClose:1",
			spec: `
steps:
- name: p
  outputs: [{path: f, commit: {rule: OnClose}, fire: FIRE}]
- name: c
  inputs: [f]`,
			before: []step{{"create", func(e *Engine) { e.Create("f", false) }}, {"write", func(e *Engine) { e.Write("f", 0, 10) }}},
			commit: step{"close", func(e *Engine) { e.Close("f") }},
		},
		{
			name: "OnClose:3 summed over writers",
			spec: `
steps:
- name: p
  replicas: 3
  outputs: [{path: f, commit: {rule: OnClose, count: 3}, fire: FIRE}]`,
			before: []step{
				{"create", func(e *Engine) { e.Create("f", false) }},
				{"write", func(e *Engine) { e.Write("f", 0, 10) }},
				{"close by writer 1", func(e *Engine) { e.Close("f") }},
				{"close by writer 2", func(e *Engine) { e.Close("f") }},
			},
			commit: step{"close by writer 3", func(e *Engine) { e.Close("f") }},
		},
		{
			name: "OnTermination of all replicas",
			spec: `
steps:
- name: p
  replicas: 2
  outputs: [{path: f, fire: FIRE}]`,
			before: []step{
				{"create", func(e *Engine) { e.Create("f", false) }},
				{"write", func(e *Engine) { e.Write("f", 0, 10) }},
				{"close", func(e *Engine) { e.Close("f") }},
				{"instance 0 exits", func(e *Engine) { e.Terminate("p", 0) }},
				{"instance 0 exits again", func(e *Engine) { e.Terminate("p", 0) }},
			},
			commit: step{"instance 1 exits", func(e *Engine) { e.Terminate("p", 1) }},
		},
		{
			name: "OnTermination:1 of 3",
			spec: `
steps:
- name: p
  replicas: 3
  outputs: [{path: f, commit: {rule: OnTermination, count: 1}, fire: FIRE}]`,
			before: []step{{"create", func(e *Engine) { e.Create("f", false) }}, {"write", func(e *Engine) { e.Write("f", 0, 10) }}},
			commit: step{"instance 2 exits", func(e *Engine) { e.Terminate("p", 2) }},
		},
		{
			name: "OnFile",
			spec: `
steps:
- name: p
  outputs:
  - {path: f, commit: {rule: OnFile, files: [done]}, fire: FIRE}
  - {path: done, commit: {rule: OnClose}}`,
			before: []step{
				{"create", func(e *Engine) { e.Create("f", false) }},
				{"write", func(e *Engine) { e.Write("f", 0, 10) }},
				{"close", func(e *Engine) { e.Close("f") }},
				{"create dep", func(e *Engine) { e.Create("done", false) }},
			},
			commit: step{"dep closes", func(e *Engine) { e.Close("done") }},
		},
	}
	for _, tc := range cases {
		for _, fire := range []string{"Update", "NoUpdate"} {
			t.Run(tc.name+"/"+fire, func(t *testing.T) {
				e := engineYAML(t, replaceFire(tc.spec, fire))
				opened := waitAsync(func() error { _, err := e.WaitOpen(context.Background(), "f"); return err })
				eof := waitAsync(func() error {
					for off := int64(0); ; {
						n, eof, err := e.WaitRead(context.Background(), "f", 0, off)
						if err != nil || eof {
							return err
						}
						off += n
					}
				})
				for _, s := range tc.before {
					s.do(e)
				}
				st := e.Status("f")
				if st.Committed {
					t.Fatalf("committed before %q", tc.commit.name)
				}
				if st.Size != 10 {
					t.Errorf("size before commit = %d, want 10 (stat shows what is written)", st.Size)
				}
				_, err := e.WaitOpen(probe(), "f")
				if fire == "Update" && !blocked(err) {
					t.Errorf("Update: open before commit did not block (err=%v)", err)
				}
				if fire == "NoUpdate" {
					if err != nil {
						t.Errorf("NoUpdate: open of a written file blocked: %v", err)
					}
					if n, eof := readableNow(e, "f", 0); n != 10 || eof {
						t.Errorf("NoUpdate: Readable(0) = %d, %v before commit; want 10, false", n, eof)
					}
					if n, eof := readableNow(e, "f", 10); n != 0 || eof {
						t.Errorf("NoUpdate: Readable(10) = %d, %v before commit; want 0, false (no EOF before commit)", n, eof)
					}
				} else if n, eof := readableNow(e, "f", 0); n != 0 || eof {
					t.Errorf("Update: Readable(0) = %d, %v before commit; want 0, false", n, eof)
				}
				select {
				case err := <-eof:
					t.Fatalf("reader saw EOF before commit (err=%v)", err)
				default:
				}
				tc.commit.do(e)
				if !e.Status("f").Committed {
					t.Fatalf("not committed after %q", tc.commit.name)
				}
				if err := mustReturn(t, opened, "open"); err != nil {
					t.Errorf("open after commit: %v", err)
				}
				if err := mustReturn(t, eof, "read to EOF"); err != nil {
					t.Errorf("read after commit: %v", err)
				}
				if n, eof := readableNow(e, "f", 4); n != 6 || eof {
					t.Errorf("Readable(4) after commit = %d, %v; want 6, false", n, eof)
				}
				if err := e.Write("f", 10, 1); !errors.Is(err, ErrCommitted) {
					t.Errorf("write after commit: err = %v, want ErrCommitted", err)
				}
			})
		}
	}
}

func replaceFire(spec, fire string) string {
	out := []byte{}
	for i := 0; i < len(spec); i++ {
		if i+4 <= len(spec) && spec[i:i+4] == "FIRE" {
			out = append(out, fire...)
			i += 3
			continue
		}
		out = append(out, spec[i])
	}
	return string(out)
}

func TestOpenOfMissingFileBlocksUntilCreated(t *testing.T) {
	e := engineYAML(t, `
steps:
- name: p
  outputs: [{path: f, commit: {rule: OnClose}, fire: NoUpdate}]`)
	if _, err := e.WaitOpen(probe(), "f"); !blocked(err) {
		t.Fatalf("open of a file not created yet: err = %v, want it to block", err)
	}
	done := waitAsync(func() error { _, err := e.WaitOpen(context.Background(), "f"); return err })
	e.Create("f", false)
	if err := mustReturn(t, done, "open"); err != nil {
		t.Fatal(err)
	}
}

func TestSparseWritesExposeExactlyWrittenRanges(t *testing.T) {
	e := engineYAML(t, `
steps:
- name: p
  outputs: [{path: big, commit: {rule: OnClose}, fire: NoUpdate}]`)
	e.Create("big", false)
	e.Write("big", 100, 50) // [100,150)
	e.Write("big", 0, 10)   // [0,10)
	for _, c := range []struct{ off, want int64 }{{0, 10}, {5, 5}, {10, 0}, {99, 0}, {100, 50}, {149, 1}, {150, 0}} {
		if n, eof := readableNow(e, "big", c.off); n != c.want || eof {
			t.Errorf("Readable(%d) = %d, %v; want %d, false", c.off, n, eof, c.want)
		}
	}
	if st := e.Status("big"); st.Size != 150 {
		t.Errorf("size = %d, want 150", st.Size)
	}
	// a reader parked in the hole wakes when the hole is filled
	r := waitAsync(func() error {
		n, _, err := e.WaitRead(context.Background(), "big", 0, 10)
		if err == nil && n != 140 {
			return errors.New("hole fill did not merge ranges")
		}
		return err
	})
	e.Write("big", 10, 90)
	if err := mustReturn(t, r, "read in hole"); err != nil {
		t.Fatal(err)
	}
	e.Close("big")
	if n, eof := readableNow(e, "big", 150); n != 0 || !eof {
		t.Errorf("Readable(150) after commit = %d, %v; want EOF", n, eof)
	}
}

func TestTruncateShrinksWrittenRanges(t *testing.T) {
	e := engineYAML(t, `
steps:
- name: p
  outputs: [{path: f, commit: {rule: OnClose}, fire: NoUpdate}]`)
	e.Write("f", 0, 100)
	e.Truncate("f", 40)
	if n, _ := readableNow(e, "f", 0); n != 40 {
		t.Errorf("Readable after truncate = %d, want 40", n)
	}
	if st := e.Status("f"); st.Size != 40 {
		t.Errorf("size after truncate = %d, want 40", st.Size)
	}
}

func TestDirectoryOnNFiles(t *testing.T) {
	for _, fire := range []string{"Update", "NoUpdate"} {
		t.Run(fire, func(t *testing.T) {
			e := engineYAML(t, replaceFire(`
steps:
- name: split
  outputs:
  - {path: chunks, type: Directory, commit: {rule: OnNFiles, count: 2}, fire: FIRE}
  - {path: "chunks/*", commit: {rule: OnClose}}`, fire))
			listed := waitAsync(func() error { _, err := e.WaitDir(context.Background(), "chunks"); return err })
			e.Create("chunks", true)
			e.Create("chunks/a", false)
			e.Write("chunks/a", 0, 3)
			if got := e.Visible("chunks/a"); got != (fire == "NoUpdate") {
				t.Errorf("entry visible before commit = %v under %s", got, fire)
			}
			e.Close("chunks/a")
			if !e.Visible("chunks/a") {
				t.Error("committed entry not visible")
			}
			// the entry's own rule (chunks/* OnClose, Update) overrides the directory's
			if _, err := e.WaitOpen(probe(), "chunks/a"); err != nil {
				t.Errorf("open of a committed entry: %v", err)
			}
			e.Create("chunks/b", false)
			if dirComplete(e, "chunks") {
				t.Fatal("directory complete with 1 of 2 files committed")
			}
			if st := e.Status("chunks"); st.Entries != 2 || st.CommittedEntries != 1 {
				t.Errorf("entries = %d committed %d, want 2 and 1", st.Entries, st.CommittedEntries)
			}
			e.Close("chunks/b")
			if err := mustReturn(t, listed, "listing"); err != nil {
				t.Fatal(err)
			}
			if !dirComplete(e, "chunks") {
				t.Error("directory not complete after 2 commits")
			}
		})
	}
}

func TestFileInDirectoryInheritsItsRule(t *testing.T) {
	e := engineYAML(t, `
steps:
- name: p
  outputs: [{path: out, type: Directory, commit: {rule: OnClose, count: 2}, fire: NoUpdate}]`)
	res := e.Rules().Resolve("out/x")
	if res.Dir != "out" || res.Commit != "OnClose" || res.Count != 2 || res.Fire != "NoUpdate" {
		t.Fatalf("Resolve(out/x) = %+v; want the directory's OnClose:2 NoUpdate", res)
	}
	e.Create("out", true)
	e.Create("out/x", false)
	e.Close("out/x")
	if e.Status("out/x").Committed {
		t.Fatal("committed after 1 of 2 closes")
	}
	e.Close("out/x")
	if !e.Status("out/x").Committed {
		t.Fatal("not committed after 2 closes")
	}
	if dirComplete(e, "out") {
		t.Fatal("OnClose directory complete before its producers exited")
	}
	e.Terminate("p", 0)
	if !dirComplete(e, "out") {
		t.Fatal("OnClose directory not complete after its producers exited")
	}
}

func TestOnNFilesDirectoryEntriesDefaultToOnTermination(t *testing.T) {
	e := engineYAML(t, `
steps:
- name: p
  replicas: 2
  outputs: [{path: d, type: Directory, commit: {rule: OnNFiles, count: 1}}]`)
	res := e.Rules().Resolve("d/x")
	if res.Commit != "OnTermination" || res.Count != 2 {
		t.Fatalf("Resolve(d/x) = %s:%d, want OnTermination:2", res.Commit, res.Count)
	}
}

func TestOnFileChain(t *testing.T) {
	e := engineYAML(t, `
steps:
- name: p
  outputs:
  - {path: a, commit: {rule: OnClose}}
  - {path: b, commit: {rule: OnFile, files: [a]}}
  - {path: c, commit: {rule: OnFile, files: [b]}}`)
	var mu sync.Mutex
	var order []string
	e.Observe(Observer{Commit: func(st FileStatus) { mu.Lock(); order = append(order, st.Path); mu.Unlock() }})
	for _, f := range []string{"a", "b", "c"} {
		e.Create(f, false)
	}
	if e.Status("c").Committed {
		t.Fatal("c committed before a")
	}
	e.Close("a")
	for _, f := range []string{"a", "b", "c"} {
		if !e.Status(f).Committed {
			t.Errorf("%s not committed after a closed", f)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(order) != 3 || order[0] != "a" || order[1] != "b" || order[2] != "c" {
		t.Errorf("commit order = %v, want [a b c]", order)
	}
}

func TestOnFileCreatedAfterItsDependencyCommits(t *testing.T) {
	e := engineYAML(t, `
steps:
- name: p
  outputs:
  - {path: a, commit: {rule: OnClose}}
  - {path: b, commit: {rule: OnFile, files: [a]}, fire: NoUpdate}`)
	e.Create("a", false)
	e.Close("a")
	e.Create("b", false)
	if !e.Status("b").Committed {
		t.Error("b not committed at creation although its dependency is committed")
	}
}

func TestWaitsEndWhenProducersExitWithoutCommit(t *testing.T) {
	e := engineYAML(t, `
steps:
- name: p
  outputs:
  - {path: f, commit: {rule: OnClose, count: 3}}
  - {path: never, commit: {rule: OnClose}}`)
	open := waitAsync(func() error { _, err := e.WaitOpen(context.Background(), "f"); return err })
	missing := waitAsync(func() error { _, err := e.WaitOpen(context.Background(), "never"); return err })
	e.Create("f", false)
	e.Close("f")
	e.Terminate("p", 0)
	err := mustReturn(t, open, "open")
	var we *WaitError
	if !errors.As(err, &we) || !errors.Is(err, ErrNeverCommitted) {
		t.Fatalf("open error = %v, want a WaitError wrapping ErrNeverCommitted", err)
	}
	if want := `waiting for commit (closes 1 of 3) of "f" (OnClose:3, Update): every producer exited before its commit rule held`; err.Error() != want {
		t.Errorf("error text = %q\nwant %q", err.Error(), want)
	}
	if err := mustReturn(t, missing, "open of never-created"); !errors.Is(err, ErrNeverCreated) {
		t.Errorf("open of a file nobody created: %v, want ErrNeverCreated", err)
	}
}

func TestWaitDeadlineNamesFileAndRule(t *testing.T) {
	e := engineYAML(t, `
steps:
- name: p
  replicas: 2
  outputs: [{path: out/r.txt}]`)
	ctx, cancel := context.WithDeadline(context.Background(), time.Now())
	defer cancel()
	_, err := e.WaitOpen(ctx, "out/r.txt")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want DeadlineExceeded", err)
	}
	want := `waiting for commit (producer instances exited 0 of 2) of "out/r.txt" (OnTermination:2, Update): context deadline exceeded`
	if err.Error() != want {
		t.Errorf("error text = %q\nwant %q", err.Error(), want)
	}
}

func TestRenameCountsAsCreateAndClose(t *testing.T) {
	e := engineYAML(t, `
steps:
- name: p
  outputs: [{path: "res/*.txt", commit: {rule: OnClose}}]`)
	if err := e.Rename("res/.tmp123", "res/a.txt", 42); err != nil {
		t.Fatal(err)
	}
	st := e.Status("res/a.txt")
	if !st.Committed || st.Size != 42 {
		t.Errorf("after rename: committed=%v size=%d; want true, 42", st.Committed, st.Size)
	}
}

func TestUngovernedPathsArePlainFiles(t *testing.T) {
	e := engineYAML(t, `
steps:
- name: p
  outputs: [{path: "out/*", commit: {rule: OnClose}}]
exclude: ["out/*.tmp"]`)
	for _, p := range []string{"scratch", "out/x.tmp", "out/sub/deep"} {
		if err := e.Create(p, false); !errors.Is(err, ErrNotGoverned) {
			t.Errorf("Create(%q) = %v, want ErrNotGoverned", p, err)
		}
		if !e.CanOpen(p) || !e.Visible(p) || !dirComplete(e, p) {
			t.Errorf("%q: plain files must never block", p)
		}
		if _, err := e.WaitOpen(probe(), p); err != nil {
			t.Errorf("WaitOpen(%q) = %v, want nil", p, err)
		}
	}
	if e.Rules().MayWrite("q", "out/a") {
		t.Error("a step that does not declare out/* may write it")
	}
	if !e.Rules().MayWrite("p", "out/a") || !e.Rules().MayWrite("q", "out/x.tmp") {
		t.Error("declared producers and excluded paths must be writable")
	}
}

func TestConcurrentWritersAndReaders(t *testing.T) {
	e := engineYAML(t, `
steps:
- name: p
  replicas: 8
  outputs: [{path: f, commit: {rule: OnClose, count: 8}, fire: NoUpdate}]`)
	const chunk = 1000
	var wg sync.WaitGroup
	readers := make([]<-chan error, 4)
	for i := range readers {
		readers[i] = waitAsync(func() error {
			var got int64
			for {
				n, eof, err := e.WaitRead(context.Background(), "f", 0, got)
				if err != nil {
					return err
				}
				if eof {
					if got != 8*chunk {
						return errors.New("EOF before all bytes")
					}
					return nil
				}
				got += n
			}
		})
	}
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for k := 0; k < 10; k++ {
				e.Write("f", int64(w*chunk+k*chunk/10), chunk/10)
			}
			e.Close("f")
		}(w)
	}
	wg.Wait()
	for i, r := range readers {
		if err := mustReturn(t, r, "reader"); err != nil {
			t.Errorf("reader %d: %v", i, err)
		}
	}
}

// Observers run after the engine's lock is released (they may call the engine), creations
// before the commits of the same update: a file whose rule holds at creation (OnClose:0
// does not exist; an empty OnFile list does) is announced created, then committed.
func TestObserversRunWithoutTheLock(t *testing.T) {
	e := engineYAML(t, `
steps:
- name: p
  outputs:
  - {path: f, commit: {rule: OnClose}}
  - {path: g, commit: {rule: OnFile, files: [f]}}
- name: c
  inputs: [f, g]`)
	var seen []string
	e.Observe(Observer{Create: func(st FileStatus) {
		// Calls the engine from the observer: deadlocks if the lock is held.
		seen = append(seen, "create "+st.Path+" committed="+fmt.Sprint(e.Status(st.Path).Committed))
	}})
	e.Observe(Observer{Commit: func(st FileStatus) { seen = append(seen, "commit "+st.Path+" visible="+fmt.Sprint(e.CanOpen(st.Path))) }})
	done := waitAsync(func() error {
		e.Create("f", false)
		e.Create("g", false)
		e.Close("f")
		return nil
	})
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("an observer that calls the engine deadlocked: it runs with the lock held")
	}
	want := []string{"create f committed=false", "create g committed=false", "commit f visible=true", "commit g visible=true"}
	if !slices.Equal(seen, want) {
		t.Errorf("observers saw %q, want %q", seen, want)
	}
}

// Creating a committed file again is refused (a committed file can no longer change);
// creating an existing file that is not committed, or a committed directory, is a no-op.
func TestCreateOfCommittedFileIsRefused(t *testing.T) {
	e := engineYAML(t, `
steps:
- name: p
  outputs:
  - {path: f, commit: {rule: OnClose}}
  - {path: d, type: Directory, commit: {rule: OnNFiles, count: 1}}
  - {path: "d/*", commit: {rule: OnClose}}
- name: c
  inputs: [f, d]`)
	if err := e.Create("f", false); err != nil {
		t.Fatal(err)
	}
	if err := e.Create("f", false); err != nil {
		t.Errorf("creating an uncommitted file again: %v, want nil", err)
	}
	e.Close("f")
	if err := e.Create("f", false); !errors.Is(err, ErrCommitted) {
		t.Errorf("creating a committed file: %v, want ErrCommitted", err)
	}
	e.Create("d", true)
	e.Create("d/x", false)
	e.Close("d/x")
	if !e.Status("d").Committed {
		t.Fatal("d did not commit with its one file")
	}
	if err := e.Create("d", true); err != nil {
		t.Errorf("mkdir -p of a committed directory: %v, want nil", err)
	}
}

// A poisoned file (a write to it failed) never commits, its closes no longer count, every
// waiting and later reader gets the reason, the observers hear of it once, and a
// truncation to 0 bytes starts it over.
func TestPoisonedFileNeverCommits(t *testing.T) {
	e := engineYAML(t, `
steps:
- name: p
  outputs: [{path: f, commit: {rule: OnClose}, fire: NoUpdate}]
- name: c
  inputs: [f]`)
	var poisoned []string
	e.Observe(Observer{Poison: func(perr *PoisonError) { poisoned = append(poisoned, perr.Path+": "+perr.Reason) }})
	var committed []string
	e.Observe(Observer{Commit: func(st FileStatus) { committed = append(committed, st.Path) }})
	e.Create("f", false)
	e.Write("f", 0, 10)
	reader := waitAsync(func() error { _, _, err := e.WaitRead(context.Background(), "f", 0, 10); return err })
	if err := e.Poison("f", "write at offset 10: no space left on device"); err != nil {
		t.Fatal(err)
	}
	e.Poison("f", "again")
	if err := mustReturn(t, reader, "the waiting reader"); !errors.Is(err, ErrPoisoned) || !strings.Contains(err.Error(), "no space left on device") {
		t.Errorf("waiting reader got %v, want the poison with its reason", err)
	}
	if _, _, err := e.WaitRead(probe(), "f", 0, 0); !errors.Is(err, ErrPoisoned) {
		t.Errorf("a later reader got %v, want ErrPoisoned", err)
	}
	if err := e.Close("f"); !errors.Is(err, ErrPoisoned) {
		t.Errorf("close of a poisoned file: %v", err)
	}
	if e.Status("f").Committed || len(committed) != 0 {
		t.Fatal("a poisoned file committed")
	}
	if len(poisoned) != 1 || poisoned[0] != "f: write at offset 10: no space left on device" {
		t.Errorf("observers saw %q, want one poisoning with its reason", poisoned)
	}
	// Written again from the start: commits normally.
	e.Truncate("f", 0)
	e.Write("f", 0, 3)
	e.Close("f")
	if !e.Status("f").Committed || e.Poisoned("f") != nil {
		t.Errorf("after truncation to 0 and a new write and close: %+v, poison %v", e.Status("f"), e.Poisoned("f"))
	}
	if err := e.Poison("f", "late"); !errors.Is(err, ErrCommitted) {
		t.Errorf("poisoning a committed file: %v, want ErrCommitted", err)
	}
}

// A committed file renamed away (a temporary matching an output pattern) leaves the
// engine's records: its directory's entries and committed count, and the committed total.
func TestRenameAwayForgetsACommittedTemporary(t *testing.T) {
	e := engineYAML(t, `
steps:
- name: p
  outputs:
  - {path: d, type: Directory, commit: {rule: OnNFiles, count: 2}}
  - {path: "d/*", commit: {rule: OnClose}}
- name: c
  inputs: [d]`)
	e.Create("d", true)
	e.Create("d/tmp1", false)
	e.Close("d/tmp1")
	if st := e.Status("d"); st.CommittedEntries != 1 || e.Counters() != 1 {
		t.Fatalf("after the temporary's close: %d committed entries, %d committed", st.CommittedEntries, e.Counters())
	}
	if err := e.Rename("d/tmp1", "d/a", 5); err != nil {
		t.Fatal(err)
	}
	if st := e.Status("d"); st.Entries != 1 || st.CommittedEntries != 1 || st.Committed {
		t.Errorf("after the rename: %d entries, %d committed, dir committed %v; want only d/a", st.Entries, st.CommittedEntries, st.Committed)
	}
	if e.Status("d/tmp1").Exists || !e.Status("d/a").Committed {
		t.Errorf("d/tmp1 %+v, d/a %+v", e.Status("d/tmp1"), e.Status("d/a"))
	}
	e.Create("d/b", false)
	e.Close("d/b")
	if !e.Status("d").Committed {
		t.Error("the directory did not commit with its two final files")
	}
}

// A withdrawn file (its attempt failed) leaves every record: a committed one is no longer
// openable and its directory forgets it, a reader still reading the withdrawn file gets
// the reason (never the retry's progress), a new reader waits for the retry, the
// retry's file commits as new, and the observers hear of the withdrawal once.
func TestWithdrawTakesBackAFailedAttemptsFiles(t *testing.T) {
	e := engineYAML(t, `
steps:
- name: p
  outputs:
  - {path: d, type: Directory, commit: {rule: OnNFiles, count: 2}}
  - {path: "d/*", commit: {rule: OnClose}, fire: NoUpdate}
- name: c
  inputs: [d]`)
	var withdrawn []string
	e.Observe(Observer{Withdraw: func(w *WithdrawnError) { withdrawn = append(withdrawn, w.Path+": "+w.Reason) }})
	e.Create("d", true)
	e.Create("d/a", false)
	e.Write("d/a", 0, 4)
	e.Close("d/a") // committed by the attempt that is about to fail
	e.Create("d/b", false)
	e.Write("d/b", 0, 10) // in progress
	streaming := e.Status("d/b").Generation
	reader := waitAsync(func() error { _, _, err := e.WaitRead(context.Background(), "d/b", streaming, 10); return err })

	for _, p := range []string{"d/a", "d/b"} {
		if err := e.Withdraw(p, "attempt 1 failed (exit code 3)"); err != nil {
			t.Fatalf("Withdraw(%s): %v", p, err)
		}
	}
	if err := mustReturn(t, reader, "the reader of the withdrawn file"); !errors.Is(err, ErrWithdrawn) || !strings.Contains(err.Error(), "exit code 3") {
		t.Errorf("the reader of the withdrawn file got %v, want ErrWithdrawn with the reason", err)
	}
	if st := e.Status("d/a"); st.Exists || st.Committed || e.CanOpen("d/a") {
		t.Errorf("withdrawn d/a: %+v, openable %v", st, e.CanOpen("d/a"))
	}
	if st := e.Status("d"); st.Entries != 0 || st.CommittedEntries != 0 || e.Counters() != 0 {
		t.Errorf("after withdrawal: %d entries, %d committed in d, %d committed in all; want none", st.Entries, st.CommittedEntries, e.Counters())
	}
	if _, err := e.WaitOpen(probe(), "d/a"); !blocked(err) {
		t.Errorf("a new reader of d/a: %v, want it to wait for the retry", err)
	}
	if len(withdrawn) != 2 || withdrawn[0] != "d/a: attempt 1 failed (exit code 3)" {
		t.Errorf("observers saw %q", withdrawn)
	}

	// The retry writes d/b again: the old reader's generation stays withdrawn.
	if err := e.Create("d/b", false); err != nil {
		t.Fatalf("the retry's create: %v", err)
	}
	e.Write("d/b", 0, 20)
	if _, _, err := e.WaitRead(probe(), "d/b", streaming, 10); !errors.Is(err, ErrWithdrawn) {
		t.Errorf("the old reader after the retry wrote: %v, want ErrWithdrawn", err)
	}
	if n, _, err := e.WaitRead(probe(), "d/b", e.Status("d/b").Generation, 10); err != nil || n != 10 {
		t.Errorf("a reader of the retry's d/b: %d bytes, %v; want 10", n, err)
	}
	e.Close("d/b")
	e.Create("d/a", false)
	e.Close("d/a")
	if !e.Status("d/a").Committed || !e.Status("d").Committed {
		t.Errorf("the retry's files did not commit the directory: %+v", e.Status("d"))
	}
	if err := e.Withdraw("elsewhere", "x"); !errors.Is(err, ErrNotGoverned) {
		t.Errorf("Withdraw of an ungoverned path: %v, want ErrNotGoverned", err)
	}
}

// A Consumed file is released once every instance of every step declaring it as an input
// has exited, not before; one committing after its consumers exited is released at once.
func TestConsumedFileIsReleasedAfterItsLastConsumer(t *testing.T) {
	e := engineYAML(t, `
steps:
- name: p
  outputs: [{path: "tmp/*", commit: {rule: OnClose}, lifetime: Consumed}, {path: keep, commit: {rule: OnClose}}]
- name: c
  replicas: 2
  inputs: ["tmp/*", keep]
- name: d
  inputs: ["tmp/a"]`)
	var released []string
	e.Observe(Observer{Release: func(st FileStatus) { released = append(released, st.Path) }})
	for _, p := range []string{"tmp/a", "tmp/b", "keep"} {
		e.Create(p, false)
		e.Close(p)
	}
	e.Terminate("c", 0)
	e.Terminate("d", 0)
	if len(released) != 0 {
		t.Fatalf("released %v while c[1] still runs", released)
	}
	e.Terminate("c", 1)
	if strings.Join(released, ",") != "tmp/a,tmp/b" && strings.Join(released, ",") != "tmp/b,tmp/a" {
		t.Errorf("released %v, want tmp/a and tmp/b (not keep, whose lifetime is Workflow)", released)
	}
	if !e.Status("tmp/a").Released || e.Status("keep").Released {
		t.Errorf("status: tmp/a %+v, keep %+v", e.Status("tmp/a"), e.Status("keep"))
	}
	e.Create("tmp/late", false)
	e.Close("tmp/late")
	if len(released) != 3 || released[2] != "tmp/late" {
		t.Errorf("a file committing after its consumers exited: released %v, want it at its commit", released)
	}
}

// A consumer instance that read a committed Consumed file to its end and closed it counts
// as done with it, as one that exited: the file is released once every instance of every
// declaring step is either.
func TestConsumedFileIsReleasedWhenReadToEnd(t *testing.T) {
	e := engineYAML(t, `
steps:
- name: p
  outputs: [{path: tmp, commit: {rule: OnClose}, lifetime: Consumed}]
- name: c
  replicas: 2
  inputs: [tmp]`)
	var released []string
	e.Observe(Observer{Release: func(st FileStatus) { released = append(released, st.Path) }})
	e.Create("tmp", false)
	e.ReadToEnd("tmp", "c", 0) // not committed yet: ignored
	e.Close("tmp")
	e.ReadToEnd("tmp", "p", 0) // not a consumer: ignored
	e.ReadToEnd("tmp", "c", 1)
	if len(released) != 0 {
		t.Fatalf("released %v while c[0] has not read it", released)
	}
	e.ReadToEnd("tmp", "c", 0)
	if len(released) != 1 || released[0] != "tmp" {
		t.Errorf("released %v, want tmp once both instances read it to its end", released)
	}
	e.Terminate("c", 0)
	e.Terminate("c", 1)
	if len(released) != 1 {
		t.Errorf("released %v: a file is released once", released)
	}
}

// The release a consumer's close decides is reported by its observer after the engine's
// lock is gone, so the consumer's termination may return first; Quiesce waits for that
// observer (a run counts the released files after it).
func TestQuiesceWaitsForObserversOfEarlierUpdates(t *testing.T) {
	e := engineYAML(t, `
steps:
- name: p
  outputs: [{path: tmp, commit: {rule: OnClose}, lifetime: Consumed}]
- name: c
  inputs: [tmp]`)
	entered, proceed := make(chan struct{}), make(chan struct{})
	var released atomic.Int32
	e.Observe(Observer{Release: func(FileStatus) {
		close(entered)
		<-proceed
		released.Add(1)
	}})
	e.Create("tmp", false)
	e.Close("tmp")
	go e.ReadToEnd("tmp", "c", 0)
	<-entered
	e.Terminate("c", 0) // the file is released already: nothing more to observe
	quiet := make(chan error, 1)
	go func() { quiet <- e.Quiesce(context.Background()) }()
	select {
	case err := <-quiet:
		t.Fatalf("Quiesce returned (%v) while the release observer still ran", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(proceed)
	if err := <-quiet; err != nil || released.Load() != 1 {
		t.Errorf("Quiesce = %v with %d releases observed, want nil after the one", err, released.Load())
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := e.Quiesce(ctx); err != nil {
		t.Errorf("Quiesce with nothing in flight = %v, want nil at once", err)
	}
}

// A Consumed NoUpdate file being written is released from its start as every declared
// consumer instance reads past it (or exits), PunchStep at a time; a read of released
// bytes fails with ErrReleased.
func TestConsumedStreamIsReleasedAsItIsRead(t *testing.T) {
	e := engineYAML(t, `
steps:
- name: p
  outputs: [{path: s, commit: {rule: OnClose}, fire: NoUpdate, lifetime: Consumed}]
- name: c
  replicas: 2
  inputs: [s]`)
	var punched []int64
	e.Observe(Observer{Punch: func(p string, upto int64) { punched = append(punched, upto) }})
	e.Create("s", false)
	e.Write("s", 0, 8<<20)
	e.ReadProgress("s", "c", 0, 3<<20)
	if len(punched) != 0 {
		t.Fatalf("released %v while c[1] has read nothing", punched)
	}
	e.ReadProgress("s", "c", 1, 2<<20+100)
	if len(punched) != 1 || punched[0] != 2<<20 {
		t.Fatalf("released %v, want up to 2 MiB (c[1]'s progress, page-aligned)", punched)
	}
	e.ReadProgress("s", "c", 1, 2<<20+900000) // less than PunchStep further
	if len(punched) != 1 {
		t.Errorf("released %v after less than PunchStep more", punched)
	}
	if _, _, err := e.WaitRead(probe(), "s", 0, 4096); !errors.Is(err, ErrReleased) {
		t.Errorf("a read of released bytes: %v, want ErrReleased", err)
	}
	if n, _, err := e.WaitRead(probe(), "s", 0, 2<<20); err != nil || n != 6<<20 {
		t.Errorf("a read past the release: %d bytes, %v", n, err)
	}
	e.Terminate("c", 1) // c[1] needs nothing more: c[0] alone holds the release back
	if len(punched) != 2 || punched[1] != 3<<20 {
		t.Errorf("released %v after c[1] exited, want up to c[0]'s 3 MiB", punched)
	}
}

// A producer that fails with no retries left (TerminateFailed) ends every wait on its
// Directory output: its existence, its commit (a listing) and the names in it, with an
// error naming the failed instance, ENOENT for what was never created and EIO for what
// never commits. Its exit does not commit an OnTermination directory (its files, withdrawn,
// are gone: an empty directory would be a wrong answer).
func TestFailedProducerEndsWaitsOnItsDirectory(t *testing.T) {
	for _, commit := range []string{"OnTermination", "OnNFiles, count: 2"} {
		t.Run(strings.TrimSuffix(strings.Fields(commit)[0], ","), func(t *testing.T) {
			e := engineYAML(t, `
steps:
- name: p
  outputs:
  - {path: tree, type: Directory, commit: {rule: `+commit+`}}
  - {path: never, type: Directory, commit: {rule: `+commit+`}}
- name: c
  inputs: [tree, never]`)
			e.Create("tree", true)
			e.Create("tree/a", false)
			e.Write("tree/a", 0, 2)
			e.Close("tree/a")
			waits := map[string]<-chan error{
				"listing of tree": waitAsync(func() error { _, err := e.WaitDir(context.Background(), "tree"); return err }),
				"open of tree/a":  waitAsync(func() error { _, err := e.WaitOpen(context.Background(), "tree/a"); return err }),
				"lookup of tree/b": waitAsync(func() error {
					_, err := e.WaitExists(context.Background(), "tree/b")
					return err
				}),
				"lookup of never": waitAsync(func() error { _, err := e.WaitExists(context.Background(), "never"); return err }),
			}
			// Each of those waits now (the same waits, given a context that has ended).
			for what, err := range map[string]error{
				"listing of tree":  second(e.WaitDir(probe(), "tree")),
				"open of tree/a":   second(e.WaitOpen(probe(), "tree/a")),
				"lookup of tree/b": second(e.WaitExists(probe(), "tree/b")),
				"lookup of never":  second(e.WaitExists(probe(), "never")),
			} {
				if !blocked(err) {
					t.Fatalf("%s before the producer exited: %v, want it to wait", what, err)
				}
			}
			if err := e.Withdraw("tree/a", "attempt 1 of step p instance 0, which wrote it, failed (exit code 2)"); err != nil {
				t.Fatal(err)
			}
			e.TerminateFailed("p", 0, "exit code 2, in attempt 1")
			want := map[string]error{
				"listing of tree": ErrNeverCommitted, "open of tree/a": ErrNeverCreated,
				"lookup of tree/b": ErrNeverCreated, "lookup of never": ErrNeverCreated,
			}
			for what, ch := range waits {
				err := mustReturn(t, ch, what)
				var pf *ProducerFailedError
				if !errors.As(err, &pf) || pf.Step != "p" || pf.Instance != 0 || !errors.Is(err, ErrProducerFailed) || !errors.Is(err, want[what]) {
					t.Errorf("%s ended with %v; want a ProducerFailedError naming p[0], wrapping %v", what, err, want[what])
					continue
				}
				if !strings.Contains(err.Error(), "its producer step p instance 0 failed with no retries left (exit code 2, in attempt 1)") {
					t.Errorf("%s: error text %q does not name the failed producer", what, err)
				}
			}
			if dirComplete(e, "tree") || e.Status("tree").Committed {
				t.Error("the failed producer's exit committed its directory")
			}
			// Later waits end at once too.
			if _, err := e.WaitDir(probe(), "tree"); !errors.Is(err, ErrProducerFailed) {
				t.Errorf("a later listing: %v, want ErrProducerFailed", err)
			}
			if st := e.Status("tree"); !st.ProducersExited {
				t.Errorf("status after the failure: %+v, want ProducersExited", st)
			}
		})
	}
}

// With several producer instances, a failed one ends at once the waits whose commit rule
// needs its success (an OnTermination directory, its files, a directory's OnClose), while
// a rule the others can still satisfy waits for them; a success after a failure no longer
// commits what needed both.
func TestFailedProducerInstanceAmongOthers(t *testing.T) {
	e := engineYAML(t, `
steps:
- name: p
  replicas: 2
  outputs:
  - {path: all, type: Directory, commit: {rule: OnTermination}}
  - {path: closed, type: Directory, commit: {rule: OnClose}}
  - {path: "out-*.txt", commit: {rule: OnClose}}
  - {path: either.txt, commit: {rule: OnTermination, count: 1}}`)
	e.Create("all", true)
	e.Create("closed", true)
	listing := waitAsync(func() error { _, err := e.WaitDir(context.Background(), "all"); return err })
	closed := waitAsync(func() error { _, err := e.WaitDir(context.Background(), "closed"); return err })
	entry := waitAsync(func() error { _, err := e.WaitExists(context.Background(), "all/x"); return err })
	other := waitAsync(func() error { _, err := e.WaitOpen(context.Background(), "out-1.txt"); return err })
	either := waitAsync(func() error { _, err := e.WaitOpen(context.Background(), "either.txt"); return err })
	e.TerminateFailed("p", 0, "exit code 1")
	for what, ch := range map[string]<-chan error{"listing of all": listing, "listing of closed": closed, "lookup of all/x": entry} {
		if err := mustReturn(t, ch, what); !errors.Is(err, ErrProducerFailed) {
			t.Errorf("%s: %v, want ErrProducerFailed at once", what, err)
		}
	}
	// out-1.txt (OnClose) and either.txt (OnTermination:1) may still come from p[1].
	if _, err := e.WaitOpen(probe(), "out-1.txt"); !blocked(err) {
		t.Errorf("open of out-1.txt while p[1] runs: %v, want it to wait", err)
	}
	if _, err := e.WaitOpen(probe(), "either.txt"); !blocked(err) {
		t.Errorf("open of either.txt while p[1] runs: %v, want it to wait", err)
	}
	e.Create("out-1.txt", false)
	e.Close("out-1.txt")
	if err := mustReturn(t, other, "open of out-1.txt"); err != nil {
		t.Errorf("open of out-1.txt, written by p[1]: %v", err)
	}
	e.Create("either.txt", false)
	e.Terminate("p", 1)
	if err := mustReturn(t, either, "open of either.txt"); err != nil {
		t.Errorf("open of either.txt after p[1] succeeded: %v", err)
	}
	if e.Status("all").Committed || e.Status("closed").Committed {
		t.Error("a directory that needed both instances' success committed")
	}
	if _, err := e.WaitOpen(probe(), "out-0.txt"); !errors.Is(err, ErrNeverCreated) || !errors.Is(err, ErrProducerFailed) {
		t.Errorf("open of out-0.txt after every producer exited: %v, want ENOENT's ErrNeverCreated naming the failure", err)
	}
}

// second returns the error of a wait's results.
func second(_ FileStatus, err error) error { return err }
