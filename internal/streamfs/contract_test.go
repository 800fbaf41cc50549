package streamfs

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/internal/semantics"
)

// A producer that writes, then holds the file open until released, then closes it.
const holdScript = `exec 3>"$V/%s"; printf %s >&3; read x < %s; exec 3>&-`

// Update: the reader's open blocks until commit; it then reads everything. NoUpdate: the
// reader reads written bytes at once, but EOF waits for commit.
func TestFiringRulesOnClose(t *testing.T) {
	spec := `
steps:
- name: p
  outputs: [{path: f, commit: {rule: OnClose}, fire: %s}]
- name: c
  inputs: [f]`
	t.Run("Update", func(t *testing.T) {
		h := newHarness(t, fmt.Sprintf(spec, "Update"), harnessOpts{})
		ctl := h.fifo("ctl")
		prod := h.start("p", fmt.Sprintf(holdScript, "f", "hello", ctl))
		h.until("f", func(s semantics.FileStatus) bool { return s.Size == 5 })
		cat := h.start("c", `cat "$V/f"`)
		h.blocked("c", 1)
		// the producer has written and still holds the file: the open must still wait
		if st := h.engine.Status("f"); st.Size != 5 || st.Committed {
			t.Fatalf("before close: size %d committed %v", st.Size, st.Committed)
		}
		if !cat.running() {
			t.Fatal("cat returned before the producer closed the file")
		}
		h.release(ctl)
		if out, code := prod.wait(t); code != 0 {
			t.Fatalf("producer: %d %s", code, out)
		}
		if out, code := cat.wait(t); code != 0 || out != "hello" {
			t.Errorf("cat = %q (exit %d), want hello", out, code)
		}
	})
	t.Run("NoUpdate", func(t *testing.T) {
		h := newHarness(t, fmt.Sprintf(spec, "NoUpdate"), harnessOpts{})
		ctl := h.fifo("ctl")
		prod := h.start("p", fmt.Sprintf(holdScript, "f", "hello", ctl))
		// head -c returns as soon as the 5 written bytes are read: no need for commit
		h.until("f", func(s semantics.FileStatus) bool { return s.Size == 5 })
		if out, code := h.sh("c", `head -c 5 "$V/f"`); code != 0 || out != "hello" {
			t.Fatalf("head -c 5 = %q (exit %d) before commit", out, code)
		}
		if out, _ := h.sh("p", `"$PROBE" size "$V/f"`); out != "5" {
			t.Errorf("stat size in the producer's view before commit = %q, want 5", out)
		}
		if out, _ := h.sh("c", `"$PROBE" size "$V/f"`); out != "5" {
			t.Errorf("stat size in a consumer's view before commit = %q, want 5, the size written so far", out)
		}
		// cat needs EOF, which only commit gives
		cat := h.start("c", `cat "$V/f"`)
		h.blocked("c", 1)
		if !cat.running() {
			t.Fatal("cat got EOF before commit")
		}
		h.release(ctl)
		prod.wait(t)
		if out, code := cat.wait(t); code != 0 || out != "hello" {
			t.Errorf("cat = %q (exit %d), want hello", out, code)
		}
		if out, _ := h.sh("c", `"$PROBE" size "$V/f"`); out != "5" {
			t.Errorf("stat size after commit = %q, want 5", out)
		}
	})
}

// Every way programs copy or read a file, started while it is being written, gets every
// byte and sees EOF only at the commit, although stat shows the size written so far:
// read(2) waits for the bytes, and the kernel's own copies (copy_file_range, sendfile,
// splice), which would stop at that size, are refused so that the programs fall back to
// read(2) (pageReads). Each copy starts and blocks before the rest is written.
func TestCopiesOfFilesBeingWritten(t *testing.T) {
	h := newHarness(t, `
steps:
- name: p
  outputs: [{path: f, commit: {rule: OnClose}, fire: NoUpdate}]
- name: c
  inputs: [f]
  outputs: [{path: "copy*", commit: {rule: OnClose}}]`, harnessOpts{})
	ctl := h.fifo("ctl")
	prod := h.start("p", `exec 3>"$V/f"; head -c 3000000 /dev/urandom >&3; read x < `+ctl+`; head -c 1000000 /dev/urandom >&3; exec 3>&-`)
	h.until("f", func(s semantics.FileStatus) bool { return s.Size == 3000000 })
	if out, _ := h.sh("c", `stat -c %s "$V/f"`); out != "3000000\n" {
		t.Errorf("stat of the file being written = %q, want the size written so far", out)
	}
	tmp := t.TempDir()
	copies := []struct{ name, script string }{
		{"cat > file (copy_file_range across file systems)", `cat "$V/f" > ` + tmp + `/cat; sha256sum < ` + tmp + `/cat`},
		{"cp to another file system", `cp "$V/f" ` + tmp + `/cp; sha256sum < ` + tmp + `/cp`},
		{"cp within the volume (copy_file_range in the mount)", `cp "$V/f" "$V/copy1"; sha256sum < "$V/copy1"`},
		{"busybox cat (sendfile)", `busybox cat "$V/f" | sha256sum`},
		{"python shutil.copyfile (sendfile)", `python3 -c 'import shutil, sys; shutil.copyfile(sys.argv[1], sys.argv[2])' "$V/f" ` + tmp + `/py; sha256sum < ` + tmp + `/py`},
		{"python read-all", `python3 -c 'import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest(), " -")' "$V/f"`},
		{"dd", `dd if="$V/f" bs=1M status=none | sha256sum`},
	}
	var running []*proc
	for i, c := range copies {
		running = append(running, h.start("c", c.script))
		h.blocked("c", int64(i+1))
	}
	h.release(ctl)
	prod.wait(t)
	want, _ := h.sh("p", `sha256sum < "$V/f"`)
	for i, c := range copies {
		out, code := running[i].wait(t)
		if code != 0 || out != want {
			t.Errorf("%s: %q (exit %d), want the whole file's digest %q", c.name, out, code, want)
		}
	}
}

