package streamfs

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/store"
)

// as runs script in step's view as uid/gid 1000 with no capabilities and umask 002, as a
// container's non-root user would (setpriv, util-linux), and returns its output and exit
// code.
func (h *harness) as(step, script string) (string, int) {
	h.t.Helper()
	return h.sh(step, "exec setpriv --reuid=1000 --regid=1000 --clear-groups --inh-caps=-all --bounding-set=-all sh -c 'umask 002; "+strings.ReplaceAll(script, "'", `'\''`)+"'")
}

// reachable lets other users walk down to the harness's views: test directories are
// made 0700.
func (h *harness) reachable() {
	h.t.Helper()
	root := os.Getenv("TMPDIR")
	for d := h.dir; strings.HasPrefix(d, root) && len(d) >= len(root); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			h.t.Fatal(err)
		}
	}
}

const freeSpec = `
volume: {mountPath: /data}
steps:
- name: p
  template: {spec: {containers: [{name: c, image: x}]}}
  outputs:
  - {path: "out/*", commit: {rule: OnClose}}
- name: c
  template: {spec: {containers: [{name: c, image: x}]}}
  inputs: ["out/*"]
`

// With default_permissions the kernel checks every access against the owner and mode a
// view reports, and new entries belong to their creator, with the mode it asked for:
// what a program running as a non-root user in a step expects of any file system.
func TestOwnersAndPermissionsAsOnALocalFileSystem(t *testing.T) {
	for _, owners := range []store.Owners{store.OwnersReal, store.OwnersXattr} {
		t.Run(owners.String(), func(t *testing.T) {
			h := newHarness(t, freeSpec, harnessOpts{owners: &owners})
			h.reachable()
			if out, code := h.sh("p", `mkdir $V/free && chmod 777 $V/free && umask 077 && echo secret > $V/free/secret && mkdir $V/free/sg && chgrp 50 $V/free/sg && chmod 2777 $V/free/sg`); code != 0 {
				t.Fatalf("setup as root: %d %s", code, out)
			}
			out, code := h.as("p", `cd $V/free && touch f && mkdir d && stat -c '%n %a %u %g' f d`)
			if code != 0 || out != "f 664 1000 1000\nd 775 1000 1000\n" {
				t.Errorf("entries made by uid 1000 with umask 002: %d %q, want f 664 and d 775 owned by 1000:1000", code, out)
			}
			for _, refused := range []string{
				`cat $V/free/secret`,
				`echo x >> $V/free/secret`,
				`chmod 666 $V/free/secret`,
				`truncate -s 0 $V/free/secret`,
				`chown 1000 $V/free/secret`,
			} {
				if out, code := h.as("p", refused); code == 0 {
					t.Errorf("uid 1000 ran %q on root's 0600 file: %q", refused, out)
				}
			}
			if out, code := h.as("p", `chmod 600 $V/free/f && stat -c %a $V/free/f`); code != 0 || out != "600\n" {
				t.Errorf("owner's chmod: %d %q", code, out)
			}
			if out, code := h.sh("p", `chown 1000:1000 $V/free/secret && stat -c '%u %g' $V/free/secret`); code != 0 || out != "1000 1000\n" {
				t.Errorf("root's chown: %d %q", code, out)
			}
			if out, code := h.as("p", `cat $V/free/secret`); code != 0 || out != "secret\n" {
				t.Errorf("the new owner reads its file: %d %q", code, out)
			}
			out, code = h.as("p", `cd $V/free/sg && touch x && mkdir y && stat -c '%n %g %A' x y`)
			if code != 0 || out != "x 50 -rw-rw-r--\ny 50 drwxrwsr-x\n" {
				t.Errorf("entries in a set-group-ID directory: %d %q, want group 50 and y set-group-ID", code, out)
			}

			// The owner record is the store's own: steps neither see nor change it.
			if out, _ := h.sh("p", `$PROBE listxattr $V/free/f; $PROBE setxattr $V/free/f user.sluice.owner xx; echo; $PROBE getxattr $V/free/f user.sluice.owner`); strings.Contains(out, "user.sluice.owner") || !strings.Contains(out, "errno 1 ") || !strings.Contains(out, "errno 61 ") {
				t.Errorf("the owner record shows through: %q", out)
			}
			var st syscall.Stat_t
			if err := syscall.Lstat(filepath.Join(h.store.Dir(), "free", "f"), &st); err != nil {
				t.Fatal(err)
			}
			if want := map[store.Owners]uint32{store.OwnersReal: 1000, store.OwnersXattr: uint32(os.Geteuid())}[owners]; st.Uid != want {
				t.Errorf("store file's real owner %d, want %d (%s)", st.Uid, want, owners)
			}
		})
	}
}

