package streamfs

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// A consumer's opens of a committed file share one backing registration, kept after the
// last close (no registration and release per open): a hundred open-read-close cycles of
// one file leave one registration, idle; the file reads whole each time; at most
// maxIdleBackings idle registrations stay however many files were opened.
func TestCommittedOpensShareOneKeptBackingRegistration(t *testing.T) {
	h := newHarness(t, `
steps:
- name: p
  outputs: [{path: "d/*", commit: {rule: OnClose}}]
- name: c
  inputs: ["d/*"]
`, harnessOpts{tmpfs: true})
	if !h.views["c"].Passthrough() {
		t.Skip("the kernel offers no FUSE passthrough here (Linux >= 6.9, CAP_SYS_ADMIN)")
	}
	files := maxIdleBackings + 10
	if out, code := h.sh("p", fmt.Sprintf(`mkdir $V/d && i=0 && while [ $i -lt %d ]; do echo file$i > $V/d/f$i; i=$((i+1)); done`, files)); code != 0 {
		t.Fatalf("writing: %d %s", code, out)
	}
	if out, code := h.sh("c", `i=0; while [ $i -lt 100 ]; do [ "$(cat $V/d/f0)" = file0 ] || exit 1; i=$((i+1)); done`); code != 0 {
		t.Fatalf("a hundred reads of d/f0: exit %d: %s", code, out)
	}
	b := h.views["c"].pages.backings
	// The kernel sends a reader's RELEASE after its close returns (asynchronously, for
	// a file opened read-only): the counts are read once every open has been released,
	// within a deadline (counted, never slept on).
	settled := func() (n, idle int) {
		deadline := time.After(10 * time.Second)
		tick := time.NewTicker(time.Millisecond) // not a spin: the RELEASEs need the CPU
		defer tick.Stop()
		for {
			b.mu.Lock()
			n, idle = len(b.byKey), b.idle.Len()
			b.mu.Unlock()
			if n == idle {
				return n, idle
			}
			select {
			case <-tick.C:
			case <-deadline:
				return n, idle
			}
		}
	}
	n, idle := settled()
	if n != 1 || idle != 1 {
		t.Errorf("after a hundred opens of one file: %d registrations, %d idle; want 1 kept", n, idle)
	}
	out, code := h.sh("c", fmt.Sprintf(`i=0; while [ $i -lt %d ]; do cat $V/d/f$i; i=$((i+1)); done`, files))
	if code != 0 || strings.Count(out, "file") != files {
		t.Fatalf("reading every file: exit %d, %d files read", code, strings.Count(out, "file"))
	}
	n, idle = settled()
	if n != maxIdleBackings || idle != maxIdleBackings {
		t.Errorf("after opening %d files: %d registrations, %d idle; want %d", files, n, idle, maxIdleBackings)
	}
}
