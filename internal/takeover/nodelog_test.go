package takeover

import (
	"path/filepath"
	"syscall"
	"testing"

	"github.com/go-logr/logr"
)

// A later server of the mount finds every placeholder an earlier one recorded.
func TestNodeLogReplaysWhatAnEarlierServerRecorded(t *testing.T) {
	name := filepath.Join(t.TempDir(), "state", "views", "pod")
	first, err := OpenNodeLog(name, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	paths := map[string]uint32{"late.txt": syscall.S_IFREG | 0o444, "dir with space/\"q\"": syscall.S_IFDIR | 0o555}
	for p, mode := range paths {
		first.Record(PlaceholderIno(p), p, mode)
	}
	first.Close()

	second, err := OpenNodeLog(name, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	for p, mode := range paths {
		ino := PlaceholderIno(p)
		if !IsPlaceholder(ino) {
			t.Errorf("PlaceholderIno(%q) = %#x: not a placeholder ID", p, ino)
		}
		got, ok := second.Get(ino)
		if !ok || got != (Placeholder{Path: p, Mode: mode}) {
			t.Errorf("Get(%#x) = %+v, %v; want %q mode %o", ino, got, ok, p, mode)
		}
	}
}

// A view that does not serve a handed-over descriptor has no node log: it records
// nothing, and finds nothing.
func TestNilNodeLogRecordsNothing(t *testing.T) {
	var nl *NodeLog
	nl.Record(PlaceholderIno("a"), "a", syscall.S_IFREG)
	if _, ok := nl.Get(PlaceholderIno("a")); ok {
		t.Error("a nil node log found a placeholder")
	}
	nl.Close()
}
