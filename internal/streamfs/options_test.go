package streamfs

import (
	"flag"
	"io"
	"strings"
	"testing"
)

// The --passthrough flag takes auto, on or off (empty is auto) and rejects anything else,
// naming the value.
func TestPassthroughModeFlag(t *testing.T) {
	for in, want := range map[string]PassthroughMode{"": PassthroughAuto, "auto": PassthroughAuto, "on": PassthroughOn, "off": PassthroughOff} {
		got, err := ParsePassthroughMode(in)
		if err != nil || got != want {
			t.Errorf("ParsePassthroughMode(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var m PassthroughMode
	fs.Var(&m, "passthrough", "")
	if m.String() != "auto" {
		t.Errorf("the zero mode prints %q, want auto", m.String())
	}
	if err := fs.Parse([]string{"-passthrough=off"}); err != nil || m != PassthroughOff {
		t.Errorf("-passthrough=off gives %q, %v", m, err)
	}
	err := fs.Parse([]string{"-passthrough=yes"})
	if err == nil || m != PassthroughOff {
		t.Errorf("-passthrough=yes gives %q, %v; want an error and the mode unchanged", m, err)
	}
	if err != nil && !strings.Contains(err.Error(), `"yes"`) {
		t.Errorf("the error %q does not name the value", err)
	}
}
