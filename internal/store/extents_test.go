package store

import (
	"context"
	"errors"
	"math"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// The extents set agrees with a byte map through random adds and removes.
func TestExtentsAgreeWithAByteMap(t *testing.T) {
	const size = 300
	rng := rand.New(rand.NewSource(1))
	var e extents
	var bytes [size]bool
	count := func(off, end int64, want bool) (n int64) {
		for i := off; i < end; i++ {
			if bytes[i] == want {
				n++
			}
		}
		return n
	}
	for step := 0; step < 5000; step++ {
		off := rng.Int63n(size)
		end := off + rng.Int63n(size-off+1)
		if got, want := e.missing(off, end), count(off, end, false); got != want {
			t.Fatalf("step %d: missing(%d,%d) = %d, want %d (%v)", step, off, end, got, want, e.r)
		}
		if rng.Intn(3) == 0 {
			want := count(off, end, true)
			for i := off; i < end; i++ {
				bytes[i] = false
			}
			if got := e.remove(off, end); got != want {
				t.Fatalf("step %d: remove(%d,%d) = %d, want %d", step, off, end, got, want)
			}
		} else {
			want := count(off, end, false)
			for i := off; i < end; i++ {
				bytes[i] = true
			}
			if got := e.add(off, end); got != want {
				t.Fatalf("step %d: add(%d,%d) = %d, want %d", step, off, end, got, want)
			}
		}
		if e.total() != count(0, size, true) {
			t.Fatalf("step %d: total %d, want %d", step, e.total(), count(0, size, true))
		}
		for i := 1; i < len(e.r); i++ {
			if e.r[i-1].end >= e.r[i].off {
				t.Fatalf("step %d: ranges not sorted, disjoint and apart: %v", step, e.r)
			}
		}
	}
}

// A truncation that extends a file allocates nothing, so a file far larger than the
// limit can exist; writes into its hole count what they cover, and a write past the
// limit is still refused; a truncation that shrinks it frees what lay past its end.
func TestSparseFilesCountWhatTheyAllocate(t *testing.T) {
	const mib = 1 << 20
	s, err := New(t.TempDir(), Options{Limit: mib})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s.resize("f", 999999999999999) // truncate -s 999999999999999 f
	if s.Used() != 0 {
		t.Fatalf("used %d after extending an empty file by truncation, want 0", s.Used())
	}
	if err := s.ReserveAt(ctx, "f", 0, mib/2); err != nil {
		t.Fatalf("writing half the limit into the hole: %v", err)
	}
	if err := s.ReserveAt(ctx, "f", 1e12, 1e12+mib/2+1); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("writing past the limit into the hole: err = %v, want ErrNoSpace", err)
	}
	if s.Used() != mib/2 {
		t.Errorf("used %d after a refused write, want %d", s.Used(), mib/2)
	}
	if err := s.ReserveAt(ctx, "f", 0, mib/2); err != nil || s.Used() != mib/2 {
		t.Errorf("rewriting allocated bytes: %v, used %d; want nothing more counted", err, s.Used())
	}
	if err := s.ReserveAt(ctx, "f", 1e12, 1e12+mib/2); err != nil || s.Used() != mib {
		t.Errorf("writing up to the limit: %v, used %d, want %d", err, s.Used(), mib)
	}
	s.resize("f", mib/4) // frees [mib/4, mib/2) and the range at 1e12
	if s.Used() != mib/4 {
		t.Errorf("used %d after shrinking to %d, want %d", s.Used(), mib/4, mib/4)
	}
	s.resize("f", 1e15)
	if err := s.reserveUpTo(ctx, "f", mib); err != nil || s.Used() != mib {
		t.Errorf("a writer from the start up to the limit: %v, used %d, want %d", err, s.Used(), mib)
	}
	s.forget("f")
	if s.Used() != 0 {
		t.Errorf("used %d after removal, want 0", s.Used())
	}
}