// O_NONBLOCK has no effect on the open of a regular file (POSIX): GNU gzip and xz open
// every input with it, and must wait for a declared input as any program does.
func TestOpenOfMissingFileWaitsWhateverItsFlags(t *testing.T) {
	h := newHarness(t, `
steps:
- name: p
  outputs:
  - {path: "out/*.txt", commit: {rule: OnClose}, fire: NoUpdate}
  - {path: "out/*.in", commit: {rule: OnClose}}
- name: c`, harnessOpts{})
	probe := h.start("c", `"$PROBE" open-nonblock "$V/out/a.txt"`)
	h.blocked("c", 1)
	// (an Update input: gzip compares the size at its open with what it read, and warns
	// of a NoUpdate file's growth)
	gz := h.start("c", `gzip -c "$V/out/b.in" | gzip -d`)
	h.blocked("c", 2)
	// (a lookup of a name another lookup already waits for waits with it, in the kernel)
	cat := h.start("c", `cat "$V/out/c.txt"`)
	h.blocked("c", 3)
	h.sh("p", `mkdir -p "$V/out" && echo ok > "$V/out/a.txt" && echo more > "$V/out/b.in" && echo data > "$V/out/c.txt"`)
	if out, code := probe.wait(t); code != 0 || out != "ok" {
		t.Errorf("O_NONBLOCK open of a declared file made later: %q (exit %d), want it to wait and succeed", out, code)
	}
	if out, code := gz.wait(t); code != 0 || out != "more\n" {
		t.Errorf("gzip of a declared file made later: %q (exit %d)", out, code)
	}
	if out, code := cat.wait(t); code != 0 || out != "data\n" {
		t.Errorf("cat = %q (exit %d)", out, code)
	}
}

// A program that stat()s a name before it opens it sees the attributes the file will have:
// under Update the stat waits for the commit, as the open does. GNU tar stats first and
// archives as many bytes as the stat said (it archived an empty member); GNU cp compares
// the inode it stat()ed with the one it opened.
func TestStatOfUncommittedInputWaitsForTheCommit(t *testing.T) {
	h := newHarness(t, `
steps:
- name: p
  outputs: [{path: "[xty]", commit: {rule: OnClose}}]
- name: c
  inputs: [x, t, y]`, harnessOpts{})
	ctl := h.fifo("ctl")
	prod := h.start("p", `exec 3>"$V/x" 4>"$V/t"; head -c 300000 /dev/urandom >&3; head -c 300000 /dev/urandom >&4
read l < `+ctl+`; head -c 200000 /dev/urandom >&3; head -c 200000 /dev/urandom >&4; exec 3>&- 4>&-; head -c 70000 /dev/urandom > "$V/y"`)
	h.until("t", func(s semantics.FileStatus) bool { return s.Size == 300000 })
	tmp := t.TempDir()
	size := h.start("c", `stat -c %s "$V/x"`)
	h.blocked("c", 1)
	tar := h.start("c", `tar -cf `+tmp+`/in.tar -C "$V" t && mkdir `+tmp+`/x && tar -xf `+tmp+`/in.tar -C `+tmp+`/x && sha256sum < `+tmp+`/x/t`)
	h.blocked("c", 2)
	cp := h.start("c", `cp "$V/y" `+tmp+`/y && sha256sum < `+tmp+`/y`)
	h.blocked("c", 3)
	if !size.running() || !tar.running() {
		t.Fatal("stat or tar of an uncommitted Update input returned before the commit")
	}
	h.release(ctl)
	if out, code := prod.wait(t); code != 0 {
		t.Fatalf("producer: %q (exit %d)", out, code)
	}
	if out, code := size.wait(t); code != 0 || out != "500000\n" {
		t.Errorf("stat -c %%s of an uncommitted Update input: %q (exit %d), want the committed size 500000", out, code)
	}
	want, _ := h.sh("p", `sha256sum < "$V/t"`)
	if out, code := tar.wait(t); code != 0 || out != want {
		t.Errorf("tar of an uncommitted Update input: %q (exit %d), want the whole file's digest %q", out, code, want)
	}
	want, _ = h.sh("p", `sha256sum < "$V/y"`)
	if out, code := cp.wait(t); code != 0 || out != want {
		t.Errorf("cp of an Update input not created yet: %q (exit %d), want the whole file's digest %q", out, code, want)
	}
}

