package runner

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/nats-io/nats-server/v2/server"

	"github.com/sluice-io/sluice/internal/objstore"
	"github.com/sluice-io/sluice/internal/servers"
	"github.com/sluice-io/sluice/internal/testenv"
)

// wordcount on three nodes, everything between them through NATS, permanent output into a
// real S3 server (MinIO, versitygw): the same result as the batch run, the object's
// checksum verified, and no temporary file in the bucket.
func TestWordcountThreeNodesToS3(t *testing.T) {
	forEachS3Bucket(t, "results", testWordcountThreeNodesToS3)
}

func testWordcountThreeNodesToS3(t *testing.T, m *servers.S3, client *minio.Client) {
	ctx := context.Background()
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
	got := getObj(t, m, keys[0])
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
	// Every file of the workflow has one reader: its bytes cross to that reader's node
	// when it is another, and go nowhere else (with eager replication, received was twice
	// published).
	if len(rep.Nodes) != 3 || published == 0 || received == 0 || received > published {
		t.Errorf("nodes %+v: bytes received %d, want between 1 and the %d published", rep.Nodes, received, published)
	}
}

// A permanent NoUpdate output is uploaded to S3 while it is written (a multipart object),
// and equals the file; on MinIO and versitygw.
func TestPermanentNoUpdateUploadedWhileWritten(t *testing.T) {
	forEachS3Bucket(t, "results", testPermanentNoUpdateUploadedWhileWritten)
}

