package runner

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
)

// Intermediates declared lifetime: Consumed leave the node store once their consumers
// have exited, so a workflow whose intermediates together exceed the store runs; the same
// workflow without it fails with the store full.
func TestConsumedIntermediatesFreeTheStore(t *testing.T) {
	tmp := t.TempDir()
	wf, rules := load(t, "consumed.yaml", []byte(fmt.Sprintf(consumedSpec, ", lifetime: Consumed", ", lifetime: Consumed")))
	out := filepath.Join(tmp, "out")
	rep, err := Run(context.Background(), wf, rules, Options{WorkDir: filepath.Join(tmp, "work"), OutDir: out, SpaceWait: 30 * time.Second})
	if err != nil {
		t.Fatalf("run with Consumed intermediates: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(out, "sums.txt")); err != nil || string(b) != "1572864\n1572864\n" {
		t.Errorf("sums.txt = %q (%v)", b, err)
	}
	if rep.Released != 2 || rep.ReleasedBytes != 2*1572864 {
		t.Errorf("released %d files, %d bytes; want part1 and part2, 3 MiB", rep.Released, rep.ReleasedBytes)
	}

	wf, rules = load(t, "kept.yaml", []byte(fmt.Sprintf(consumedSpec, "", "")))
	if _, err := Run(context.Background(), wf, rules, Options{WorkDir: filepath.Join(tmp, "work2"), OutDir: filepath.Join(tmp, "out2"), SpaceWait: time.Second}); err == nil || !strings.Contains(err.Error(), "No space left on device") {
		t.Errorf("the same workflow keeping its intermediates: %v, want it to fail with the store full", err)
	}
}

// A Consumed NoUpdate stream eight times the node store runs in bounded memory: its start
// is released as the consumer reads past it, so the writer's waits for space end, and the
// consumer reads every byte; what it read is what was written.
func TestConsumedStreamLargerThanTheStore(t *testing.T) {
	const total = 32 << 20
	wf, rules := load(t, "stream.yaml", []byte(fmt.Sprintf(`apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: stream}
spec:
  volume: {sizeLimit: 4Mi}
  permanent: [digest.txt]
  steps:
  - name: p
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'yes 0123456789abcdef | head -c %d > "$SLUICE_DIR/stream"']}]}}
    outputs: [{path: stream, commit: {rule: OnClose}, fire: NoUpdate, lifetime: Consumed}]
  - name: c
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'sha256sum < "$SLUICE_DIR/stream" | cut -c1-64 > "$SLUICE_DIR/digest.txt"']}]}}
    inputs: [stream]
    outputs: [{path: digest.txt, commit: {rule: OnClose}}]
`, total)))
	tmp := t.TempDir()
	out := filepath.Join(tmp, "out")
	rep, err := Run(context.Background(), wf, rules, Options{WorkDir: filepath.Join(tmp, "work"), OutDir: out, SpaceWait: 60 * time.Second})
	if err != nil {
		t.Fatalf("a Consumed stream 8x the store: %v", err)
	}
	sum := sha256.Sum256([]byte(strings.Repeat("0123456789abcdef\n", total/17+1)[:total]))
	if b, err := os.ReadFile(filepath.Join(out, "digest.txt")); err != nil || strings.TrimSpace(string(b)) != hex.EncodeToString(sum[:]) {
		t.Errorf("the consumer's digest %q (%v), want %x", b, err, sum)
	}
	if rep.ReleasedBytes != total {
		t.Errorf("released %d bytes, want all %d (released while read, the rest at the end)", rep.ReleasedBytes, total)
	}
}

// With three nodes, a Consumed file is deleted from every node's store (each holds a copy)
// once its consumers on other nodes have exited; a Workflow-lifetime file stays.
func TestConsumedFilesLeaveEveryNode(t *testing.T) {
	wf, rules := load(t, "consumed3.yaml", []byte(`apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: consumed3}
spec:
  steps:
  - name: p
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'head -c 100000 /dev/zero > "$SLUICE_DIR/tmp.bin"; echo kept > "$SLUICE_DIR/kept.txt"']}]}}
    outputs: [{path: tmp.bin, commit: {rule: OnClose}, lifetime: Consumed}, {path: kept.txt, commit: {rule: OnClose}}]
  - name: c
    replicas: 2
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'wc -c < "$SLUICE_DIR/tmp.bin"; cat "$SLUICE_DIR/kept.txt"']}]}}
    inputs: [tmp.bin, kept.txt]
`))
	tmp := t.TempDir()
	work := filepath.Join(tmp, "work")
	// Three nodes, instances round-robin: p on node-0, c[0] on node-1, c[1] on node-2.
	rep, err := Run(context.Background(), wf, rules, Options{WorkDir: work, OutDir: filepath.Join(tmp, "out"), Nodes: 3, Keep: true, StoreOnDisk: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Released != 1 || rep.ReleasedBytes != 3*100000 {
		t.Errorf("released %d files, %d bytes; want tmp.bin's 100000 bytes from each of the 3 nodes", rep.Released, rep.ReleasedBytes)
	}
	for i := range 3 {
		st := filepath.Join(work, "nodes", fmt.Sprintf("node-%d", i), "store")
		if _, err := os.Stat(filepath.Join(st, "tmp.bin")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("node-%d still holds tmp.bin (%v)", i, err)
		}
		if _, err := os.Stat(filepath.Join(st, "kept.txt")); err != nil {
			t.Errorf("node-%d lost kept.txt, whose lifetime is Workflow: %v", i, err)
		}
	}
}

// Files listed in spec.tiers.fs live in the node store's disk tier: a workflow whose
// intermediates are 4x the memory tier's sizeLimit completes, byte for byte, and the
// files are on disk, not in memory.
func TestDiskTierHoldsTiersFSFiles(t *testing.T) {
	wf, rules := load(t, "tiers.yaml", []byte(fmt.Sprintf(diskTierYAML, "")))
	tmp := t.TempDir()
	work, out := filepath.Join(tmp, "work"), filepath.Join(tmp, "out")
	rep, err := Run(context.Background(), wf, rules, Options{WorkDir: work, OutDir: out, SpaceWait: time.Second, StoreOnDisk: true})
	if err != nil {
		t.Fatalf("16 MiB of chunks through a 4 MiB memory tier with a disk tier: %v", err)
	}
	produced, err1 := os.ReadFile(filepath.Join(out, "produced.txt"))
	consumed, err2 := os.ReadFile(filepath.Join(out, "consumed.txt"))
	if err1 != nil || err2 != nil || len(produced) != 4*(64+2+len("chunks/c0")+1) || string(produced) != string(consumed) {
		t.Fatalf("producer's digest %q (%v), consumer's %q (%v): want equal", produced, err1, consumed, err2)
	}
	for i := 0; i < 4; i++ {
		name := fmt.Sprintf("chunks/c%d", i)
		if st, err := os.Stat(filepath.Join(work, "disk", name)); err != nil || st.Size() != 4<<20 {
			t.Errorf("%s in the disk tier: %v", name, err)
		}
		if _, err := os.Stat(filepath.Join(work, "store", name)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s in the memory tier (%v)", name, err)
		}
	}
	if _, err := os.Stat(filepath.Join(work, "store", "produced.txt")); err != nil {
		t.Errorf("produced.txt (not in tiers.fs) is not in the memory tier: %v", err)
	}
	if rep.PeakDiskBytes != 16<<20 || rep.PeakMemoryBytes > 4<<20 {
		t.Errorf("report: peak %d bytes in memory, %d on disk; want the 16 MiB of chunks on disk and at most 4 MiB in memory", rep.PeakMemoryBytes, rep.PeakDiskBytes)
	}
}

// A full disk tier ends the write with ENOSPC naming the disk tier; the file it was
// writing never commits, and the run fails saying so.
func TestFullDiskTierFailsTheWrite(t *testing.T) {
	wf, rules := load(t, "tiers.yaml", []byte(fmt.Sprintf(diskTierYAML, ", disk: {sizeLimit: 6Mi}")))
	tmp := t.TempDir()
	var logMu sync.Mutex
	var logged []string
	log := funcr.New(func(prefix, args string) {
		logMu.Lock()
		defer logMu.Unlock()
		logged = append(logged, args)
	}, funcr.Options{})
	_, err := Run(context.Background(), wf, rules, Options{WorkDir: filepath.Join(tmp, "work"), OutDir: filepath.Join(tmp, "out"), SpaceWait: 200 * time.Millisecond, Log: log})
	if err == nil {
		t.Fatal("16 MiB of chunks through a 6 MiB disk tier succeeded")
	}
	logMu.Lock()
	refused := slices.ContainsFunc(logged, func(l string) bool {
		return strings.Contains(l, "write refused") && strings.Contains(l, "chunks/c1") && strings.Contains(l, "disk tier")
	})
	logMu.Unlock()
	if !refused {
		t.Errorf("no log line says the write to chunks/c1 was refused because the disk tier is full: %q", logged)
	}
	if _, serr := os.Stat(filepath.Join(tmp, "out", "consumed.txt")); !errors.Is(serr, fs.ErrNotExist) {
		t.Errorf("the consumer's digest was stored (%v) although a chunk could not be written", serr)
	}
	if !strings.Contains(err.Error(), "split") {
		t.Errorf("the run's error %q does not name the step whose write failed", err)
	}
}

// With a disk tier (spec.volume.disk) and no tiers.fs, committed files move from a full
// memory tier to disk while a consumer reads them as they commit: 8 MiB through a 3 MiB
// memory tier, every byte read exactly once and right.
func TestSpillToDiskWhileReading(t *testing.T) {
	wf, rules := load(t, "spill.yaml", []byte(`apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: spill}
spec:
  volume: {sizeLimit: 3Mi, disk: {sizeLimit: 64Mi}}
  permanent: [sums.txt]
  steps:
  - name: p
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'set -e; cd "$SLUICE_DIR"; mkdir -p chunks; for i in 0 1 2 3; do yes "chunk $i" | head -c 2097152 > chunks/c$i; done']}]}}
    outputs: [{path: "chunks/*", commit: {rule: OnClose}}]
  - name: c
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'set -e; cd "$SLUICE_DIR"; sha256sum chunks/c0 chunks/c1 chunks/c2 chunks/c3 > sums.txt']}]}}
    inputs: ["chunks/*"]
    outputs: [{path: sums.txt, commit: {rule: OnClose}}]
`))
	tmp := t.TempDir()
	out := filepath.Join(tmp, "out")
	rep, err := Run(context.Background(), wf, rules, Options{WorkDir: filepath.Join(tmp, "work"), OutDir: out, SpaceWait: 30 * time.Second})
	if err != nil {
		t.Fatalf("8 MiB through a 3 MiB memory tier with a disk tier to spill to: %v", err)
	}
	var want strings.Builder
	for i := 0; i < 4; i++ {
		sum := sha256.Sum256([]byte(strings.Repeat(fmt.Sprintf("chunk %d\n", i), 2097152/8+1)[:2097152]))
		fmt.Fprintf(&want, "%x  chunks/c%d\n", sum, i)
	}
	if got, err := os.ReadFile(filepath.Join(out, "sums.txt")); err != nil || string(got) != want.String() {
		t.Errorf("the consumer's checksums:\n%s(%v)\nwant:\n%s", got, err, want.String())
	}
	if rep.SpilledFiles == 0 || rep.PeakMemoryBytes > 3<<20 {
		t.Errorf("report: %d files spilled, memory peak %d bytes; want some spilled and at most 3 MiB in memory", rep.SpilledFiles, rep.PeakMemoryBytes)
	}
	if len(rep.Nodes) != 1 || rep.Nodes[0].SpilledBytes != rep.SpilledBytes || rep.Nodes[0].PeakDiskBytes == 0 {
		t.Errorf("report nodes %+v: want node-0 with the bytes spilled and its disk peak", rep.Nodes)
	}
}

// A Consumed file is released once its consumer has read it to its end and closed it,
// before the consumer exits: the producer's second file fits in the node store only
// after the first is released, while the consumer still runs to read the second.
func TestConsumedFileReleasedAfterReadToEnd(t *testing.T) {
	wf, rules := load(t, "readtoend.yaml", []byte(`apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: readtoend}
spec:
  volume: {sizeLimit: 3Mi}
  permanent: [sums.txt]
  steps:
  - name: p
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'set -e; cd "$SLUICE_DIR"; yes a | head -c 2097152 > a.bin; yes b | head -c 2097152 > b.bin']}]}}
    outputs: [{path: "*.bin", commit: {rule: OnClose}, lifetime: Consumed}]
  - name: c
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'set -e; cd "$SLUICE_DIR"; sha256sum a.bin b.bin > sums.txt']}]}}
    inputs: ["*.bin"]
    outputs: [{path: sums.txt, commit: {rule: OnClose}}]
`))
	tmp := t.TempDir()
	out := filepath.Join(tmp, "out")
	rep, err := Run(context.Background(), wf, rules, Options{WorkDir: filepath.Join(tmp, "work"), OutDir: out, SpaceWait: 30 * time.Second})
	if err != nil {
		t.Fatalf("two 2 MiB files through a 3 MiB store, the first released when read: %v", err)
	}
	var want strings.Builder
	for _, c := range []string{"a", "b"} {
		sum := sha256.Sum256([]byte(strings.Repeat(c+"\n", 1<<20)))
		fmt.Fprintf(&want, "%x  %s.bin\n", sum, c)
	}
	if got, err := os.ReadFile(filepath.Join(out, "sums.txt")); err != nil || string(got) != want.String() {
		t.Errorf("the consumer's checksums:\n%s(%v)\nwant:\n%s", got, err, want.String())
	}
	if rep.Released != 2 {
		t.Errorf("released %d files, want both", rep.Released)
	}
}

// A process that runs one workflow after another (sluice-bench, a test suite) gets the
// memory of each run's node store back when the run ends: Run keeps no descriptor of a
// store directory open, so the memory tier's tmpfs, detached at the end of the run, is
// freed with the files in it instead of living until the process exits.
func TestRunKeepsNoStoreDirectoryOpen(t *testing.T) {
	wf, rules := load(t, "once.yaml", []byte(`apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: once}
spec:
  steps:
  - name: p
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'head -c 1048576 /dev/zero > "$SLUICE_DIR/f"']}]}}
    outputs: [{path: f, commit: {rule: OnClose}}]
  - name: c
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'wc -c < "$SLUICE_DIR/f"']}]}}
    inputs: [f]
`))
	before := openDirectories(t)
	if _, err := Run(context.Background(), wf, rules, Options{WorkDir: filepath.Join(t.TempDir(), "work"), OutDir: t.TempDir()}); err != nil {
		t.Fatalf("run: %v", err)
	}
	for fd, what := range openDirectories(t) {
		if before[fd] != what {
			t.Errorf("descriptor %s of this process is still open after the run: %s", fd, what)
		}
	}
}

// openDirectories returns this process's open descriptors of directories, by number:
// where each points and its device and inode.
func openDirectories(t *testing.T) map[string]string {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	dirs := map[string]string{}
	for _, e := range ents {
		p := filepath.Join("/proc/self/fd", e.Name())
		fi, err := os.Stat(p)
		if err != nil || !fi.IsDir() {
			continue
		}
		target, _ := os.Readlink(p)
		st, _ := fi.Sys().(*syscall.Stat_t)
		dirs[e.Name()] = fmt.Sprintf("%s (device %d, inode %d)", target, st.Dev, st.Ino)
	}
	return dirs
}