func TestOnCloseCountsClosesOfAllWriters(t *testing.T) {
	h := newHarness(t, `
steps:
- name: w
  replicas: 3
  outputs: [{path: log, commit: {rule: OnClose, count: 3}, fire: Update}]
- name: r`, harnessOpts{})
	cat := h.start("r", `cat "$V/log"`)
	h.blocked("r", 1)
	for i := 0; i < 3; i++ {
		if !cat.running() {
			t.Fatalf("reader returned after %d of 3 closes", i)
		}
		h.sh("w", fmt.Sprintf(`echo line%d >> "$V/log"`, i))
	}
	if out, _ := cat.wait(t); out != "line0\nline1\nline2\n" {
		t.Errorf("cat = %q", out)
	}
}

func TestOnTerminationCommitsWhenProducersExit(t *testing.T) {
	h := newHarness(t, `
steps:
- name: p
  replicas: 2
  outputs: [{path: r.bin, fire: NoUpdate}]
- name: c`, harnessOpts{})
	h.sh("p", `dd if=/dev/zero of="$V/r.bin" bs=4096 count=16 status=none`)
	sum := h.start("c", `sha256sum < "$V/r.bin"`)
	h.blocked("c", 1) // at the end of the written bytes, waiting for commit
	h.engine.Terminate("p", 0)
	if !sum.running() {
		t.Fatal("reader got EOF after 1 of 2 producer instances exited")
	}
	h.engine.Terminate("p", 1)
	out, _ := sum.wait(t)
	want := fmt.Sprintf("%x", sha256.Sum256(make([]byte, 65536)))
	if !strings.HasPrefix(out, want) {
		t.Errorf("sha256sum = %q, want %s", out, want)
	}
}

func TestOnFileAndRename(t *testing.T) {
	h := newHarness(t, `
steps:
- name: p
  outputs:
  - {path: data, commit: {rule: OnFile, files: [done]}}
  - {path: done, commit: {rule: OnClose}}
- name: c`, harnessOpts{})
	cat := h.start("c", `cat "$V/data"`)
	h.sh("p", `echo payload > "$V/data"`)
	h.blocked("c", 1)
	if !cat.running() {
		t.Fatal("data readable before its dependency committed")
	}
	// write-to-temp-then-rename commits "done" (one close), which commits "data"
	h.sh("p", `echo ok > "$V/.done.tmp" && mv "$V/.done.tmp" "$V/done"`)
	if out, code := cat.wait(t); code != 0 || out != "payload\n" {
		t.Errorf("cat = %q (exit %d)", out, code)
	}
}

func TestDirectoryListingEndsAtCommit(t *testing.T) {
	for _, fire := range []string{"NoUpdate", "Update"} {
		t.Run(fire, func(t *testing.T) {
			h := newHarness(t, fmt.Sprintf(`
steps:
- name: p
  outputs:
  - {path: d, type: Directory, commit: {rule: OnNFiles, count: 3}, fire: %s}
  - {path: "d/*", commit: {rule: OnClose}}
- name: c`, fire), harnessOpts{})
			h.sh("p", `mkdir "$V/d" && echo 1 > "$V/d/a"`)
			glob := h.start("c", `for f in "$V"/d/*; do basename "$f"; done`)
			ls := h.start("c", `ls "$V/d"`)
			find := h.start("c", `find "$V/d" -type f | sort | xargs -n1 basename`)
			h.blocked("c", 3)
			h.sh("p", `echo 2 > "$V/d/b"`)
			for _, p := range []*proc{glob, ls, find} {
				if !p.running() {
					t.Fatalf("%v returned with 2 of 3 files", p.cmd.Args)
				}
			}
			h.sh("p", `echo 3 > "$V/d/c"`)
			for _, p := range []*proc{glob, ls, find} {
				if out, code := p.wait(t); code != 0 || out != "a\nb\nc\n" {
					t.Errorf("%v = %q (exit %d), want a b c", p.cmd.Args[2], out, code)
				}
			}
		})
	}
}

