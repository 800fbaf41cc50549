package runner

import (
	"context"
	"crypto/sha256"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// GNU tar extracting an archive with a hard link into an OnTermination Directory output
// (linked while its source is not committed): consumers on the producer's node and on
// another node read both names byte for byte once the producer exits, and see one file
// with two names there too (the link travels as a link, its bytes once).
func TestTarHardLinkInAnUncommittedOutputAcrossNodes(t *testing.T) {
	if _, err := exec.LookPath("tar"); err != nil {
		t.Skip("GNU tar is needed")
	}
	src, err := os.MkdirTemp("/dev/shm", "sluice-tarlinks-")
	if err != nil {
		t.Skipf("no tmpfs at /dev/shm: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(src) })
	body := make([]byte, 700<<10+3)
	rand.New(rand.NewSource(3)).Read(body)
	if err := os.MkdirAll(filepath.Join(src, "t", "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "t", "file.bin"), body, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(src, "t", "file.bin"), filepath.Join(src, "t", "sub", "hard.bin")); err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(src, "t.tar")
	if out, err := exec.Command("tar", "-cf", archive, "-C", filepath.Join(src, "t"), ".").CombinedOutput(); err != nil {
		t.Fatalf("tar -c: %v\n%s", err, out)
	}
	wf, rules := load(t, "tarlinks.yaml", []byte(`apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: tarlinks}
spec:
  permanent: ["seen-*.txt"]
  steps:
  - name: p
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'mkdir "$SLUICE_DIR/tree" && tar -xf `+archive+` -C "$SLUICE_DIR/tree"']}]}}
    outputs:
    - {path: tree, type: Directory, commit: {rule: OnTermination}}
  - name: c
    replicas: 2
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'cd "$SLUICE_DIR/tree" && { sha256sum file.bin sub/hard.bin; stat -c %h file.bin sub/hard.bin; } > "$SLUICE_DIR/seen-$SLUICE_INSTANCE.txt"']}]}}
    inputs: [tree]
    outputs: [{path: "seen-*.txt"}]
`))
	tmp := t.TempDir()
	out := filepath.Join(tmp, "out")
	// Two nodes, instances round-robin: p on node-0, c[0] on node-1, c[1] on node-0.
	if _, err := Run(context.Background(), wf, rules, Options{WorkDir: filepath.Join(tmp, "work"), OutDir: out, Nodes: 2, Timeout: 2 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	sum := fmt.Sprintf("%x", sha256.Sum256(body))
	want := strings.Join([]string{sum + "  file.bin", sum + "  sub/hard.bin", "2", "2", ""}, "\n")
	for i := range 2 {
		b, err := os.ReadFile(filepath.Join(out, fmt.Sprintf("seen-%d.txt", i)))
		if err != nil || string(b) != want {
			t.Errorf("c[%d] saw %q (%v), want %q", i, b, err, want)
		}
	}
}
