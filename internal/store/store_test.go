package store

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestReserveWithinLimit(t *testing.T) {
	s, err := New(t.TempDir(), Options{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := s.Reserve(ctx, "a", 60); err != nil {
		t.Fatal(err)
	}
	if err := s.Reserve(ctx, "a", 40); err != nil { // rewriting inside the file takes nothing
		t.Fatal(err)
	}
	if err := s.Reserve(ctx, "b", 50); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("over the limit: err = %v, want ErrNoSpace", err)
	}
	if s.Used() != 60 {
		t.Errorf("used = %d after a refused reservation, want 60", s.Used())
	}
	s.Resize("a", 10)
	if err := s.Reserve(ctx, "b", 50); err != nil {
		t.Errorf("after shrinking a: %v", err)
	}
	s.Rename("b", "c")
	s.Forget("c")
	if s.Used() != 10 {
		t.Errorf("used = %d, want 10", s.Used())
	}
	if _, err := s.Path("../x"); err == nil {
		t.Error("Path accepted ..")
	}
}

// A reservation over the limit waits for space to be freed, up to SpaceWait.
func TestReserveWaitsForSpace(t *testing.T) {
	s, err := New(t.TempDir(), Options{Limit: 100, SpaceWait: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s.Reserve(ctx, "a", 100)
	done := make(chan error, 1)
	go func() { done <- s.Reserve(ctx, "b", 30) }()
	s.Forget("a")
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("reservation not granted after space was freed")
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := s.Reserve(cctx, "c", 100); err == nil {
		t.Error("a reservation over the limit with a cancelled context succeeded")
	}
}
