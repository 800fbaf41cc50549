package inflight

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Wait returns at once with nothing in progress, blocks while something is, and returns
// when the last thing ends; a context that ends first ends the wait with its error.
func TestWaitReturnsWhenTheLastEnds(t *testing.T) {
	var c Count
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	if err := c.Wait(ended); err != nil || c.N() != 0 {
		t.Fatalf("with nothing in progress: Wait %v (with an ended context), N %d; want nil at once", err, c.N())
	}
	c.Begin()
	c.Begin()
	idle := c.Idle()
	c.End()
	select {
	case <-idle:
		t.Fatal("idle with one thing still in progress")
	default:
	}
	if err := c.Wait(ended); !errors.Is(err, context.Canceled) {
		t.Errorf("Wait with an ended context and one in progress: %v, want context.Canceled", err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Wait(context.Background()) }()
	c.End()
	select {
	case err := <-done:
		if err != nil || c.N() != 0 {
			t.Errorf("after the last End: Wait %v, N %d", err, c.N())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return after the last End")
	}
	<-idle // the channel taken while two were in progress closes too
}