func TestNoUpdateDirectoryShowsEntriesAsCreated(t *testing.T) {
	h := newHarness(t, `
steps:
- name: p
  outputs:
  - {path: d, type: Directory, commit: {rule: OnNFiles, count: 2}, fire: NoUpdate}
  - {path: "d/*", commit: {rule: OnClose}}
- name: c`, harnessOpts{})
	ctl := h.fifo("ctl")
	h.start("p", fmt.Sprintf(`mkdir "$V/d"; `+holdScript, "d/a", "x", ctl))
	h.until("d/a", func(s semantics.FileStatus) bool { return s.Exists })
	// one getdents call returns the entry created so far; the listing is not complete
	if out, code := h.sh("c", `"$PROBE" readdir1 "$V/d"`); code != 0 || out != "a\n" {
		t.Errorf("first batch of a NoUpdate directory listing: %q (exit %d), want a", out, code)
	}
	h.release(ctl)
}

// A name inside a declared directory may become a file or a subdirectory: a consumer
// walking through it before it exists waits for it, and then goes on into it.
func TestLookupInsideDirectoryWaitsForSubdirectory(t *testing.T) {
	h := newHarness(t, `
steps:
- name: p
  outputs:
  - {path: d, type: Directory, commit: {rule: OnTermination}, fire: NoUpdate}
- name: c`, harnessOpts{})
	h.sh("p", `mkdir "$V/d"`)
	cat := h.start("c", `cat "$V/d/sub/f.txt"`)
	h.blocked("c", 1)
	h.sh("p", `mkdir "$V/d/sub" && echo inside > "$V/d/sub/f.txt"`)
	h.engine.Terminate("p", 0)
	if out, code := cat.wait(t); code != 0 || out != "inside\n" {
		t.Errorf("cat of a file in a subdirectory created after the lookup began: %q (exit %d)", out, code)
	}
}

func TestSparseWritesUnderNoUpdate(t *testing.T) {
	h := newHarness(t, `
steps:
- name: p
  outputs: [{path: big, commit: {rule: OnClose, count: 2}, fire: NoUpdate}]
- name: c`, harnessOpts{})
	h.sh("p", `"$PROBE" pwrite "$V/big" 1000 tail`)
	// bytes 1000..1003 are readable; byte 0 is a hole until written
	if out, code := h.sh("c", `"$PROBE" pread "$V/big" 1000 4`); code != 0 || out != "tail" {
		t.Fatalf("pread at 1000 = %q (exit %d)", out, code)
	}
	hole := h.start("c", `"$PROBE" pread "$V/big" 0 4`)
	h.blocked("c", 1)
	h.sh("p", `"$PROBE" pwrite "$V/big" 0 head`)
	if out, code := hole.wait(t); code != 0 || out != "head" {
		t.Errorf("pread at 0 = %q (exit %d), want head once written", out, code)
	}
	if out, _ := h.sh("c", `"$PROBE" size "$V/big"`); out != "1004" {
		t.Errorf("size = %s, want 1004", out)
	}
}

func TestConsumersMayNotWriteInputs(t *testing.T) {
	h := newHarness(t, `
steps:
- name: p
  outputs: [{path: f, commit: {rule: OnClose}}]
- name: c
  inputs: [f]`, harnessOpts{})
	h.sh("p", `echo x > "$V/f"`)
	for _, script := range []string{
		`echo y > "$V/f"`,
		`echo y >> "$V/f"`,
		`rm -f "$V/f"`,
		`truncate -s 0 "$V/f"`,
		`mv "$V/f" "$V/g"`,
		`echo y > "$V/other-declared"; echo z > "$V/f"`,
	} {
		out, code := h.sh("c", script)
		if code == 0 || !strings.Contains(out, "ermission denied") && !strings.Contains(out, "ot permitted") {
			t.Errorf("%s: exit %d, output %q; want a permission error", script, code, out)
		}
	}
	if out, _ := h.sh("c", `cat "$V/f"`); out != "x\n" {
		t.Errorf("input changed to %q", out)
	}
	// committed files are immutable even for their producer
	if out, code := h.sh("p", `echo again >> "$V/f"`); code == 0 {
		t.Errorf("appending to a committed file succeeded: %q", out)
	}
	// plain (ungoverned) files are writable by anyone
	if out, code := h.sh("c", `echo s > "$V/scratch" && cat "$V/scratch" && rm "$V/scratch"`); code != 0 || out != "s\n" {
		t.Errorf("scratch file: %q (exit %d)", out, code)
	}
}

