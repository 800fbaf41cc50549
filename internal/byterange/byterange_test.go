package byterange

import (
	"slices"
	"testing"
)

func TestSet(t *testing.T) {
	var s Set
	s.Add(10, 20)
	s.Add(30, 40)
	s.Add(20, 25) // touches [10, 20): merged
	s.Add(5, 5)   // empty: ignored
	if want := (Set{{10, 25}, {30, 40}}); !slices.Equal(s, want) {
		t.Fatalf("after adds: %v, want %v", s, want)
	}
	if got := s.ContiguousFrom(12); got != 13 {
		t.Errorf("ContiguousFrom(12) = %d, want 13", got)
	}
	if got := s.ContiguousFrom(26); got != 0 {
		t.Errorf("ContiguousFrom(26) = %d, want 0 (a gap)", got)
	}
	if got, want := s.Gaps(0, 50), []Range{{0, 10}, {25, 30}, {40, 50}}; !slices.Equal(got, want) {
		t.Errorf("Gaps(0, 50) = %v, want %v", got, want)
	}
	if got := s.Gaps(31, 39); len(got) != 0 {
		t.Errorf("Gaps inside a range = %v, want none", got)
	}
	if !s.Remove(15, 35) || !slices.Equal(s, Set{{10, 15}, {35, 40}}) {
		t.Errorf("after Remove(15, 35): %v", s)
	}
	if s.Remove(20, 30) {
		t.Error("Remove of a gap reported a hit")
	}
	s.Truncate(12)
	if !slices.Equal(s, Set{{10, 12}}) {
		t.Errorf("after Truncate(12): %v", s)
	}
}
