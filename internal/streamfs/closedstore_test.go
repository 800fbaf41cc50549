package streamfs

import (
	"errors"
	"os"
	"syscall"
	"testing"
)

// A view that still serves once its node store was closed (its mount lazily detached
// while its node stopped) answers every request that needs the store with EIO, the error
// a program expects of a device that went away, never go-fuse's ENOSYS (which a create
// reports as "operation not supported", and programs take for a feature to do without).
func TestClosedStoreIsAnIOError(t *testing.T) {
	h := newHarness(t, `
steps:
- name: p
  outputs: [{path: "f*", commit: {rule: OnClose}}]
`, harnessOpts{})
	if err := os.WriteFile(h.path("p", "f1"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := h.store.Close(); err != nil {
		t.Fatal(err)
	}
	for what, op := range map[string]func() error{
		"create": func() error { return os.WriteFile(h.path("p", "f2"), []byte("x"), 0o644) },
		"mkdir":  func() error { return os.Mkdir(h.path("p", "fdir"), 0o755) },
	} {
		if err := op(); !errors.Is(err, syscall.EIO) {
			t.Errorf("%s in a view over a closed store: %v, want EIO", what, err)
		}
	}
}