// A write by a caller without CAP_FSETID clears a file's set-user-ID bit, and its
// set-group-ID bit when the group may execute it, as on tmpfs (should_remove_suid): through
// the server's direct I/O writes of a governed file (the kernel asks with
// FUSE_WRITE_KILL_SUIDGID), and for an ungoverned file too, although the kernel writes those
// itself (passthrough) with the server's credentials.
func TestWritesClearSetIDBits(t *testing.T) {
	for _, tc := range []struct{ name, dir string }{{"governed", "out"}, {"ungoverned", "free"}} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, freeSpec, harnessOpts{})
			h.reachable()
			// Root holds each file open (a governed one commits at its close), hands it to
			// uid 1000 with the bits set, and uid 1000 appends.
			script := `mkdir -p $V/D && chmod 777 $V/D && for m in 6775 6664; do
				exec 3>$V/D/f$m && chown 1000:1000 $V/D/f$m && chmod $m $V/D/f$m &&
				setpriv --reuid=1000 --regid=1000 --clear-groups --inh-caps=-all --bounding-set=-all sh -c "echo more >> $V/D/f$m" && exec 3>&- || exit 1
			done && stat -c '%n %a' $V/D/f6775 $V/D/f6664`
			out, code := h.sh("p", strings.ReplaceAll(script, "/D", "/"+tc.dir))
			want := strings.ReplaceAll("/D/f6775 775\n/D/f6664 2664\n", "/D/", h.path("p", tc.dir)+"/")
			if code != 0 || out != want {
				t.Errorf("after uid 1000 appended: %d %q, want %q (set-user-ID gone; set-group-ID gone only where the group may execute)", code, out, want)
			}
		})
	}
}

// Hard links, special files, renameat2 flags and user xattrs work where no rule governs
// a name; under a rule only what the rules can account for is allowed.
func TestLinksSpecialFilesRenameFlagsAndXattrs(t *testing.T) {
	h := newHarness(t, freeSpec, harnessOpts{})
	if out, code := h.sh("p", `
		mkdir $V/free $V/out || exit 1
		echo one > $V/free/a
		ln $V/free/a $V/free/b
		mkfifo $V/free/fifo
		echo two > $V/free/x
		stat -c '%n %h %F' $V/free/a $V/free/fifo
		$PROBE rename2 $V/free/a $V/free/x noreplace; echo
		$PROBE rename2 $V/free/a $V/free/x exchange; echo
		cat $V/free/a $V/free/x
		$PROBE setxattr $V/free/x user.k v; echo; $PROBE getxattr $V/free/x user.k; echo
		$PROBE listxattr $V/free/x`); code != 0 {
		t.Fatalf("ungoverned: %d %s", code, out)
	} else {
		want := strings.Join([]string{
			h.path("p", "free/a") + " 2 regular file",
			h.path("p", "free/fifo") + " 1 fifo",
			"errno 17 file exists",
			"ok",
			"two", "one",
			"ok", "v",
			"user.k", "",
		}, "\n")
		if out != want {
			t.Errorf("ungoverned names:\n%s\nwant:\n%s", out, want)
		}
	}

	out, code := h.sh("p", `
		echo data > $V/out/a
		ln $V/out/a $V/out/b; echo "link committed: $?"
		ln $V/free/b $V/out/c 2>/dev/null; echo "link ungoverned bytes: $?"
		ln $V/out/a $V/free/y 2>/dev/null; echo "ungoverned name for governed bytes: $?"
		mkfifo $V/out/p 2>/dev/null; echo "fifo under a rule: $?"
		$PROBE rename2 $V/out/a $V/free/x exchange; echo
		$PROBE rename2 $V/out/b $V/out/a noreplace; echo`)
	want := "link committed: 0\nlink ungoverned bytes: 1\nungoverned name for governed bytes: 1\nfifo under a rule: 1\nerrno 22 invalid argument\nerrno 17 file exists\n"
	if code != 0 || out != want {
		t.Errorf("governed names: %d\n%s\nwant:\n%s", code, out, want)
	}
	if s := h.engine.Status("out/b"); !s.Committed || s.Size != 5 {
		t.Errorf("the rules saw the link %+v, want committed with 5 bytes", s)
	}
	if out, code := h.sh("c", `cat $V/out/b; $PROBE setxattr $V/out/b user.k v`); code == 0 || !strings.HasPrefix(out, "data\nerrno 1 ") {
		t.Errorf("consumer reads the link and may not set its xattrs: %d %q", code, out)
	}
}