func TestStoreFullFailsWithENOSPC(t *testing.T) {
	h := newHarness(t, `
steps:
- name: p
  outputs: [{path: f, commit: {rule: OnClose, count: 2}, fire: NoUpdate}]`, harnessOpts{limit: 1 << 20, spaceWait: 200 * time.Millisecond})
	out, code := h.sh("p", `dd if=/dev/zero of="$V/f" bs=256K count=8 status=none`)
	if code == 0 || !strings.Contains(out, "No space left on device") {
		t.Fatalf("dd past the limit: exit %d %q; want ENOSPC", code, out)
	}
	if got := h.store.Used(); got > 1<<20 {
		t.Errorf("store holds %d bytes, above its limit", got)
	}
	if size := h.engine.Status("f").Size; size != 1<<20 {
		t.Errorf("file size %d, want exactly the 1 MiB that fit", size)
	}
	if !strings.Contains(h.logged(), `"path"="f"`) || !strings.Contains(h.logged(), "node store full") {
		t.Errorf("no log line about the full store: %s", h.logged())
	}
	// freeing space lets writes go on
	if out, code := h.sh("p", `rm "$V/f" && dd if=/dev/zero of="$V/f" bs=256K count=2 status=none`); code != 0 {
		t.Errorf("write after freeing space: %d %s", code, out)
	}
}

func TestWaitDeadlineFailsWithEIOAndLogsTheRule(t *testing.T) {
	h := newHarness(t, `
steps:
- name: p
  outputs: [{path: slow, commit: {rule: OnClose, count: 2}}]
- name: c`, harnessOpts{waitTimeout: 300 * time.Millisecond})
	h.sh("p", `echo x > "$V/slow"`)
	out, code := h.sh("c", `cat "$V/slow"`)
	if code == 0 || !strings.Contains(out, "Input/output error") {
		t.Fatalf("cat = %q (exit %d), want EIO", out, code)
	}
	log := h.logged()
	for _, want := range []string{`"path"="slow"`, `(OnClose:2, Update)`, `closes 1 of 2`, `context deadline exceeded`} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
}

func TestProducersExitWithoutCreatingGivesENOENT(t *testing.T) {
	h := newHarness(t, `
steps:
- name: p
  outputs: [{path: maybe, commit: {rule: OnClose}}]
- name: c`, harnessOpts{})
	cat := h.start("c", `cat "$V/maybe"`)
	h.blocked("c", 1)
	h.engine.Terminate("p", 0)
	if out, code := cat.wait(t); code == 0 || !strings.Contains(out, "No such file") {
		t.Errorf("cat = %q (exit %d), want ENOENT", out, code)
	}
}

func TestUnmountReleasesBlockedReaders(t *testing.T) {
	h := newHarness(t, `
steps:
- name: p
  outputs: [{path: f, commit: {rule: OnClose}}]
- name: c`, harnessOpts{})
	cat := h.start("c", `cat "$V/f"`)
	h.blocked("c", 1)
	if err := h.views["c"].Unmount(); err != nil {
		t.Fatal(err)
	}
	if out, code := cat.wait(t); code == 0 {
		t.Errorf("reader of an unmounted view succeeded: %q", out)
	}
}

func TestExcludedAndPlainFiles(t *testing.T) {
	h := newHarness(t, `
steps:
- name: p
  outputs: [{path: "res/*", commit: {rule: OnClose}}]
- name: c
exclude: ["res/*.tmp"]`, harnessOpts{})
	// an excluded file under a governed pattern is plain: no waiting, anyone writes it
	if out, code := h.sh("c", `mkdir -p "$V/res" && echo t > "$V/res/x.tmp" && cat "$V/res/x.tmp"`); code != 0 || out != "t\n" {
		t.Errorf("excluded file: %q (exit %d)", out, code)
	}
	if out, code := h.sh("p", `cat "$V/res/x.tmp"`); code != 0 || out != "t\n" {
		t.Errorf("excluded file from another view: %q (exit %d)", out, code)
	}
}

