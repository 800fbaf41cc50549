package streamfs

import (
	"testing"

	"github.com/sluice-io/sluice/internal/semantics"
)

// A file renamed while a writer holds it open is written under its new name, as on a
// local file system (log rotation, `mv` of a file a program still writes, journals): the
// bytes written after the rename, and the writer's close, are the new name's, in the
// rules and in the store's accounting. The old name is gone for the rules: nothing can
// commit under it.
func TestWritesAfterRenameGoToTheNewName(t *testing.T) {
	h := newHarness(t, `
steps:
- name: p
  outputs:
  - {path: "out/*", commit: {rule: OnClose, count: 2}}
  - {path: "tmp/*", commit: {rule: OnClose, count: 3}}`, harnessOpts{})
	const n = 300000
	// out/b: the rename counts one close, the writer's close the second: it commits with
	// the bytes written through the descriptor opened as out/a.
	if out, code := h.sh("p", `mkdir -p "$V/out" "$V/tmp" && exec 3>"$V/out/a" && mv "$V/out/a" "$V/out/b" &&
		head -c 300000 /dev/zero >&3 && exec 3>&-`); code != 0 {
		t.Fatalf("write after rename: exit %d: %s", code, out)
	}
	h.until("out/b", func(s semantics.FileStatus) bool { return s.Committed })
	if s := h.engine.Status("out/b"); s.Size != n || s.Closes != 2 {
		t.Errorf("out/b committed with size %d after %d closes, want %d bytes, 2 closes", s.Size, s.Closes, n)
	}
	if s := h.engine.Status("out/a"); s.Exists || s.Closes != 0 || s.Size != 0 {
		t.Errorf("the old name out/a is still known to the rules: %+v", s)
	}
	// tmp/b, not committed: its state has the bytes and the close, and once removed the
	// store counts nothing.
	if out, code := h.sh("p", `exec 3>"$V/tmp/a" && mv "$V/tmp/a" "$V/tmp/b" && head -c 300000 /dev/zero >&3 && exec 3>&-`); code != 0 {
		t.Fatalf("write after rename: exit %d: %s", code, out)
	}
	// close(2) returns before the kernel's RELEASE reaches the view and counts the close.
	h.until("tmp/b", func(s semantics.FileStatus) bool { return s.Closes >= 2 })
	if s := h.engine.Status("tmp/b"); !s.Exists || s.Committed || s.Size != n || s.Closes != 2 {
		t.Errorf("tmp/b after the writer closed: %+v, want %d bytes, 2 closes, not committed", s, n)
	}
	if s := h.engine.Status("tmp/a"); s.Exists || s.Closes != 0 || s.Size != 0 {
		t.Errorf("the old name tmp/a is still known to the rules: %+v", s)
	}
	if used := h.store.Used(); used != 2*n {
		t.Errorf("the store counts %d bytes for out/b and tmp/b, want %d", used, 2*n)
	}
	if out, code := h.sh("p", `rm "$V/tmp/b"`); code != 0 {
		t.Fatalf("rm tmp/b: exit %d: %s", code, out)
	}
	if used := h.store.Used(); used != n {
		t.Errorf("the store counts %d bytes after tmp/b was removed, want out/b's %d", used, n)
	}
}

// A directory renamed while a writer holds a file beneath it open, and a file exchanged
// with another (RENAME_EXCHANGE) while open, take their writers with them: what is
// written afterwards is counted under the names the files have now, and nothing stays
// counted once they are removed.
func TestWritesAfterDirectoryRenameAndExchange(t *testing.T) {
	h := newHarness(t, `
steps:
- name: p
  outputs:
  - {path: "out/*", commit: {rule: OnClose}}`, harnessOpts{})
	const n = 300000
	out, code := h.sh("p", `mkdir -p "$V/free/d" && exec 3>"$V/free/d/f" && mv "$V/free/d" "$V/free/e" &&
		head -c 300000 /dev/zero >&3 && exec 3>&- &&
		: > "$V/free/y" && exec 4>"$V/free/x" && $PROBE rename2 "$V/free/x" "$V/free/y" exchange &&
		head -c 300000 /dev/zero >&4 && exec 4>&- && stat -c %s "$V/free/e/f" "$V/free/y" "$V/free/x"`)
	if code != 0 || out != "ok300000\n300000\n0\n" {
		t.Fatalf("writes after a directory rename and an exchange: exit %d: %q", code, out)
	}
	if used := h.store.Used(); used != 2*n {
		t.Errorf("the store counts %d bytes for free/e/f and free/y, want %d", used, 2*n)
	}
	if out, code := h.sh("p", `rm -r "$V/free/e" "$V/free/x" "$V/free/y"`); code != 0 {
		t.Fatalf("rm: exit %d: %s", code, out)
	}
	if used := h.store.Used(); used != 0 {
		t.Errorf("the store counts %d bytes after every file was removed, want 0", used)
	}
}
