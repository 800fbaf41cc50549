package streamfs

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// smallFileScripts are the small-file probe, as Python programs: one writes n files
// of 1 KiB under data/, the other opens each and reads it whole, in order.
const (
	smallWriter = `import os, sys
d, n = sys.argv[1], int(sys.argv[2])
os.makedirs(os.path.join(d, "data"), exist_ok=True)
for i in range(n):
    with open(os.path.join(d, "data", "f%06d" % i), "wb") as f:
        f.write(b"x" * 1024)
`
	smallReader = `import os, sys
d, n = sys.argv[1], int(sys.argv[2])
t = 0
for i in range(n):
    with open(os.path.join(d, "data", "f%06d" % i), "rb") as f:
        t += len(f.read())
print(t)
`
)

// The FUSE requests a small file costs, counted (not timed), writer and reader apart: a
// Python program's open(..., "wb"), write and close of a new 1 KiB file costs the minimum
// the kernel asks for its calls (LOOKUP of the new name, CREATE, the IOCTL of Python's
// isatty, WRITE, RELEASE) and one more, the parent's GETATTR that default_permissions makes
// after each create; another's open and read of it, once committed, costs LOOKUP, OPEN,
// Python's IOCTL and RELEASE, the bytes read through passthrough or with one READ when the
// view serves them. docs/benchmarks.md, "Small files". A change that adds a request per
// file fails here.
func TestRequestsPerSmallFile(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 is needed (make deps installs it)")
	}
	const n = 200
	for _, fire := range []string{"Update", "NoUpdate"} {
		t.Run(fire, func(t *testing.T) {
			h := newHarness(t, `
steps:
- name: w
  outputs: [{path: "data/*", commit: {rule: OnClose}, fire: `+fire+`}]
- name: r
  inputs: ["data/*"]
`, harnessOpts{tmpfs: true, countRequests: true})
			dir := t.TempDir()
			for name, src := range map[string]string{"w.py": smallWriter, "r.py": smallReader} {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if out, code := h.sh("w", fmt.Sprintf("python3 %s/w.py $V %d", dir, n)); code != 0 {
				t.Fatalf("writer: exit %d: %s", code, out)
			}
			out, code := h.sh("r", fmt.Sprintf("python3 %s/r.py $V %d", dir, n))
			if code != 0 || strings.TrimSpace(out) != fmt.Sprint(n*1024) {
				t.Fatalf("reader: exit %d: %q, want %d bytes", code, out, n*1024)
			}
			reads := 0
			if passthroughMode == PassthroughOff || !h.views["r"].Passthrough() {
				reads = 1 // the view serves the one page of each file
			}
			for _, c := range []struct {
				step    string
				perFile int
			}{{"w", 6}, {"r", 4 + reads}} {
				total, ops := h.requests[c.step].Total()
				// a few requests are the program's own, once: the mkdir, the directory's
				// first lookup and attributes, Python's imports
				if limit := c.perFile*n + 20; total > limit {
					t.Errorf("%s: %d FUSE requests for %d files (%.2f a file), want at most %d a file: %v",
						c.step, total, n, float64(total)/n, c.perFile, h.requests[c.step].Counts())
				} else {
					t.Logf("%s: %.2f requests a file (%v)", c.step, float64(total)/n, ops)
				}
			}
		})
	}
}
