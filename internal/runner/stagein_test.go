package runner

import (
	"bytes"
	"context"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/minio/minio-go/v7"

	"github.com/sluice-io/sluice/internal/objstore"
	"github.com/sluice-io/sluice/internal/servers"
)

// Stage-in from a local file, a local directory and an S3 prefix (MinIO, versitygw):
// every staged file reaches the consumer byte for byte through the rules (NoUpdate,
// OnClose by default).
func TestStageIn(t *testing.T) { forEachS3Bucket(t, "inputs", testStageIn) }

func testStageIn(t *testing.T, m *servers.S3, client *minio.Client) {
	ctx := context.Background()
	for _, k := range []string{"set/a.txt", "set/sub/b.txt"} {
		body := "object " + k + "\n"
		if _, err := client.PutObject(ctx, "inputs", k, strings.NewReader(body), int64(len(body)), minio.PutObjectOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	local := t.TempDir()
	big := make([]byte, 32<<20)
	rand.Read(big)
	os.WriteFile(filepath.Join(local, "big.bin"), big, 0o644)
	os.MkdirAll(filepath.Join(local, "tree", "x"), 0o755)
	os.WriteFile(filepath.Join(local, "tree", "x", "c.txt"), []byte("local c\n"), 0o644)

	wf, rules := load(t, "stagein.yaml", []byte(`apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: stagein}
spec:
  sources:
  - {path: in/big.bin, from: "file://`+filepath.Join(local, "big.bin")+`"}
  - {path: in/tree, from: "file://`+filepath.Join(local, "tree")+`", type: Directory}
  - {path: in/s3, from: "s3://inputs/set/?endpoint=`+m.Endpoint+`", type: Directory}
  steps:
  - name: use
    inputs: ["in/big.bin", "in/tree", "in/s3"]
    template:
      spec:
        containers:
        - name: c
          image: x
          command: [sh, -c, 'cat "$SLUICE_DIR/in/big.bin" > "$SLUICE_DIR/copy.bin"; cat "$SLUICE_DIR/in/tree/x/c.txt" "$SLUICE_DIR/in/s3/a.txt" "$SLUICE_DIR/in/s3/sub/b.txt" > "$SLUICE_DIR/small.txt"']
    outputs: [{path: copy.bin, commit: {rule: OnClose}}, {path: small.txt, commit: {rule: OnClose}}]
  permanent: [copy.bin, small.txt]
`))
	out := t.TempDir()
	rep, err := Run(ctx, wf, rules, Options{OutDir: out, Credentials: objstore.Credentials{AccessKey: m.AccessKey, SecretKey: m.SecretKey}})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(filepath.Join(out, "copy.bin"))
	if !bytes.Equal(got, big) {
		t.Errorf("staged big file arrived as %d bytes, differing", len(got))
	}
	small, _ := os.ReadFile(filepath.Join(out, "small.txt"))
	if string(small) != "local c\nobject set/a.txt\nobject set/sub/b.txt\n" {
		t.Errorf("small.txt = %q", small)
	}
	var stage, use InstanceReport
	for _, ir := range rep.Instances {
		switch ir.Step {
		case "sluice-stage-in":
			stage = ir
		case "use":
			use = ir
		}
	}
	if stage.BytesOut != int64(len(big)+8+len("object set/a.txt\n")+len("object set/sub/b.txt\n")) {
		t.Errorf("stage-in wrote %d bytes", stage.BytesOut)
	}
	if use.FirstInput.IsZero() || stage.End.IsZero() || stage.ExitCode != 0 {
		t.Errorf("stage-in %+v, consumer %+v", stage, use)
	}
}
