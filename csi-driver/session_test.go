package csidriver

import (
	"bufio"
	"encoding/json"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/csi-driver/handoff"
)

// A pod that opens many connections to its hand-off socket and sends each a request
// that never ends (up to handoff.MaxRequest bytes, for 30 s each) makes the privileged
// plugin hold at most handoffConnsPerPod of them: the others are refused at once with
// the reason, and the pod's sidecar attaches once the pod lets go.
func TestHandOffSocketServesFewConnectionsPerPod(t *testing.T) {
	n := newTierNode(t, Options{StoreSize: 64 << 20}, nil)
	n.mustPublish("uid-1", "wf")
	sock := filepath.Join(n.d.podsRoot(), "uid-1", handoff.SocketName)
	addr := &net.UnixAddr{Name: sock, Net: "unix"}
	var held []*net.UnixConn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	refused := 0
	for i := 0; i < 20; i++ {
		c, err := net.DialUnix("unix", nil, addr)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		held = append(held, c)
		if i < handoffConnsPerPod {
			// Half a request: no newline, so a connection being served stays open.
			if _, err := c.Write([]byte(`{"op":"attach","pad":"` + strings.Repeat("x", 32<<10))); err != nil {
				t.Fatalf("connection %d: writing: %v", i, err)
			}
			continue
		}
		// Beyond the pod's share, the plugin answers without reading and closes.
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		line, err := bufio.NewReader(c).ReadBytes('\n')
		if err != nil {
			t.Fatalf("connection %d beyond the pod's %d: no refusal: %v", i, handoffConnsPerPod, err)
		}
		var rep handoff.Reply
		if err := json.Unmarshal(line, &rep); err != nil || !strings.Contains(rep.Error, "connections from this pod") {
			t.Fatalf("connection %d beyond the pod's %d: got %q (%v), want a refusal naming the connections", i, handoffConnsPerPod, line, err)
		}
		refused++
	}
	if refused != 20-handoffConnsPerPod {
		t.Fatalf("%d connections refused, want %d", refused, 20-handoffConnsPerPod)
	}
	for _, c := range held {
		c.Close()
	}
	held = nil
	if v := n.attached("uid-1"); v.Workflow != "wf" {
		t.Errorf("after the connections closed the sidecar attached to workflow %q, want wf", v.Workflow)
	}
}