func TestReadsOfCommittedFilesMatchWhatWasWritten(t *testing.T) {
	h := newHarness(t, `
steps:
- name: p
  outputs: [{path: "blob", commit: {rule: OnClose}, fire: NoUpdate}]
- name: c`, harnessOpts{})
	sum := h.start("c", `sha256sum < "$V/blob"; tail -c 100 "$V/blob" | sha256sum; head -c 100 "$V/blob" | wc -c`)
	h.blocked("c", 1)
	h.sh("p", `head -c 3000000 /dev/urandom > "$V/blob.src.tmp"; cat "$V/blob.src.tmp" > "$V/blob"; sha256sum < "$V/blob.src.tmp"; tail -c 100 "$V/blob.src.tmp" | sha256sum`)
	want, _ := h.sh("p", `sha256sum < "$V/blob.src.tmp"; tail -c 100 "$V/blob.src.tmp" | sha256sum; echo 100`)
	if got, code := sum.wait(t); code != 0 || got != want {
		t.Errorf("reader saw\n%s\nwriter wrote\n%s", got, want)
	}
}

// A consumer that looked the file up while it was being written (Update: its open waits
// for the commit) reads every byte afterwards, also through sendfile/splice (busybox cat),
// which trusts the kernel's cached size instead of asking the filesystem. GNU cp, which
// stat()s the file before it opens it and refuses one whose inode changed in between,
// copies it.
func TestReadAfterWaitedOpenSeesTheCommittedSize(t *testing.T) {
	if _, err := exec.LookPath("busybox"); err != nil {
		t.Skip("needs busybox (its cat copies with sendfile)")
	}
	h := newHarness(t, `
steps:
- name: p
  outputs: [{path: f, commit: {rule: OnClose}, fire: Update}]
- name: c
  inputs: [f]
- name: c2
  inputs: [f]`, harnessOpts{})
	ctl := h.fifo("ctl")
	prod := h.start("p", `exec 3>"$V/f"; head -c 3000000 /dev/zero >&3; read x < `+ctl+`; head -c 1000000 /dev/zero >&3; exec 3>&-`)
	h.until("f", func(s semantics.FileStatus) bool { return s.Size == 3000000 })
	cat := h.start("c", `busybox cat "$V/f" | wc -c`)
	h.blocked("c", 1)
	// (in its own view: a second lookup of a name in one view waits in the kernel, with the
	// first, and the server does not see it)
	copied := filepath.Join(t.TempDir(), "copied")
	cp := h.start("c2", `cp "$V/f" `+copied+` && wc -c < `+copied)
	h.blocked("c2", 1)
	h.release(ctl)
	prod.wait(t)
	if out, code := cat.wait(t); code != 0 || strings.TrimSpace(out) != "4000000" {
		t.Errorf("busybox cat after a waited open read %q bytes (exit %d), want 4000000", out, code)
	}
	if out, code := cp.wait(t); code != 0 || strings.TrimSpace(out) != "4000000" {
		t.Errorf("cp started before the file was committed: %q (exit %d), want a copy of 4000000 bytes", out, code)
	}
}

// The write-to-temp-then-rename idiom works when the temporary's name matches the output
// pattern and commits at its close: Python's NamedTemporaryFile then os.replace, and a
// shell's write then mv. The consumer reads the final names, and the temporaries are gone
// from its listing. Once a reader has opened a committed temporary, its creator can no
// longer rename it away (EPERM): it has been used as an output.
func TestTempThenRenameInsideAnOutputPattern(t *testing.T) {
	h := newHarness(t, `
steps:
- name: p
  outputs: [{path: "out/*", commit: {rule: OnClose}}]
- name: c
  inputs: ["out/*"]`, harnessOpts{})
	py := `import os, sys, tempfile
d = os.path.join(os.environ["V"], "out")
f = tempfile.NamedTemporaryFile(dir=d, delete=False)
f.write(b"from python\n")
f.close()
os.replace(f.name, os.path.join(d, "py.txt"))`
	if out, code := h.sh("p", `mkdir -p "$V/out" && python3 -c '`+py+`'`); code != 0 {
		t.Fatalf("python temp-then-rename: exit %d: %s", code, out)
	}
	if out, code := h.sh("p", `echo from shell > "$V/out/.sh.tmp" && mv "$V/out/.sh.tmp" "$V/out/sh.txt"`); code != 0 {
		t.Fatalf("shell write then mv: exit %d: %s", code, out)
	}
	if out, code := h.sh("c", `cat "$V/out/py.txt" "$V/out/sh.txt"`); code != 0 || out != "from python\nfrom shell\n" {
		t.Errorf("the consumer reads %q (exit %d), want both files' bytes", out, code)
	}
	// A temporary a reader opened was used as an output: it stays.
	h.sh("p", `echo used > "$V/out/used.tmp"`)
	h.sh("c", `cat "$V/out/used.tmp"`)
	if out, code := h.sh("p", `mv "$V/out/used.tmp" "$V/out/other.txt"`); code == 0 {
		t.Errorf("renamed a committed file a reader had opened: %s", out)
	}
	// The consumer's listing of out/ ends once the producer of out/* has exited, and shows
	// the final names only.
	h.engine.Terminate("p", 0)
	if out, code := h.sh("c", `ls -A "$V/out"`); code != 0 || out != "py.txt\nsh.txt\nused.tmp\n" {
		t.Errorf("the consumer lists %q (exit %d), want the final names and the used temporary only", out, code)
	}
}

