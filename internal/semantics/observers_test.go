package semantics

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"
)

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
