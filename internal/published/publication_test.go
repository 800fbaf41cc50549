package published

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A record is read back as written, a later record of another UID replaces it whole, and
// what is not a record the plugin wrote (a symlink in its place, an oversized file) is
// refused rather than followed or read without bound.
func TestRecordAndLoad(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ns", "wf")
	if _, ok, err := Load(filepath.Join(dir, Dir)); ok || err != nil {
		t.Fatalf("load before any record: ok %v, %v; want none", ok, err)
	}
	for _, uid := range []string{"uid-1", "uid-1", "uid-2"} {
		if err := Record(dir, uid); err != nil {
			t.Fatalf("record %s: %v", uid, err)
		}
		if got, ok, err := Load(filepath.Join(dir, Dir)); got != uid || !ok || err != nil {
			t.Fatalf("load after recording %s: %q, %v, %v", uid, got, ok, err)
		}
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("record directory: %v, %v; want mode 0700", fi.Mode(), err)
	}
	for _, uid := range []string{"", strings.Repeat("u", maxUID+1)} {
		if err := Record(dir, uid); err == nil {
			t.Errorf("record of UID %q (%d bytes) succeeded", uid[:min(len(uid), 8)], len(uid))
		}
	}

	bad := t.TempDir()
	target := filepath.Join(t.TempDir(), "elsewhere")
	os.WriteFile(target, []byte("uid-of-someone"), 0o600)
	if err := os.Symlink(target, filepath.Join(bad, UIDFile)); err != nil {
		t.Fatal(err)
	}
	if uid, ok, err := Load(bad); err == nil || ok {
		t.Errorf("load of a symlinked record: %q, %v, %v; want an error", uid, ok, err)
	}
	big := t.TempDir()
	os.WriteFile(filepath.Join(big, UIDFile), []byte(strings.Repeat("u", maxUID+1)), 0o600)
	if _, ok, err := Load(big); err == nil || ok {
		t.Errorf("load of a %d-byte record: %v, %v; want an error", maxUID+1, ok, err)
	}
}
