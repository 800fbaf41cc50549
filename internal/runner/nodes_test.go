package runner

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/sluice-io/sluice/internal/objstore"
	"github.com/sluice-io/sluice/internal/servers"
)

// wordcount on three nodes, everything between them through NATS, permanent output into a
// real MinIO: the same result as the batch run, the object's checksum verified, and no
// temporary file in the bucket.
func TestWordcountThreeNodesToS3(t *testing.T) {
	m, err := servers.StartMinIO(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Stop)
	client, err := minio.New(m.Endpoint, &minio.Options{Creds: credentials.NewStaticV4(m.AccessKey, m.SecretKey, "")})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := client.MakeBucket(ctx, "results", minio.MakeBucketOptions{}); err != nil {
		t.Fatal(err)
	}
	st, err := objstore.Open(ctx, "s3://results/wordcount?endpoint="+m.Endpoint, objstore.Credentials{AccessKey: m.AccessKey, SecretKey: m.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	wf, rules := load(t, "../../examples/wordcount/workflow.yaml", nil)
	rep, err := Run(ctx, wf, rules, Options{Nodes: 3, ObjStore: st})
	if err != nil {
		t.Fatal(err)
	}
	plain := t.TempDir()
	if _, err := RunBatch(ctx, wf, plain, filepath.Join(t.TempDir(), "logs"), nil); err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(filepath.Join(plain, "result", "wordcount.txt"))
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for obj := range client.ListObjects(ctx, "results", minio.ListObjectsOptions{Recursive: true}) {
		if obj.Err != nil {
			t.Fatal(obj.Err)
		}
		keys = append(keys, obj.Key)
	}
	if len(keys) != 1 || keys[0] != "wordcount/result/wordcount.txt" {
		t.Fatalf("bucket holds %v; want only the permanent result", keys)
	}
	o, err := client.GetObject(ctx, "results", keys[0], minio.GetObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(o)
	o.Close()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("object (%d bytes) differs from the batch result (%d bytes)", len(got), len(want))
	}
	sum := sha256.Sum256(want)
	if len(rep.Outputs) != 1 || rep.Outputs[0].SHA256 != hex.EncodeToString(sum[:]) || rep.Outputs[0].URI != "s3://results/wordcount/result/wordcount.txt" {
		t.Errorf("report outputs = %+v", rep.Outputs)
	}
	// every committed file (16 chunks, 4 parts, the result) and every instance is recorded
	// once in the metadata bucket, by its home node
	if md := rep.Metadata; md == nil || md.Files != 21 || md.Terminations != 6 {
		t.Errorf("metadata = %+v, want 21 files and 6 terminations", md)
	}
	var published, received int64
	for _, n := range rep.Nodes {
		published += n.BytesPublished
		received += n.BytesReceived
		if n.Rejected != 0 {
			t.Errorf("node %s rejected %d messages", n.Name, n.Rejected)
		}
	}
	if len(rep.Nodes) != 3 || published == 0 || received < published {
		t.Errorf("nodes %+v: every published byte reaches the two other nodes", rep.Nodes)
	}
}
