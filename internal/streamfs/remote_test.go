package streamfs

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluice-io/sluice/internal/byterange"
	"github.com/sluice-io/sluice/internal/filestate"
	"github.com/sluice-io/sluice/internal/semantics"
)

// elsewhere makes one file count as written on another node, as the transport's fetcher
// does. Once away has taken the bytes the test's producer wrote out of the store file
// (holes punched over all of it, as a node store holds a file written elsewhere), Remote
// says a range is missing until Fetch was asked for it, and Fetch writes those bytes back.
type elsewhere struct {
	*semantics.Engine
	path    string
	mu      sync.Mutex
	store   string // the store file of path
	bytes   []byte // what the other node wrote; nil until away
	fetched byterange.Set
	asked   []byterange.Range
}

var _ filestate.Fetcher = (*elsewhere)(nil)

// away punches holes over the whole store file of e.path and keeps its bytes.
func (e *elsewhere) away(store string) ([]byte, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	b, err := os.ReadFile(store)
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(store, os.O_WRONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, int64(len(b))); err != nil {
		return nil, err
	}
	e.store, e.bytes = store, b
	return b, nil
}

func (e *elsewhere) Remote(p string, off, end int64) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return p == e.path && e.bytes != nil && len(e.fetched.Gaps(off, end)) > 0
}

func (e *elsewhere) Fetch(ctx context.Context, p string, off, end int64) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if p != e.path || e.bytes == nil {
		return nil
	}
	e.asked = append(e.asked, byterange.Range{Off: off, End: end})
	f, err := os.OpenFile(e.store, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.WriteAt(e.bytes[off:end], off); err != nil {
		return err
	}
	e.fetched.Add(off, end)
	return nil
}

// calls returns the ranges asked for so far and the bytes held.
func (e *elsewhere) calls() ([]byterange.Range, int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	held := int64(0)
	for _, r := range e.fetched {
		held += r.End - r.Off
	}
	return append([]byterange.Range(nil), e.asked...), held
}

// A committed file written on another node is fetched as it is read, not at its open: a
// reader of part of it makes the node fetch that part only, and a reader of all of it
// computes while the rest arrives. cp, which maps a file with few blocks by SEEK_DATA and
// SEEK_HOLE before copying it, copies the bytes, not the store file's holes. While a
// handle the view serves is open, later opens of the file are served too (the kernel
// refuses a passthrough open of an inode with cached opens), even once every byte is
// here; after the last is closed, reads go by passthrough again.
func TestCommittedFileFromAnotherNodeIsFetchedAsRead(t *testing.T) {
	var remote *elsewhere
	h := newHarness(t, `
steps:
- name: p
  outputs: [{path: f, commit: {rule: OnClose}}]
- name: c
  inputs: [f]`, harnessOpts{sem: func(e *semantics.Engine) filestate.Semantics {
		remote = &elsewhere{Engine: e, path: "f"}
		return remote
	}})
	const size, mib = 4 << 20, 1 << 20
	if out, code := h.sh("p", fmt.Sprintf(`head -c %d /dev/urandom > "$V/f"`, size)); code != 0 {
		t.Fatalf("writing f: %s", out)
	}
	want, err := remote.away(filepath.Join(h.dir, "store", "f"))
	if err != nil || len(want) != size {
		t.Fatalf("store file: %d bytes (%v)", len(want), err)
	}
	sum := func(b []byte) string { return fmt.Sprintf("%x", sha256.Sum256(b)) }

	out, code := h.sh("c", `dd if="$V/f" bs=64K skip=16 count=1 status=none | sha256sum | cut -d" " -f1`)
	if code != 0 || strings.TrimSpace(out) != sum(want[mib:mib+64<<10]) {
		t.Fatalf("64 KiB read at 1 MiB: %q (exit %d), want the sum of those bytes", out, code)
	}
	asked, held := remote.calls()
	for _, r := range asked {
		if r.Off < mib {
			t.Errorf("asked for bytes %d to %d: only bytes from 1 MiB on were read", r.Off, r.End)
		}
	}
	if held == 0 || held > 2*mib {
		t.Errorf("the view had %d bytes of a %d-byte file fetched for a 64 KiB read, want some and at most 2 MiB", held, size)
	}

	copied := filepath.Join(h.dir, "copied")
	if out, code := h.sh("c", `cp "$V/f" `+copied); code != 0 {
		t.Fatalf("cp: %s", out)
	}
	if got, err := os.ReadFile(copied); err != nil || sum(got) != sum(want) {
		t.Fatalf("cp of the file copied %d bytes (%v) differing from the %d written", len(got), err, len(want))
	}

	// fd 3 is a served handle, open while two more reads open the file: the second opens
	// it after every byte is here.
	out, code = h.sh("c", `exec 3<"$V/f"; sha256sum <"$V/f" | cut -d" " -f1; sha256sum <"$V/f" | cut -d" " -f1; head -c 1 <&3 | wc -c`)
	if code != 0 || strings.Join(strings.Fields(out), " ") != sum(want)+" "+sum(want)+" 1" {
		t.Fatalf("two whole reads while a descriptor of the file is open: %q (exit %d), want its sum twice, then 1", out, code)
	}
	if _, held := remote.calls(); held != size {
		t.Errorf("after whole reads the view had %d bytes fetched, want all %d", held, size)
	}

	// The last served handle's release reaches the view after close(2) returns: wait for
	// it, then read again, with O_DIRECT, which the kernel's page cache of the earlier
	// served reads cannot answer: the view serves none of it when the open went by
	// passthrough. With passthrough off, the read must only be right.
	v := h.views["c"]
	f := v.root.GetChild("f")
	if f == nil {
		t.Fatal("the consumer's view has no node for f")
	}
	select {
	case <-f.Operations().(*node).served.Idle():
	case <-time.After(10 * time.Second):
		t.Fatal("the served handles of f were not released 10 s after every descriptor was closed")
	}
	before := v.Stats().BytesRead
	if out, code := h.sh("c", `dd if="$V/f" iflag=direct bs=1M status=none | sha256sum | cut -d" " -f1`); code != 0 || strings.TrimSpace(out) != sum(want) {
		t.Fatalf("O_DIRECT read after every descriptor was closed: %q (exit %d), want the file's sum", out, code)
	}
	if served := v.Stats().BytesRead - before; v.Passthrough() && served != 0 {
		t.Errorf("reads of the whole file, now here, are still served by the view (%d bytes) after every descriptor was released", served)
	}
}
