package runner

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// crossNode runs a workflow on two nodes: a producer on node-0 writes src as in.txt
// (OnClose, under fire) in four pieces half a second apart, once the consumer on node-1
// has started; the consumer runs the sh script cmd on it ($IN the input, $OUT its result)
// meanwhile. The producer runs the sh script after its first piece ($PIECE its size). Both
// have $HOST, a plain directory of the machine. It returns cmd's error output and exit
// code ("exit N" on the last line), and its result.
func crossNode(t *testing.T, fire, cmd, after string, src []byte) (string, []byte) {
	t.Helper()
	tmp := t.TempDir()
	host := filepath.Join(tmp, "host")
	if err := os.Mkdir(host, 0o755); err != nil {
		t.Fatal(err)
	}
	srcFile := filepath.Join(tmp, "src")
	if err := os.WriteFile(srcFile, src, 0o644); err != nil {
		t.Fatal(err)
	}
	producer := `set -e
HOST=` + host + `
cat "$SLUICE_DIR/ready" > /dev/null
PIECE=$(( (` + fmt.Sprint(len(src)) + ` + 3) / 4 ))
exec 3> "$SLUICE_DIR/in.txt"
for i in 0 1 2 3; do
  dd if=` + srcFile + ` bs=$PIECE skip=$i count=1 status=none >&3
  if [ $i = 0 ]; then :
` + after + `
  fi
  sleep 0.5
done
exec 3>&-
`
	consumer := `: > "$SLUICE_DIR/ready"
IN="$SLUICE_DIR/in.txt"; OUT="$SLUICE_DIR/out"; HOST=` + host + `
( set -e
` + cmd + `
) 2> "$SLUICE_DIR/status"
echo "exit $?" >> "$SLUICE_DIR/status"
`
	type m = map[string]any
	step := func(name, script string, inputs []string, outputs []m) m {
		return m{"name": name, "inputs": inputs, "outputs": outputs,
			"template": m{"spec": m{"containers": []m{{"name": "main", "image": "x", "command": []string{"/bin/sh", "-c", script}}}}}}
	}
	data, err := json.Marshal(m{"apiVersion": "sluice.io/v1alpha1", "kind": "Workflow",
		"metadata": m{"name": "crossnode"}, "spec": m{"permanent": []string{"out", "status"}, "steps": []m{
			step("p", producer, []string{"ready"}, []m{{"path": "in.txt", "commit": m{"rule": "OnClose"}, "fire": fire}}),
			step("c", consumer, []string{"in.txt"}, []m{{"path": "ready", "commit": m{"rule": "OnClose"}}, {"path": "out"}, {"path": "status"}}),
		}}})
	if err != nil {
		t.Fatal(err)
	}
	wf, rules := load(t, "crossnode.yaml", data)
	out := filepath.Join(tmp, "out")
	// Two nodes, instances round-robin: p on node-0, c on node-1.
	if _, err := Run(context.Background(), wf, rules, Options{WorkDir: filepath.Join(tmp, "work"), OutDir: out, Nodes: 2,
		Timeout: 2 * time.Minute, WaitTimeout: time.Minute}); err != nil {
		t.Fatalf("the run failed: %v", err)
	}
	status, _ := os.ReadFile(filepath.Join(out, "status"))
	result, _ := os.ReadFile(filepath.Join(out, "out"))
	return string(status), result
}

// crossNodeText is size bytes of text lines.
func crossNodeText(size int) []byte {
	var b bytes.Buffer
	for i := 0; b.Len() < size; i++ {
		fmt.Fprintf(&b, "%07d %s %d\n", (i*7919)%1000003, []string{"alpha", "beta", "gamma", "delta"}[i%4], i)
	}
	return b.Bytes()
}

// GNU install (coreutils' copy) of a NoUpdate input still being written on another node
// copies all of it. The node's store file of the input has holes where its bytes are not
// fetched yet, so install copies its data extents by SEEK_DATA and SEEK_HOLE; the first
// hole at the size written so far ended the copy there, exit 0 (the first 512 KiB of 2
// MiB). A seek for data past what is written waits as a read there does. The producer
// writes its second piece once install has copied the first (to a plain file of the
// machine), so that install looks for more data before it exists.
func TestInstallCopiesAWholeNoUpdateInputFromAnotherNode(t *testing.T) {
	needPrograms(t, "install", "dd", "stat")
	src := crossNodeText(2 << 20)
	status, got := crossNode(t, "NoUpdate", `install -m 644 "$IN" "$HOST/copy"; cat "$HOST/copy" > "$OUT"`,
		`n=0; until [ "$(stat -c %s "$HOST/copy" 2>/dev/null)" = "$PIECE" ] || [ $n = 600 ]; do sleep 0.05; n=$((n+1)); done`, src)
	if status != "exit 0\n" || !bytes.Equal(got, src) {
		t.Fatalf("install: %q, copied %d bytes of %d (same: %v)", status, len(got), len(src), bytes.Equal(got, src))
	}
}

// A committed input's times are the same before and after it is read on another node,
// while its bytes are fetched into that node's store: GNU tar, which compares them, archives
// it without "file changed as we read it" (exit 1 before).
func TestTimesOfAnInputFromAnotherNodeHoldWhileItIsFetched(t *testing.T) {
	needPrograms(t, "tar", "stat", "dd")
	src := crossNodeText(2 << 20)
	status, got := crossNode(t, "Update",
		`: > "$OUT"; before=$(stat -c '%Y.%y %Z.%z' "$IN"); tar -cf "$OUT.tar" -C "$(dirname "$IN")" in.txt; after=$(stat -c '%Y.%y %Z.%z' "$IN")
tar -xOf "$OUT.tar" > "$OUT"; rm "$OUT.tar"
[ "$before" = "$after" ] || { echo "times before reading: $before, after: $after" >&2; exit 3; }`, "", src)
	if status != "exit 0\n" || !bytes.Equal(got, src) {
		t.Fatalf("tar of the input: %q, archived %d bytes of %d (same: %v)", strings.TrimSpace(status), len(got), len(src), bytes.Equal(got, src))
	}
}