func testPermanentNoUpdateUploadedWhileWritten(t *testing.T, m *servers.S3, client *minio.Client) {
	ctx := context.Background()
	st, err := objstore.Open(ctx, "s3://results?endpoint="+m.Endpoint, objstore.Credentials{AccessKey: m.AccessKey, SecretKey: m.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	wf, rules := load(t, "big.yaml", []byte(`apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: big}
spec:
  steps:
  - name: w
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'head -c 41943040 /dev/urandom | tee "$SLUICE_DIR/big.bin" | sha256sum > "$SLUICE_DIR/big.sum"']}]}}
    outputs:
    - {path: big.bin, commit: {rule: OnClose}, fire: NoUpdate}
    - {path: big.sum, commit: {rule: OnClose}}
  permanent: [big.bin, big.sum]
`))
	rep, err := Run(ctx, wf, rules, Options{ObjStore: st})
	if err != nil {
		t.Fatal(err)
	}
	info, err := client.StatObject(ctx, "results", "big.bin", minio.StatObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(info.ETag, "-") || info.Size != 41943040 {
		t.Errorf("big.bin: ETag %s size %d; want a multipart object of 40 MiB", info.ETag, info.Size)
	}
	sumObj := getObj(t, m, "big.sum")
	var bigSHA string
	for _, o := range rep.Outputs {
		if o.Path == "big.bin" {
			bigSHA = o.SHA256
		}
	}
	if bigSHA == "" || !strings.HasPrefix(string(sumObj), bigSHA) {
		t.Errorf("uploaded big.bin has sha256 %s; the writer computed %s", bigSHA, sumObj)
	}
	data := getObj(t, m, "big.bin")
	sum := sha256.Sum256(data)
	if hex.EncodeToString(sum[:]) != bigSHA {
		t.Error("the object's bytes do not have the reported digest")
	}
}

func getObj(t *testing.T, m *servers.S3, key string) []byte {
	t.Helper()
	b, err := m.Object(context.Background(), "results", key)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Permanent files are stored once, by their home node: the creating node by default, the
// node of a step instance with policy Manual, a hash of the path with Hashing.
func TestHomeNodePolicies(t *testing.T) {
	wf, rules := load(t, "home.yaml", []byte(`apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: home}
spec:
  steps:
  - name: a
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'for f in created pinned h1 h2 h3 h4; do echo $f > "$SLUICE_DIR/$f"; done']}]}}
    outputs: [{path: "*", commit: {rule: OnClose}}]
  - name: b
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'cat "$SLUICE_DIR/pinned" > /dev/null']}]}}
  permanent: ["*"]
  homeNode:
    hashing: [h1, h2, h3, h4]
    manual: [{files: [pinned], step: b}]
`))
	rep, err := Run(context.Background(), wf, rules, Options{Nodes: 2, OutDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	byPath := map[string]string{}
	for _, o := range rep.Outputs {
		if _, dup := byPath[o.Path]; dup {
			t.Errorf("%s stored twice", o.Path)
		}
		byPath[o.Path] = o.Node
	}
	// instances go round-robin: a[0] on node-0, b[0] on node-1
	if byPath["created"] != "node-0" || byPath["pinned"] != "node-1" {
		t.Errorf("stored by %v; want created by node-0 (its creator), pinned by node-1 (step b's node)", byPath)
	}
	nodes := map[string]bool{}
	for _, h := range []string{"h1", "h2", "h3", "h4"} {
		if byPath[h] == "" {
			t.Errorf("%s not stored", h)
		}
		nodes[byPath[h]] = true
	}
	if len(nodes) != 2 {
		t.Errorf("hashed files all stored by %v; want them spread over both nodes", nodes)
	}
}

// forEachS3Bucket runs test as a subtest against each S3 server the tests run against
// (servers.S3Kinds: MinIO, versitygw), each started for it with one bucket, given the
// server and a client with its root keys.
func forEachS3Bucket(t *testing.T, bucket string, test func(t *testing.T, m *servers.S3, c *minio.Client)) {
	t.Helper()
	testenv.Root(t, "runs workflows in FUSE views, with MinIO and versitygw")
	for _, kind := range servers.S3Kinds {
		t.Run(kind.Name, func(t *testing.T) {
			m, err := kind.Start(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(m.Stop)
			c, err := m.Bucket(context.Background(), bucket)
			if err != nil {
				t.Fatal(err)
			}
			test(t, m, c)
		})
	}
}

// Every example workflow with commands gives on three nodes, all bytes between them
// through NATS, what it gives on one. The stream-sum example's sums are compared byte for
// byte (its producer writes 10,000 lines here, not 100,000: one echo per line is one
// write, and the race detector makes 100,000 of them take minutes); the pipeline examples
// write random data in each run, so each run's checksums are compared with those of the
// files its producer wrote, as the producer's node store holds them (the consumer on
// another node read them over NATS). wordcount: TestWordcountThreeNodesToS3.
func TestExamplesOnThreeNodes(t *testing.T) {
	run := func(t *testing.T, file string, nodes int) (out, store string) {
		t.Helper()
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(file, "kubernetes") {
			if !bytes.Contains(data, []byte("seq 1 100000")) {
				t.Fatalf("%s no longer writes seq 1 100000; update this test", file)
			}
			data = bytes.Replace(data, []byte("seq 1 100000"), []byte("seq 1 10000"), 1)
		}
		wf, rules := load(t, file, data)
		tmp := t.TempDir()
		out, work := filepath.Join(tmp, "out"), filepath.Join(tmp, "work")
		if _, err := Run(context.Background(), wf, rules, Options{WorkDir: work, OutDir: out, Nodes: nodes, Keep: true, StoreOnDisk: true}); err != nil {
			t.Fatalf("%s on %d nodes: %v", file, nodes, err)
		}
		store = filepath.Join(work, "store")
		if nodes > 1 {
			store = filepath.Join(work, "nodes", "node-0", "store") // the first instance's node: the producer's
		}
		return out, store
	}
	t.Run("kubernetes/pipeline", func(t *testing.T) {
		one, _ := run(t, "../../examples/kubernetes/pipeline.yaml", 1)
		three, _ := run(t, "../../examples/kubernetes/pipeline.yaml", 3)
		for _, f := range []string{"sums/0.txt", "sums/1.txt"} {
			want, err := os.ReadFile(filepath.Join(one, f))
			if err != nil || strings.TrimSpace(string(want)) != "50005000" {
				t.Fatalf("one node: %s = %q (%v), want the sum of 1 to 10000", f, want, err)
			}
			if got, err := os.ReadFile(filepath.Join(three, f)); err != nil || !bytes.Equal(got, want) {
				t.Errorf("three nodes: %s = %q (%v), want %q as on one node", f, got, err, want)
			}
		}
	})
	for _, name := range []string{"update", "noupdate"} {
		t.Run("pipeline/"+name, func(t *testing.T) {
			for _, nodes := range []int{1, 3} {
				out, store := run(t, "../../examples/pipeline/"+name+".yaml", nodes)
				b, err := os.ReadFile(filepath.Join(out, "sums.txt"))
				if err != nil {
					t.Fatal(err)
				}
				lines := strings.Split(strings.TrimSpace(string(b)), "\n")
				if len(lines) != 8 {
					t.Fatalf("%d nodes: %d checksums, want 8:\n%s", nodes, len(lines), b)
				}
				for _, line := range lines {
					f := strings.Fields(line)
					data, err := os.ReadFile(filepath.Join(store, f[len(f)-1]))
					if err != nil {
						t.Fatal(err)
					}
					if sum := sha256.Sum256(data); f[0] != hex.EncodeToString(sum[:]) {
						t.Errorf("%d nodes: the consumer's checksum of %s is %s; the producer wrote bytes whose checksum is %x", nodes, f[len(f)-1], f[0], sum)
					}
				}
			}
		})
	}
}

// connsYAML is a producer and a consumer, which --nodes 2 puts on two nodes.
const connsYAML = `apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: conns}
spec:
  steps:
  - name: p
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'head -c 1048576 /dev/zero > "$SLUICE_DIR/f"']}]}}
    outputs: [{path: f, commit: {rule: OnClose}, fire: NoUpdate}]
  - name: c
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'wc -c < "$SLUICE_DIR/f" > "$SLUICE_DIR/count"']}]}}
    inputs: [f]
    outputs: [{path: count, commit: {rule: OnClose}}]
`

// Each node of sluice run --nodes N has a NATS connection of its own, named after it, as
// the nodes of a cluster have: one node's messages are not parsed and delivered by the
// reader of another's.
func TestEachNodeHasItsOwnNATSConnection(t *testing.T) {
	wf, rules := load(t, "conns.yaml", []byte(connsYAML))
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: t.TempDir(), NoSigs: true, MaxPayload: 2 << 20})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(30 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	defer srv.Shutdown()
	tmp := t.TempDir()
	if _, err := Run(context.Background(), wf, rules, Options{Nodes: 2, NATSURL: srv.ClientURL(), WorkDir: filepath.Join(tmp, "work"), OutDir: filepath.Join(tmp, "out")}); err != nil {
		t.Fatal(err)
	}
	cz, err := srv.Connz(&server.ConnzOptions{State: server.ConnAll})
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, c := range cz.Conns {
		names[c.Name] = true
	}
	for _, want := range []string{"sluice-run-conns-node-0", "sluice-run-conns-node-1"} {
		if !names[want] {
			t.Errorf("no connection named %s; the server saw %v", want, names)
		}
	}
}
