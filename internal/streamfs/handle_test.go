package streamfs

import (
	"strings"
	"testing"
)

// Every kind of handle has its own name (logs and test failures name the kind).
func TestHandleKindsHaveNames(t *testing.T) {
	seen := map[string]kind{}
	for k := kindPlain; k <= kindServedToEnd; k++ {
		name := k.String()
		if strings.HasPrefix(name, "kind(") {
			t.Errorf("kind %d has no name", k)
		}
		if other, dup := seen[name]; dup {
			t.Errorf("kinds %d and %d are both %q", other, k, name)
		}
		seen[name] = k
	}
	if got := (kindServedToEnd + 1).String(); got != "kind(8)" {
		t.Errorf("an unknown kind is %q, want kind(8)", got)
	}
}
