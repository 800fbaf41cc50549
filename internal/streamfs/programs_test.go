package streamfs

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluice-io/sluice/internal/testenv"
)

// programsSpec declares what the real programs of TestRealProgramsInSteps make: each
// output is read by the consumer step, which also writes one.
const programsSpec = `
steps:
- name: p
  outputs:
  - {path: results.db, commit: {rule: OnClose}}
  - {path: wal.db, commit: {rule: OnClose}}
  - {path: data.h5, commit: {rule: OnClose}}
  - {path: in.txt, commit: {rule: OnClose}, fire: NoUpdate}
  - {path: "tree/*", commit: {rule: OnClose}}
  - {path: mapped.bin, commit: {rule: OnClose}}
- name: c
  inputs: [results.db, wal.db, data.h5, in.txt, "tree/*", mapped.bin]
  outputs: [{path: sorted.txt, commit: {rule: OnClose}}]`

// programsProducer writes, with the programs users run in steps: SQLite databases with a
// rollback journal and in WAL mode (the journal, WAL and shared-memory files are scratch
// files beside them), an HDF5 file through h5py, a text file, a tree copied by rsync
// (temporaries renamed into place, modes and times set afterwards) and a file written
// through a shared mmap. $SRC is a tree outside the volume.
const programsProducer = `set -e
sqlite3 "$V/results.db" "create table t(x integer, s text); begin;
  with recursive c(i) as (select 1 union all select i+1 from c where i < 20000)
  insert into t select i, printf('%08d', i*7919 % 100003) from c; commit; create index ts on t(s);"
sqlite3 "$V/wal.db" "pragma journal_mode=wal; create table t(x); insert into t values(1); insert into t values(2); insert into t select x+2 from t;" > /dev/null
$PY - "$V/data.h5" <<'PYEOF'
import sys, h5py, numpy
with h5py.File(sys.argv[1], "w") as f:
    d = f.create_dataset("x", data=numpy.arange(1000000, dtype="f8"), chunks=(65536,), compression="gzip")
    d.attrs["unit"] = "m"
    f.create_group("g").create_dataset("y", data=numpy.ones((300, 300)))
PYEOF
awk 'BEGIN { for (i = 0; i < 300000; i++) printf "%07d line %d\n", (i * 7919) % 1000003, i }' > "$V/in.txt"
mkdir -p "$V/tree" && rsync -a "$SRC/" "$V/tree/"
$PY - "$V/mapped.bin" <<'PYEOF'
import mmap, sys
with open(sys.argv[1], "w+b") as f:
    f.truncate(3 << 20)
    m = mmap.mmap(f.fileno(), 3 << 20)
    for i in range(0, 3 << 20, 4096):
        m[i:i+8] = i.to_bytes(8, "little")
    m.close()
PYEOF
`

// programsConsumer reads all of it back, with the same programs, and sorts the text with
// temporary files in the volume; what it prints must not depend on where it ran.
const programsConsumer = `set -e
sqlite3 -readonly "$V/results.db" "select count(*), sum(x), max(s) from t; pragma integrity_check;"
sqlite3 -readonly "$V/wal.db" "select count(*), sum(x) from t;"
$PY - "$V/data.h5" <<'PYEOF'
import sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    print(f["x"][:].sum(), f["x"].attrs["unit"], f["g/y"][:].sum())
PYEOF
mkdir -p "$V/tmp" && sort -S 256K -T "$V/tmp" "$V/in.txt" -o "$V/sorted.txt" && sha256sum < "$V/sorted.txt"
for f in a b sub.txt .hidden; do stat -c '%n %a %Y' "$V/tree/$f"; done | sed "s|$V/||"
cat "$V/tree/a" "$V/tree/b" "$V/tree/sub.txt" "$V/tree/.hidden" | sha256sum
sha256sum < "$V/mapped.bin"
`

// Real programs run in steps as users run them, and what the consumer reads is exactly
// what the same programs give on a tmpfs in the same run: SQLite (rollback journal and
// WAL), h5py, sort with temporary files, rsync (temporaries renamed into place) and a
// file written through mmap. In the volume the consumer starts first and waits for each
// file by its rules.
func TestRealProgramsInSteps(t *testing.T) {
	// First, so that make unit (-short) skips the test before it asks for programs
	// outside Go.
	testenv.Root(t, "mounts a tmpfs and FUSE views")
	py := "/usr/bin/python3"
	for _, tool := range []string{"sqlite3", "rsync", "sort", py} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is needed (hack/install-deps.sh installs it): %v", tool, err)
		}
	}
	if out, err := exec.Command(py, "-c", "import h5py").CombinedOutput(); err != nil {
		t.Fatalf("h5py is needed for %s (hack/install-deps.sh installs python3-h5py): %v %s", py, err, out)
	}
	src := t.TempDir()
	for name, data := range map[string]string{"a": "alpha\n", "b": strings.Repeat("b", 100000), "sub.txt": "sub\n", ".hidden": "h\n"} {
		if err := os.WriteFile(filepath.Join(src, name), []byte(data), 0o640); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(filepath.Join(src, name), time.Unix(981173106, 0), time.Unix(981173106, 0)); err != nil {
			t.Fatal(err)
		}
	}
	env := "export PY=" + py + " SRC=" + src + "; "

	tmpfs := t.TempDir()
	if err := unix.Mount("tmpfs", tmpfs, "tmpfs", 0, "size=256m"); err != nil {
		t.Fatalf("mounting the tmpfs to compare with: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(tmpfs, unix.MNT_DETACH) })
	base := exec.Command("/bin/sh", "-c", env+"V="+tmpfs+"; "+programsProducer+programsConsumer)
	want, err := base.CombinedOutput()
	if err != nil {
		t.Fatalf("the programs on tmpfs: %v\n%s", err, want)
	}

	h := newHarness(t, programsSpec, harnessOpts{})
	consumer := h.start("c", env+programsConsumer)
	if out, code := h.sh("p", env+programsProducer); code != 0 {
		t.Fatalf("the producer step: exit %d\n%s", code, out)
	}
	got, code := consumer.wait(t)
	if code != 0 || got != string(want) {
		t.Errorf("the consumer step printed (exit %d)\n%s\nwhere on tmpfs the same programs print\n%s", code, got, want)
	}
	for _, p := range []string{"results.db", "wal.db", "data.h5", "in.txt", "tree/a", "tree/.hidden", "mapped.bin"} {
		if !h.engine.Status(p).Committed {
			t.Errorf("%s is not committed", p)
		}
	}
}
