package streamfs

import (
	"bytes"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-io/sluice/internal/semantics"
)

// tmpfsDir makes a directory on a tmpfs (/dev/shm), removed at the end of the test: the
// reference a step's view is compared with.
func tmpfsDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("/dev/shm", "sluice-links-")
	if err != nil {
		t.Skipf("no tmpfs at /dev/shm: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// randomBytes returns n bytes of a fixed pseudo-random sequence.
func randomBytes(n int, seed int64) []byte {
	b := make([]byte, n)
	rand.New(rand.NewSource(seed)).Read(b)
	return b
}

const treeSpec = `
volume: {mountPath: /data}
steps:
- name: p
  template: {spec: {containers: [{name: c, image: x}]}}
  outputs:
  - {path: tree, type: Directory, commit: {rule: OnTermination}}
- name: c
  template: {spec: {containers: [{name: c, image: x}]}}
  inputs: [tree]
`

// GNU tar extracts an archive with a hard link into an OnTermination Directory output:
// the link is made while its source is not committed (it commits when the step exits),
// both names are the step's outputs, the same file (two links) in the step's view as
// on tmpfs, and a consumer that started before the commit reads both names byte for byte
// once the producer exits.
func TestTarHardLinkIntoAnUncommittedOutput(t *testing.T) {
	if _, err := exec.LookPath("tar"); err != nil {
		t.Skip("GNU tar is needed")
	}
	h := newHarness(t, treeSpec, harnessOpts{})
	src := tmpfsDir(t)
	body := randomBytes(300<<10+17, 1)
	if err := os.MkdirAll(filepath.Join(src, "t", "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "t", "file.bin"), body, 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(src, "t", "file.bin"), filepath.Join(src, "t", "sub", "hard.bin")); err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(src, "t.tar")
	if out, err := exec.Command("tar", "-cf", archive, "-C", filepath.Join(src, "t"), ".").CombinedOutput(); err != nil {
		t.Fatalf("tar -c: %v\n%s", err, out)
	}
	if out, err := exec.Command("tar", "-tvf", archive).CombinedOutput(); err != nil || !strings.Contains(string(out), "link to ./file.bin") {
		t.Fatalf("the archive holds no hard link: %v\n%s", err, out)
	}

	// The reference: the same extraction on tmpfs.
	ref := filepath.Join(src, "ref")
	if err := os.Mkdir(ref, 0o755); err != nil {
		t.Fatal(err)
	}
	statCmd := `stat -c '%h %s %a' "$D/file.bin" "$D/sub/hard.bin"; [ "$D/file.bin" -ef "$D/sub/hard.bin" ] && echo same file`
	refOut, err := exec.Command("sh", "-c", "D="+ref+"; tar -xpf "+archive+" -C $D && "+statCmd).CombinedOutput()
	if err != nil {
		t.Fatalf("tar -x on tmpfs: %v\n%s", err, refOut)
	}

	// The consumer starts first: its reads wait for the commit.
	cons := h.start("c", `cat "$V/tree/file.bin" > `+filepath.Join(src, "c-file")+` && cat "$V/tree/sub/hard.bin" > `+filepath.Join(src, "c-hard"))
	h.blocked("c", 1)

	out, code := h.sh("p", "D=$V/tree; mkdir $D && tar -xpf "+archive+" -C $D && "+statCmd)
	if code != 0 || out != string(refOut) {
		t.Fatalf("tar -x into the uncommitted output: %d\n%s\nwant, as on tmpfs:\n%s", code, out, refOut)
	}
	for _, p := range []string{"tree/file.bin", "tree/sub/hard.bin"} {
		if s := h.engine.Status(p); !s.Exists || s.Committed || s.Size != int64(len(body)) {
			t.Errorf("%s before the producer exits: %+v, want existing, %d bytes, not committed", p, s, len(body))
		}
	}
	if !cons.running() {
		out, _ := cons.wait(t)
		t.Fatalf("the consumer did not wait for the commit: %s", out)
	}

	h.engine.Terminate("p", 0)
	if out, code := cons.wait(t); code != 0 {
		t.Fatalf("consumer: %d %s", code, out)
	}
	for _, f := range []string{"c-file", "c-hard"} {
		if got, err := os.ReadFile(filepath.Join(src, f)); err != nil || !bytes.Equal(got, body) {
			t.Errorf("consumer read %s: %d bytes (%v), want the archive's %d bytes", f, len(got), err, len(body))
		}
	}
	for _, p := range []string{"tree/file.bin", "tree/sub/hard.bin"} {
		if s := h.engine.Status(p); !s.Committed || s.Size != int64(len(body)) {
			t.Errorf("%s after the producer exited: %+v, want committed with %d bytes", p, s, len(body))
		}
	}
}

// A hard link fixes the bytes of an uncommitted output under both its names (the rules,
// and other nodes, saw them written whole at the link): writing or truncating either
// name is EPERM while both exist; once one name is removed the other is the step's to
// write again. Linking a file the step did not make, not committed, stays EPERM.
func TestLinkFixesTheBytesOfAnUncommittedOutput(t *testing.T) {
	h := newHarness(t, treeSpec, harnessOpts{})
	out, code := h.sh("p", `
		mkdir $V/tree; printf data > $V/tree/a
		ln $V/tree/a $V/tree/b; echo "link: $?"
		printf more >> $V/tree/a 2>/dev/null; echo "append to a: $?"
		truncate -s 1 $V/tree/b 2>/dev/null; echo "truncate b: $?"
		exec 3>>$V/tree/b; printf x >&3 2>/dev/null; echo "write to b: $?"; exec 3>&-
		cat $V/tree/a $V/tree/b; echo
		rm $V/tree/b; echo "rm b: $?"
		printf more >> $V/tree/a; echo "append to a alone: $?"
		cat $V/tree/a; echo`)
	want := "link: 0\nappend to a: 1\ntruncate b: 1\nwrite to b: 1\ndatadata\nrm b: 0\nappend to a alone: 0\ndatamore\n"
	if code != 0 || out != want {
		t.Errorf("writes after the link: %d\n%s\nwant:\n%s", code, out, want)
	}
	if s := h.engine.Status("tree/b"); s.Exists {
		t.Errorf("tree/b removed before the commit: %+v", s)
	}
	h.engine.Terminate("p", 0)
	if s := h.engine.Status("tree/a"); !s.Committed || s.Size != 8 {
		t.Errorf("tree/a: %+v, want committed with 8 bytes", s)
	}
}

// mmapPy opens argv[1] read-only, reads it to its end with read(2) (EOF comes at the
// commit), then maps the same descriptor (MAP_SHARED, as Python's mmap does by default)
// and prints whether the mapping holds the bytes read.
const mmapPy = `
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
data = b""
while True:
    b = os.read(fd, 1 << 16)
    if not b:
        break
    data += b
try:
    m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
except OSError as e:
    sys.exit("mmap: " + e.strerror)
print(len(data), m[:] == data)
`

// A consumer of a NoUpdate input opens it before its commit (a direct I/O handle), reads
// it to its end (so past the commit) and then maps the same descriptor: the mapping
// holds the committed bytes (FUSE_DIRECT_IO_ALLOW_MMAP, and page reads served once the
// file is committed).
func TestMmapOfANoUpdateInputReadToItsCommit(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 is needed")
	}
	h := newHarness(t, `
volume: {mountPath: /data}
steps:
- name: p
  template: {spec: {containers: [{name: c, image: x}]}}
  outputs:
  - {path: f, commit: {rule: OnClose}, fire: NoUpdate}
- name: c
  template: {spec: {containers: [{name: c, image: x}]}}
  inputs: [f]
`, harnessOpts{})
	dir := tmpfsDir(t)
	rest := randomBytes(1<<20+123, 2)
	restFile := filepath.Join(dir, "rest")
	if err := os.WriteFile(restFile, rest, 0o644); err != nil {
		t.Fatal(err)
	}
	ctl := h.fifo("ctl")
	prod := h.start("p", fmt.Sprintf(`exec 3>"$V/f"; printf part1 >&3; read x < %s; cat %s >&3; exec 3>&-`, ctl, restFile))
	h.until("f", func(s semantics.FileStatus) bool { return s.Size == 5 })
	script := filepath.Join(dir, "mapread.py")
	if err := os.WriteFile(script, []byte(mmapPy), 0o644); err != nil {
		t.Fatal(err)
	}
	cons := h.start("c", `python3 `+script+` "$V/f"`)
	h.blocked("c", 1) // opened before the commit, reading past the bytes written
	h.release(ctl)
	if out, code := prod.wait(t); code != 0 {
		t.Fatalf("producer: %d %s", code, out)
	}
	out, code := cons.wait(t)
	if want := fmt.Sprintf("%d True\n", 5+len(rest)); code != 0 || out != want {
		t.Errorf("mmap after reading to the commit: %d %q, want %q", code, out, want)
	}
}