// A hard link under a rule made by the step right after the close that commits its source
// (tar -x, cp -a) waits for that commit: close(2) returns before the kernel's RELEASE,
// which counts the close, reaches the view.
func TestLinkWaitsForTheCommitOfAClose(t *testing.T) {
	h := newHarness(t, freeSpec, harnessOpts{})
	if out, code := h.sh("p", `mkdir $V/out`); code != 0 {
		t.Fatal(out)
	}
	ctl := h.fifo("ctl")
	prod := h.start("p", fmt.Sprintf(holdScript, "out/a", "data", ctl))
	h.until("out/a", func(s semantics.FileStatus) bool { return s.Size == 4 })
	ln := h.start("p", `ln "$V/out/a" "$V/out/b"`)
	h.blocked("p", 1) // the link waits for out/a's commit
	h.release(ctl)
	if out, code := prod.wait(t); code != 0 {
		t.Fatalf("producer: %d %s", code, out)
	}
	if out, code := ln.wait(t); code != 0 {
		t.Fatalf("ln of a file whose commit was on its way: %d %s", code, out)
	}
	if s := h.engine.Status("out/b"); !s.Committed || s.Size != 4 {
		t.Errorf("the link %+v, want committed with 4 bytes", s)
	}
}

// A name that is not UTF-8 can match no rule and is refused as an illegal byte sequence,
// not reported missing.
func TestNonUTF8NamesAreIllegalByteSequences(t *testing.T) {
	h := newHarness(t, freeSpec, harnessOpts{})
	out, code := h.sh("p", `touch "$V/$(printf 'bad\377')"; ls "$V/$(printf 'bad\377')"`)
	if code == 0 || strings.Count(out, "Invalid or incomplete multibyte or wide character") != 2 {
		t.Errorf("non-UTF-8 name: %d %q, want EILSEQ twice", code, out)
	}
}

