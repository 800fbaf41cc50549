package csidriver

import (
	"os/exec"
	"strings"
	"testing"
)

// The privileged node plugin's package links no part of a workflow's data plane: not
// NATS, not the transport, not the store server that follows a workflow's stream (that
// runs in an unprivileged child, internal/storeserver). The package's code, which runs as
// root, stays what publishing volumes needs; the `sluice` binary that holds it also
// holds the child's code (`sluice csi store-server`), run only in the child.
func TestPluginLinksNoDataPlane(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool on PATH to list the package's dependencies")
	}
	out, err := exec.Command(goTool, "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	const sluice = "github.com/sluice-io/sluice/internal/"
	for _, dep := range strings.Fields(string(out)) {
		for _, forbidden := range []string{"github.com/nats-io/", sluice + "transport", sluice + "storeserver", sluice + "wfnode", sluice + "semantics"} {
			if strings.HasPrefix(dep, forbidden) {
				t.Errorf("the CSI plugin's package links %s", dep)
			}
		}
	}
}
