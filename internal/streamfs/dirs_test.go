package streamfs

import (
	"strings"
	"testing"
)

// A consumer's lookup of a plain directory that its inputs will live in, made by no one
// yet, waits for the directory and then shows the directory itself (its inode), never a
// stand-in: rsync -a met the real directory under two parents ("Too many levels of
// symbolic links"). The directory may be made by a producer on this node (mkdir) or, on
// another node, appear in the store with the first governed file the transport creates in
// it. The producers see it missing until they make it, and a consumer gets ENOENT once
// every producer has exited without making it, as on any file system.
func TestLookupOfADirectoryNotMadeYetWaitsForIt(t *testing.T) {
	h := newHarness(t, `
steps:
- name: p
  outputs: [{path: d/f, commit: {rule: OnClose}}]
- name: r
  outputs: [{path: e/g, commit: {rule: OnClose}}]
- name: x
  outputs: [{path: k/m, commit: {rule: OnClose}}]
- name: c
  inputs: [d/f, e/g, k/m]`, harnessOpts{})
	// made by a producer of this node
	st := h.start("c", `stat -c %i "$V/d"`)
	h.blocked("c", 1)
	if out, code := h.sh("p", `test -e "$V/d" || echo absent`); code != 0 || out != "absent\n" {
		t.Errorf("the producer of d/f sees d before it is made: %q (exit %d)", out, code)
	}
	if out, code := h.sh("p", `mkdir "$V/d"`); code != 0 {
		t.Fatalf("producer: %q (exit %d)", out, code)
	}
	want, _ := h.sh("p", `stat -c %i "$V/d"`)
	if got, code := st.wait(t); code != 0 || got != want {
		t.Errorf("inode of d looked up before it was made: %q (exit %d), want the directory's %q", got, code, want)
	}

	// made on another node: the transport makes the parents of the first governed file,
	// then tells the engine
	st = h.start("c", `stat -c %i "$V/e"`)
	h.blocked("c", 1)
	if err := h.store.MkdirAll("e"); err != nil {
		t.Fatal(err)
	}
	if err := h.engine.Create("e/g", false); err != nil {
		t.Fatal(err)
	}
	want, _ = h.sh("r", `stat -c %i "$V/e"`)
	if got, code := st.wait(t); code != 0 || got != want {
		t.Errorf("inode of e looked up before it came from another node: %q (exit %d), want the directory's %q", got, code, want)
	}

	// never made
	ls := h.start("c", `ls "$V/k" 2>&1`)
	h.blocked("c", 1)
	h.engine.Terminate("x", 0)
	if out, code := ls.wait(t); code == 0 || !strings.Contains(out, "No such file or directory") {
		t.Errorf("listing of a directory whose producers all exited without making it: %q (exit %d), want ENOENT", out, code)
	}
}

// tar -c of a Directory output while its producer adds entries, slower than the kernel's
// one-second cache of the directory's attributes, archives the whole tree and exits 0:
// a consumer sees a governed directory's times and size as its view first showed them,
// so tar, which compares them before and after reading the directory, does not find it
// "changed as we read it" (exit 1).
func TestTarOfADirectoryOutputBeingWritten(t *testing.T) {
	h := newHarness(t, `
steps:
- name: p
  outputs: [{path: d/tree, type: Directory, commit: {rule: OnTermination}}]
- name: c
  inputs: [d/tree]`, harnessOpts{})
	if out, code := h.sh("p", `mkdir -p "$V/d/tree"`); code != 0 {
		t.Fatalf("producer: %q (exit %d)", out, code)
	}
	tmp := t.TempDir()
	tr := h.start("c", `tar -cf `+tmp+`/a.tar -C "$V/d" tree && tar -tf `+tmp+`/a.tar | LC_ALL=C sort`)
	h.blocked("c", 1) // the listing waits for the commit
	if out, code := h.sh("p", `mkdir "$V/d/tree/sub" && echo one > "$V/d/tree/a" && sleep 1.5 && echo two > "$V/d/tree/sub/b"`); code != 0 {
		t.Fatalf("producer: %q (exit %d)", out, code)
	}
	h.engine.Terminate("p", 0)
	if out, code := tr.wait(t); code != 0 || out != "tree/\ntree/a\ntree/sub/\ntree/sub/b\n" {
		t.Errorf("tar -c of a Directory output being written: %q (exit %d)", out, code)
	}
}
