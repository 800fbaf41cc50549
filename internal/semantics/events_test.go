package semantics

import (
	"context"
	"errors"
	"sync"
	"testing"
)

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