// fallocate reserves what it allocates (and gives it back when it fails), with or without
// FALLOC_FL_KEEP_SIZE; a punched hole frees its range.
func TestFallocateCountsTheRange(t *testing.T) {
	s, err := New(t.TempDir(), Options{Limit: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	f, err := s.OpenFile("f", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fd := int(f.Fd())
	if err := s.Fallocate(ctx, "f", fd, 0, 0, 256<<10); err != nil || s.Used() != 256<<10 {
		t.Fatalf("fallocate 256 KiB: %v, used %d", err, s.Used())
	}
	if err := s.Fallocate(ctx, "f", fd, unix.FALLOC_FL_KEEP_SIZE, 512<<10, 256<<10); err != nil || s.Used() != 512<<10 {
		t.Fatalf("fallocate --keep-size 256 KiB past the end: %v, used %d", err, s.Used())
	}
	if st, _ := f.Stat(); st.Size() != 256<<10 {
		t.Errorf("size %d after a KEEP_SIZE fallocate, want %d", st.Size(), 256<<10)
	}
	if err := s.Fallocate(ctx, "f", fd, 0, 0, 2<<20); !errors.Is(err, ErrNoSpace) || s.Used() != 512<<10 {
		t.Errorf("fallocate past the limit: %v, used %d; want ErrNoSpace and nothing counted", err, s.Used())
	}
	if err := s.Fallocate(ctx, "f", fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, 128<<10); err != nil || s.Used() != 384<<10 {
		t.Errorf("punching 128 KiB: %v, used %d, want %d", err, s.Used(), 384<<10)
	}
	if err := s.Fallocate(ctx, "f", fd, unix.FALLOC_FL_COLLAPSE_RANGE, 0, 4096); !errors.Is(err, unix.EOPNOTSUPP) || s.Used() != 384<<10 {
		t.Errorf("collapse: %v, used %d; want EOPNOTSUPP, nothing changed", err, s.Used())
	}
	// A failing fallocate counts nothing: a range that ends past the largest file any
	// filesystem allows (offset+len overflows; EFBIG). 1<<62 fails on ext4 but tmpfs, whose
	// largest file is 2^63-1 bytes, allocates it.
	if err := s.Fallocate(ctx, "f", fd, unix.FALLOC_FL_KEEP_SIZE, math.MaxInt64-4095, 8192); err == nil || s.Used() != 384<<10 {
		t.Errorf("a failed fallocate: %v, used %d; want an error and nothing counted", err, s.Used())
	}
}

// A store opened on files already there counts their data, not their sizes; Recount
// learns what was written to a file outside the accounting.
func TestExistingAndRecountedFilesCountTheirData(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "small"), make([]byte, 60), 0o644); err != nil {
		t.Fatal(err)
	}
	sparse := func(path string) *os.File {
		t.Helper()
		f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(1 << 30); err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt(make([]byte, 8192), 1<<20); err != nil {
			t.Fatal(err)
		}
		return f
	}
	sparse(filepath.Join(dir, "sparse")).Close()
	s, err := New(dir, Options{Limit: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if s.Used() != 60+8192 {
		t.Fatalf("used %d for a 60-byte file and a 1 GiB file holding 8 KiB, want %d", s.Used(), 60+8192)
	}
	f := sparse(filepath.Join(dir, "written"))
	defer f.Close()
	if err := s.recount("written", int(f.Fd())); err != nil || s.Used() != 60+2*8192 {
		t.Errorf("Recount: %v, used %d, want %d", err, s.Used(), 60+2*8192)
	}
	if err := s.recount("written", int(f.Fd())); err != nil || s.Used() != 60+2*8192 {
		t.Errorf("Recount again: %v, used %d, want it unchanged", err, s.Used())
	}
}

// A sparse file spilled to the disk tier stays sparse there: the move copies its data,
// not its size (a file of 1 TiB holding 8 KiB takes 8 KiB on disk, not 1 TiB of zeros).
func TestSpillKeepsHoles(t *testing.T) {
	s, _, disk := tiered(t, 16<<10, 1<<20)
	ctx := context.Background()
	f, err := s.OpenFile("sparse", os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(1 << 40); err != nil {
		t.Fatal(err)
	}
	s.resize("sparse", 1<<40)
	for _, off := range []int64{0, 1 << 30} {
		if err := s.ReserveAt(ctx, "sparse", off, off+4096); err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt([]byte(strings.Repeat("x", 4096)), off); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	s.SetSpillable(func(rel string) bool { return rel == "sparse" })
	if err := s.reserveUpTo(ctx, "new", 12<<10); err != nil {
		t.Fatalf("a write that spilling the sparse file makes room for: %v", err)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(disk, "sparse"), &st); err != nil {
		t.Fatalf("the sparse file is not in the disk tier: %v", err)
	}
	if st.Size != 1<<40 || st.Blocks*512 > 1<<20 {
		t.Errorf("disk copy: size %d, %d bytes allocated; want size %d, its 8 KiB of data", st.Size, st.Blocks*512, int64(1)<<40)
	}
	if s.DiskUsed() != 8192 || s.Used() != 12<<10 {
		t.Errorf("used %d in memory, %d on disk; want %d, 8192", s.Used(), s.DiskUsed(), 12<<10)
	}
	got := make([]byte, 4096)
	g, err := s.OpenFile("sparse", os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if _, err := g.ReadAt(got, 1<<30); err != nil || string(got) != strings.Repeat("x", 4096) {
		t.Errorf("the data at 1 GiB after the move: %q... (%v)", got[:8], err)
	}
}
