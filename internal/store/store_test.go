package store

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestReserveWithinLimit(t *testing.T) {
	s, err := New(t.TempDir(), Options{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := s.reserveUpTo(ctx, "a", 60); err != nil {
		t.Fatal(err)
	}
	if err := s.reserveUpTo(ctx, "a", 40); err != nil { // rewriting inside the file takes nothing
		t.Fatal(err)
	}
	if err := s.reserveUpTo(ctx, "b", 50); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("over the limit: err = %v, want ErrNoSpace", err)
	}
	if s.Used() != 60 {
		t.Errorf("used = %d after a refused reservation, want 60", s.Used())
	}
	s.resize("a", 10)
	if err := s.reserveUpTo(ctx, "b", 50); err != nil {
		t.Errorf("after shrinking a: %v", err)
	}
	s.moveAccounting("b", "c")
	s.forget("c")
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
	s.reserveUpTo(ctx, "a", 100)
	done := make(chan error, 1)
	go func() { done <- s.reserveUpTo(ctx, "b", 30) }()
	s.forget("a")
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
	if err := s.reserveUpTo(cctx, "c", 100); err == nil {
		t.Error("a reservation over the limit with a cancelled context succeeded")
	}
}

// Punch frees the start of a file on disk (it reads as zeros, its size is kept) and in
// the accounting, in whole pages; a truncation, a rename and a removal keep the
// accounting right afterwards.
func TestPunchFreesTheStartOfAFile(t *testing.T) {
	s, err := New(t.TempDir(), Options{Limit: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("x"), 100000)
	f, err := s.OpenFile("f", os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	f.Write(data)
	f.Close()
	if err := s.reserveUpTo(context.Background(), "f", int64(len(data))); err != nil {
		t.Fatal(err)
	}
	freed, err := s.Punch("f", 70000)
	if err != nil || freed != 69632 || s.Used() != int64(len(data))-69632 || s.punchedUpTo("f") != 69632 {
		t.Fatalf("Punch(70000) freed %d (%v), used %d, punched %d; want 17 whole pages (69632 bytes)", freed, err, s.Used(), s.punchedUpTo("f"))
	}
	if again, _ := s.Punch("f", 69632); again != 0 {
		t.Errorf("punching the same range again freed %d", again)
	}
	got, err := os.ReadFile(filepath.Join(s.Dir(), "f"))
	if err != nil || len(got) != len(data) || got[0] != 0 || got[69631] != 0 || got[69632] != 'x' {
		t.Errorf("after the punch: %d bytes, [0]=%q [69631]=%q [69632]=%q; want the size kept, zeros before 69632, the bytes after", len(got), got[0], got[69631], got[69632])
	}
	s.resize("f", 4096)
	if s.Used() != 0 {
		t.Errorf("used %d after truncating below the punched range, want 0", s.Used())
	}
	s.moveAccounting("f", "g")
	s.forget("g")
	if s.Used() != 0 {
		t.Errorf("used %d after rename and removal, want 0", s.Used())
	}
}
