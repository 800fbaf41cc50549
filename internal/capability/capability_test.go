package capability

import (
	"os"
	"testing"
)

// Root in the initial user namespace holds every capability; anyone else holds none of
// these unless granted, which a test run does not do.
func TestEffectiveMatchesTheUser(t *testing.T) {
	for _, bit := range []Bit{Chown, SysAdmin} {
		got, err := Effective(bit)
		if err != nil {
			t.Fatal(err)
		}
		if root := os.Geteuid() == 0; got != root {
			t.Errorf("Effective(%d) = %v for euid %d", bit, got, os.Geteuid())
		}
	}
}
