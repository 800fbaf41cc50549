package streamfs

import (
	"strings"
	"testing"
)

// A truncation that makes a file far larger than the volume's sizeLimit succeeds, as on
// tmpfs (pjdfstest truncate/12.t and ftruncate/12.t): the hole allocates nothing. Writing
// into that hole allocates, and past the limit fails with ENOSPC; fallocate(1) is held to
// the limit too.
func TestSparseFileFarLargerThanTheLimit(t *testing.T) {
	const mib = 1 << 20
	h := newHarness(t, `
steps:
- name: p
  outputs:
  - {path: g, commit: {rule: OnClose, count: 2}, fire: NoUpdate}
  - {path: a, commit: {rule: OnClose, count: 2}}`, harnessOpts{limit: mib, tmpfs: true})
	const huge = "999999999999999"
	for _, name := range []string{"free", "g"} { // ungoverned, then a governed output
		out, code := h.sh("p", `truncate -s `+huge+` "$V/`+name+`" && stat -c %s "$V/`+name+`"`)
		if code != 0 || out != huge+"\n" {
			t.Fatalf("truncate -s %s %s: exit %d, %q; want success and stat giving the size", huge, name, code, out)
		}
	}
	if used := h.store.Used(); used != 0 {
		t.Errorf("the store counts %d bytes for two empty sparse files, want 0", used)
	}
	out, code := h.sh("p", `dd if=/dev/zero of="$V/g" bs=256K count=8 conv=notrunc status=none`)
	if code == 0 || !strings.Contains(out, "No space left on device") {
		t.Errorf("dd of 2 MiB into the hole of g with a 1 MiB limit: exit %d %q; want ENOSPC", code, out)
	}
	if used := h.store.Used(); used != mib {
		t.Errorf("the store counts %d bytes after filling the limit, want %d", used, mib)
	}
	if st, err := h.store.Lstat("g"); err != nil || st.Size != 999999999999999 {
		t.Errorf("g after the writes: size %d (%v), want %s", st.Size, err, huge)
	}
	h.sh("p", `rm "$V/free"; truncate -s 0 "$V/g"`) // a shrinking truncation frees
	if used := h.store.Used(); used != 0 {
		t.Errorf("the store counts %d bytes after g was truncated to 0, want 0", used)
	}
	if out, code := h.sh("p", `fallocate -l 2MiB "$V/a"`); code == 0 || !strings.Contains(out, "No space left on device") {
		t.Errorf("fallocate of 2 MiB with a 1 MiB limit: exit %d %q; want ENOSPC", code, out)
	}
	if out, code := h.sh("p", `fallocate -l 512KiB "$V/a" && stat -c %s "$V/a"`); code != 0 || out != "524288\n" {
		t.Errorf("fallocate of 512 KiB: exit %d %q", code, out)
	}
	if used := h.store.Used(); used != mib/2 {
		t.Errorf("the store counts %d bytes after fallocate of 512 KiB, want %d", used, mib/2)
	}
}

// A step that fills its memory tier's inodes (a tmpfs of the node plugin's has nr_inodes
// from its size) gets ENOSPC, as from a full tmpfs, for files, directories and symlinks
// alike, and the sidecar's log names the tier (its directory) and the path: the kernel's
// ENOSPC alone would not say which limit was reached. Refusals are logged at the first
// and every power of two, not for each.
func TestOutOfInodesIsENOSPCNamingTheTier(t *testing.T) {
	h := newHarness(t, `
steps:
- name: p
  outputs: [{path: "out/*", commit: {rule: OnClose}}]`, harnessOpts{tmpfs: true, inodes: 64})
	out, code := h.sh("p", `mkdir -p "$V/out"; i=0; while [ $i -lt 200 ]; do touch "$V/out/f$i" 2>/dev/null || break; i=$((i+1)); done; echo "made $i"
mkdir "$V/d" 2>&1; ln -s x "$V/l" 2>&1; touch "$V/plain" 2>&1; touch "$V/out/g" 2>&1; true`)
	if code != 0 || !strings.Contains(out, "made ") || strings.Contains(out, "made 200") {
		t.Fatalf("creating 200 files in a tier of 64 inodes: exit %d, %q; want a refusal before the 200th", code, out)
	}
	if n := strings.Count(out, "No space left on device"); n < 4 {
		t.Errorf("after the inodes ran out, mkdir, ln -s and a new plain file: %q, want ENOSPC for each", out)
	}
	h.logMu.Lock()
	logs := strings.Join(h.logs, "\n")
	h.logMu.Unlock()
	want := `"tier"="memory tier" "dir"="` + h.dir + `/store"`
	if !strings.Contains(logs, "refused: the node store's tier is out of inodes (ENOSPC)") || !strings.Contains(logs, want) {
		t.Errorf("the view's log:\n%s\nwant a line naming the tier: %s", logs, want)
	}
	if lines := strings.Count(logs, "out of inodes"); lines < 2 || lines > 3 {
		t.Errorf("%d log lines for 4 refusals, want those of the 1st, 2nd and 4th", lines)
	}
}
