package semantics

import (
	"context"
	"errors"
	"strings"
	"testing"
)

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