// Reads of a committed file are served by the kernel from the store file (FUSE
// passthrough): the bytes are right through read, splice (cat), and a shared mmap, and the
// server sees none of them. With passthrough off, the same reads are right and the server
// serves them.
func TestCommittedReadsPassThrough(t *testing.T) {
	h := passthroughHarness(t)
	v := h.views["c"]
	if out, code := h.sh("p", `head -c 3000000 /dev/urandom > "$V/f"`); code != 0 {
		t.Fatalf("writing f: %s", out)
	}
	want, err := os.ReadFile(filepath.Join(h.dir, "store", "f"))
	if err != nil {
		t.Fatal(err)
	}
	before := v.Stats().BytesRead
	got, err := os.ReadFile(h.path("c", "f"))
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes (%v), want the %d committed", len(got), err, len(want))
	}
	mm := `import mmap, sys
with open(sys.argv[1], "rb") as f:
    m = mmap.mmap(f.fileno(), 0, mmap.MAP_SHARED, mmap.PROT_READ)
    sys.stdout.write(str(len(m[:])))`
	if out, code := h.sh("c", `cat "$V/f" | wc -c; python3 -c '`+mm+`' "$V/f"`); code != 0 || out != fmt.Sprintf("%d\n%d", len(want), len(want)) {
		t.Errorf("cat | wc -c and a shared mmap: %q (exit %d), want %d twice", out, code, len(want))
	}
	n := v.Stats().BytesRead - before
	if v.Passthrough() && n != 0 {
		t.Errorf("the server served %d bytes of a committed file; passthrough should serve them all", n)
	}
	if !v.Passthrough() && n < int64(len(want)) {
		t.Errorf("with passthrough off the server served %d bytes of a committed file, want at least the %d read first", n, len(want))
	}
}