// GNU tar extracting into an OnClose output: each file commits when tar closes it, and
// tar then sets its mode and times (allowed to the producer of a committed file), makes
// a hard link to it (a new name for committed bytes) and a symlink.
func TestTarExtractsIntoAnOnCloseOutput(t *testing.T) {
	h := newHarness(t, `
volume: {mountPath: /data}
steps:
- name: p
  template: {spec: {containers: [{name: c, image: x}]}}
  outputs:
  - {path: "tree/*", commit: {rule: OnClose}}
- name: c
  template: {spec: {containers: [{name: c, image: x}]}}
  inputs: ["tree/*"]
`, harnessOpts{})
	archive := filepath.Join(h.dir, "a.tar")
	f, err := os.Create(archive)
	if err != nil {
		t.Fatal(err)
	}
	mtime := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	tw := tar.NewWriter(f)
	for _, hd := range []*tar.Header{
		{Name: "file", Mode: 0o750, Size: 6, ModTime: mtime, Typeflag: tar.TypeReg},
		{Name: "hard", Linkname: "file", ModTime: mtime, Typeflag: tar.TypeLink},
		{Name: "soft", Linkname: "file", Mode: 0o777, ModTime: mtime, Typeflag: tar.TypeSymlink},
	} {
		if err := tw.WriteHeader(hd); err != nil {
			t.Fatal(err)
		}
		if hd.Typeflag == tar.TypeReg {
			tw.Write([]byte("hello\n"))
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if out, code := h.sh("p", "mkdir $V/tree && tar -xpf "+archive+" -C $V/tree && stat -c '%n %a %h %Y' $V/tree/file $V/tree/hard"); code != 0 ||
		out != h.path("p", "tree/file")+" 750 2 981173106\n"+h.path("p", "tree/hard")+" 750 2 981173106\n" {
		t.Fatalf("tar -x: %d %q", code, out)
	}
	for _, p := range []string{"tree/file", "tree/hard", "tree/soft"} {
		if !h.engine.Status(p).Committed {
			t.Errorf("%s not committed: %+v", p, h.engine.Status(p))
		}
	}
	if out, code := h.sh("c", "cat $V/tree/file $V/tree/hard $V/tree/soft"); code != 0 || out != "hello\nhello\nhello\n" {
		t.Errorf("consumer reads: %d %q", code, out)
	}
}

// tmpfilePy makes an unnamed file with O_TMPFILE in directory argv[1], writes argv[2] to
// it, fstats it, then, if argv[3] is given, links it there as open(2) documents
// (linkat(AT_FDCWD, "/proc/self/fd/N", AT_FDCWD, path, AT_SYMLINK_FOLLOW); Python's
// os.link would use link(2), which does not follow the /proc link) and writes once more
// through its descriptor; it prints what each step gave.
const tmpfilePy = `python3 -c '
import ctypes, os, sys
fd = os.open(sys.argv[1], os.O_TMPFILE | os.O_RDWR, 0o640)
os.write(fd, sys.argv[2].encode())
print("size", os.fstat(fd).st_size, "mode", oct(os.fstat(fd).st_mode & 0o777))
if len(sys.argv) > 3:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.linkat(-100, b"/proc/self/fd/%d" % fd, -100, sys.argv[3].encode(), 0x400) != 0:
        sys.exit("linkat: " + os.strerror(ctypes.get_errno()))
    try:
        os.write(fd, b"more")
        print("write after link: ok")
    except OSError as e:
        print("write after link:", e.strerror)
'`

// open(2) with O_TMPFILE makes an unnamed file where the step may create files; linked
// into place (the atomic-create idiom of linkat on /proc/self/fd), it is a file like any
// other, and under an output's name it commits at the link, as a temporary renamed into
// place does. Where the step may not create files (its inputs) it is refused.
func TestTmpfileLinkedIntoPlace(t *testing.T) {
	h := newHarness(t, freeSpec, harnessOpts{})
	if out, code := h.sh("p", `mkdir $V/free && `+tmpfilePy+` $V/free data $V/free/a && cat $V/free/a && echo && ls $V/free`); code != 0 ||
		out != "size 4 mode 0o640\nwrite after link: ok\ndatamore\na\n" {
		t.Errorf("unnamed file linked where no rule governs: %d %q", code, out)
	}
	if out, code := h.sh("p", tmpfilePy+` $V/free scratch && ls $V/free`); code != 0 || out != "size 7 mode 0o640\na\n" {
		t.Errorf("unnamed file never linked: %d %q, want it gone with no name left", code, out)
	}
	reader := h.start("c", `cat $V/out/x`)
	h.blocked("c", 1)
	if out, code := h.sh("p", `mkdir -p $V/out && `+tmpfilePy+` $V/out result $V/out/x`); code != 0 ||
		out != "size 6 mode 0o640\nwrite after link: Operation not permitted\n" {
		t.Errorf("unnamed file linked as an output: %d %q, want its bytes final at the link", code, out)
	}
	if !h.engine.Status("out/x").Committed {
		t.Errorf("out/x not committed at its link: %+v", h.engine.Status("out/x"))
	}
	if out, code := reader.wait(t); code != 0 || out != "result" {
		t.Errorf("the consumer waiting for out/x read %q (exit %d), want result", out, code)
	}
	if out, code := h.sh("c", tmpfilePy+` $V/out x`); code == 0 || !strings.Contains(out, "Permission denied") {
		t.Errorf("O_TMPFILE among a consumer's inputs: %d %q, want EACCES", code, out)
	}
}

// A failed attempt withdraws the files it made alone, but not one that other instances
// write too (closes summed over writers): their bytes and closes stay.
func TestWithdrawKeepsFilesOtherInstancesWrite(t *testing.T) {
	h := newHarness(t, `
steps:
- name: p
  replicas: 2
  outputs:
  - {path: "own-*", commit: {rule: OnClose}}
  - {path: log, commit: {rule: OnClose, count: 2}}
- name: c
  inputs: ["own-*", log]`, harnessOpts{})
	if out, code := h.sh("p", `echo mine > $V/own-0 && echo line >> $V/log`); code != 0 {
		t.Fatalf("writing: %d %s", code, out)
	}
	// As the runner and the sidecar do: the kernel releases the write handles (and the
	// closes count) after the processes exited.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := h.views["p"].WaitWritersClosed(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := h.views["p"].Withdraw("attempt 1 failed")
	if err != nil || len(got) != 1 || got[0] != "own-0" {
		t.Errorf("Withdraw = %v, %v; want only own-0", got, err)
	}
	if st := h.engine.Status("log"); !st.Exists || st.Closes != 1 {
		t.Errorf("log after the withdrawal: %+v, want it kept with its close", st)
	}
	if _, err := os.Stat(h.path("p", "own-0")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("own-0 is still in the view after its withdrawal (%v)", err)
	}
}

// A retry in the same view writes a withdrawn file anew: the kernel's entry of the failed
// attempt's file (a writer's own files are cached) is dropped before Withdraw returns, so
// the retry's open creates the file instead of reaching the withdrawn one's node. Twenty
// withdrawals and rewrites in a row: each commits its own bytes.
func TestRetryInTheSameViewWritesAWithdrawnFileAnew(t *testing.T) {
	h := newHarness(t, `
steps:
- name: p
  outputs: [{path: out, commit: {rule: OnClose, count: 2}}]`, harnessOpts{tmpfs: true})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := 0; i < 20; i++ {
		if out, code := h.sh("p", `echo half > $V/out`); code != 0 {
			t.Fatalf("attempt %d: %d %s", i, code, out)
		}
		if err := h.views["p"].WaitWritersClosed(ctx); err != nil {
			t.Fatal(err)
		}
		if got, err := h.views["p"].Withdraw("attempt failed"); err != nil || len(got) != 1 {
			t.Fatalf("round %d: Withdraw = %v, %v", i, got, err)
		}
		if out, code := h.sh("p", `echo a > $V/out && echo b >> $V/out`); code != 0 {
			t.Fatalf("round %d: the retry's writes: exit %d: %s", i, code, out)
		}
		h.until("out", func(s semantics.FileStatus) bool { return s.Committed })
		if b, err := readStore(h.store, "out"); err != nil || string(b) != "a\nb\n" {
			t.Fatalf("round %d: out = %q, %v; want the retry's a, b", i, b, err)
		}
		if _, err := h.views["p"].Withdraw("next round"); err != nil {
			t.Fatal(err)
		}
	}
}