// Files no rule governs are read and written by the kernel from the store file itself
// (FUSE passthrough) and behave as on tmpfs: an open for reading made first sees what a
// later open writes (the inode's one backing file serves both), a shared mmap writes
// through, and at the writer's release the node store counts the file's bytes and the view
// the bytes written, although the server saw no write. With passthrough off, the same holds
// with the server serving every write.
func TestUngovernedFilesPassThrough(t *testing.T) {
	h := passthroughHarness(t)
	v := h.views["p"]
	if out, code := h.sh("p", `echo old > "$V/s" && exec 3<"$V/s" && echo new-bytes > "$V/s" && cat <&3`); code != 0 || out != "new-bytes\n" {
		t.Errorf("reading through a descriptor opened before the file was rewritten: %q (exit %d), want %q", out, code, "new-bytes\n")
	}
	mm := `import mmap, os, sys
with open(sys.argv[1], "r+b") as f:
    m = mmap.mmap(f.fileno(), 0, mmap.MAP_SHARED)
    m[0:3] = b"NEW"
    m.flush()
    m.close()`
	if out, code := h.sh("p", `python3 -c '`+mm+`' "$V/s" && cat "$V/s"`); code != 0 || out != "NEW-bytes\n" {
		t.Errorf("a shared mmap written through: %q (exit %d), want %q", out, code, "NEW-bytes\n")
	}
	if err := v.WaitWritersClosed(context.Background()); err != nil {
		t.Fatal(err)
	}
	used, written := h.store.Used(), v.Stats()
	if out, code := h.sh("p", `mkdir -p "$V/scratch" && dd if=/dev/zero of="$V/scratch/big" bs=1M count=3 status=none && cmp "$V/scratch/big" /dev/zero 2>&1`); code != 1 || !strings.Contains(out, "EOF on") {
		t.Fatalf("3 MiB written and compared with zeros: %q (exit %d), want cmp to reach the file's end", out, code)
	}
	if err := v.WaitWritersClosed(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d := h.store.Used() - used; d != 3<<20 {
		t.Errorf("the node store counts %d more bytes after a 3 MiB ungoverned file was written, want %d", d, 3<<20)
	}
	if d := v.Stats().BytesWritten - written.BytesWritten; d != 3<<20 {
		t.Errorf("the view counts %d bytes written, want %d", d, 3<<20)
	}
	d := v.Stats().BytesWrittenPassthrough - written.BytesWrittenPassthrough
	if v.Passthrough() && d != 3<<20 {
		t.Errorf("the kernel wrote %d bytes by passthrough, want all %d (the server served writes)", d, 3<<20)
	}
	if !v.Passthrough() && d != 0 {
		t.Errorf("with passthrough off the kernel wrote %d bytes by passthrough, want 0", d)
	}
}

// passthroughHarness is a producer p of the OnClose file f and its consumer c, mounted
// with the suite's passthrough mode. In mode auto, the test is skipped where FUSE
// passthrough does not work; in mode off, the views must not use it.
func passthroughHarness(t *testing.T) *harness {
	h := newHarness(t, `
steps:
- name: p
  outputs: [{path: f, commit: {rule: OnClose}}]
- name: c
  inputs: [f]`, harnessOpts{})
	if passthroughMode == PassthroughOff {
		if h.views["c"].Passthrough() || h.views["p"].Passthrough() {
			t.Fatal("views mounted with passthrough off report passthrough on")
		}
		return h
	}
	if !h.views["c"].Passthrough() {
		t.Skip("FUSE passthrough is not available here (kernel < 6.9 or no CAP_SYS_ADMIN)")
	}
	return h
}

// A copy started once a NoUpdate file exists but before its first byte gets every byte:
// the kernel answers sendfile of a file it holds as empty with EOF without asking, so the
// lookup waits for the first byte (Python's shutil.copyfile copied nothing, exit 0).
func TestCopyOfAnEmptyFileBeingWrittenWaitsForItsBytes(t *testing.T) {
	h := newHarness(t, `
steps:
- name: p
  outputs: [{path: f, commit: {rule: OnClose}, fire: NoUpdate}]
- name: c
  inputs: [f]`, harnessOpts{})
	ctl := h.fifo("ctl")
	prod := h.start("p", `exec 3>"$V/f"; read x < `+ctl+`; head -c 300000 /dev/urandom >&3; exec 3>&-`)
	h.until("f", func(s semantics.FileStatus) bool { return s.Exists })
	tmp := t.TempDir()
	cp := h.start("c", `python3 -c 'import shutil, sys; shutil.copyfile(sys.argv[1], sys.argv[2])' "$V/f" `+tmp+`/py; sha256sum < `+tmp+`/py`)
	h.blocked("c", 1)
	h.release(ctl)
	prod.wait(t)
	want, _ := h.sh("p", `sha256sum < "$V/f"`)
	if out, code := cp.wait(t); code != 0 || out != want {
		t.Errorf("shutil.copyfile of a file empty when it started: %q (exit %d), want the whole file's digest %q", out, code, want)
	}
}

// A Directory output looked up before it exists is waited for and then shown with its own
// inode: rsync -a refuses a directory whose inode changed between its stat and its open
// ("Too many levels of symbolic links"), tar -c one whose times did.
func TestDirectoryOutputLookedUpEarlyIsTheRealDirectory(t *testing.T) {
	h := newHarness(t, `
steps:
- name: p
  outputs: [{path: tree, type: Directory, commit: {rule: OnTermination}}]
- name: c
  inputs: [tree]`, harnessOpts{})
	tmp := t.TempDir()
	rs := h.start("c", `rsync -a "$V/tree/" `+tmp+`/copy/ && cat `+tmp+`/copy/a `+tmp+`/copy/sub/b`)
	h.blocked("c", 1)
	if out, code := h.sh("p", `mkdir -p "$V/tree/sub" && echo one > "$V/tree/a" && echo two > "$V/tree/sub/b"`); code != 0 {
		t.Fatalf("producer: %q (exit %d)", out, code)
	}
	h.engine.Terminate("p", 0)
	if out, code := rs.wait(t); code != 0 || out != "one\ntwo\n" {
		t.Errorf("rsync -a of a Directory output started before it existed: %q (exit %d)", out, code)
	}
}

// A second writer of an OnClose file its first writer's close committed is refused, and
// the log says why, naming the file, its rule and what to declare, at error level.
func TestWriteToACommittedFileIsRefusedAndLogged(t *testing.T) {
	h := newHarness(t, `
steps:
- name: p
  replicas: 2
  outputs: [{path: log, commit: {rule: OnClose}}]`, harnessOpts{})
	if out, code := h.sh("p", `echo first > "$V/log"`); code != 0 {
		t.Fatalf("first writer: %q (exit %d)", out, code)
	}
	if out, code := h.sh("p", `echo second >> "$V/log"`); code == 0 || !strings.Contains(out, "Operation not permitted") {
		t.Errorf("second writer of a committed file: %q (exit %d), want EPERM", out, code)
	}
	logged := h.logged()
	for _, want := range []string{"change refused: the file is committed", `"path"="log"`, `OnClose:1`, "commit.count"} {
		if !strings.Contains(logged, want) {
			t.Errorf("log does not say %q:\n%s", want, logged)
		}
	}
}
