package objstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/sluice-io/sluice/internal/servers"
	"github.com/sluice-io/sluice/internal/testenv"
)

func randomFile(t *testing.T, size int) (string, []byte) {
	t.Helper()
	data := make([]byte, size)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "src")
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return p, data
}

func hexSum(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

func TestDirPut(t *testing.T) {
	root := t.TempDir()
	st, err := Open(context.Background(), "file://"+root, Credentials{})
	if err != nil {
		t.Fatal(err)
	}
	src, data := randomFile(t, 100000)
	obj, err := st.Put(context.Background(), "result/out.bin", src)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(filepath.Join(root, "result", "out.bin"))
	if !bytes.Equal(got, data) || obj.Size != 100000 || obj.SHA256 != hexSum(data) {
		t.Errorf("stored %d bytes, object %+v", len(got), obj)
	}
	if obj.URI != "file://"+filepath.Join(root, "result/out.bin") {
		t.Errorf("URI = %s", obj.URI)
	}
	for _, bad := range []string{"../x", "/abs", "a/../b", "a//b", ""} {
		if _, err := st.Put(context.Background(), bad, src); err == nil {
			t.Errorf("Put(%q) accepted", bad)
		}
	}
	entries, _ := os.ReadDir(filepath.Join(root, "result"))
	if len(entries) != 1 {
		t.Errorf("temporary files left: %v", entries)
	}
}

func TestOpenRejectsBadURLs(t *testing.T) {
	for url, want := range map[string]string{
		"ftp://x/y":            "scheme must be file or s3",
		"s3://bucket/p":        "the endpoint parameter is required",
		"file://host/dir":      "file URLs name a local path",
		"s3:///p?endpoint=h:1": "no bucket",
	} {
		if _, err := Open(context.Background(), url, Credentials{}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Open(%s) = %v, want %q", url, err, want)
		}
	}
}

// minioFor starts a real MinIO with a bucket "results" and returns it with a client: for
// the tests about MinIO's own accounts and TLS set-up. Tests about S3 behaviour run on
// every server (forEachS3).
func minioFor(t *testing.T) (*servers.MinIO, *minio.Client) {
	t.Helper()
	testenv.Integration(t, "MinIO")
	m, err := servers.StartMinIO(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Stop)
	c, err := m.Bucket(context.Background(), "results")
	if err != nil {
		t.Fatal(err)
	}
	return m, c
}

// objectReader reads an object with a server's root keys (*servers.S3, *servers.MinIO).
type objectReader interface {
	Object(ctx context.Context, bucket, key string) ([]byte, error)
}

func getObject(t *testing.T, m objectReader, key string) []byte {
	t.Helper()
	b, err := m.Object(context.Background(), "results", key)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A multipart upload (40 MiB in 16 MiB parts) stores exactly the file's bytes, with its
// digest, at the URI it reports.
func TestS3PutMultipart(t *testing.T) { forEachS3(t, testS3PutMultipart) }

func testS3PutMultipart(t *testing.T, m *servers.S3, c *minio.Client) {
	st, err := Open(context.Background(), "s3://results/wordcount?endpoint="+m.Endpoint, Credentials{AccessKey: m.AccessKey, SecretKey: m.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	src, data := randomFile(t, 40<<20)
	obj, err := st.Put(context.Background(), "result/big.bin", src)
	if err != nil {
		t.Fatal(err)
	}
	if obj.URI != "s3://results/wordcount/result/big.bin" || obj.SHA256 != hexSum(data) || obj.Size != 40<<20 {
		t.Errorf("object = %+v", obj)
	}
	// MinIO takes the trailers, the faster path; versitygw refuses them, and the store
	// uploads without them from then on.
	if got, want := st.(*S3).noTrailers.Load(), m.Name == "versitygw"; got != want {
		t.Errorf("on %s, uploads without trailers: %v, want %v", m.Name, got, want)
	}
	if got := getObject(t, m, "wordcount/result/big.bin"); !bytes.Equal(got, data) {
		t.Errorf("stored object differs from the file (%d bytes)", len(got))
	}
	info, err := c.StatObject(context.Background(), "results", "wordcount/result/big.bin", minio.StatObjectOptions{})
	if err != nil || info.UserMetadata["Sha256"] != obj.SHA256 {
		t.Errorf("metadata = %v (%v)", info.UserMetadata, err)
	}
}

// With the server down for 10 s, an upload keeps retrying and completes once it is back.
func TestS3PutRetriesWhileEndpointIsDown(t *testing.T) {
	forEachS3(t, testS3PutRetriesWhileEndpointIsDown)
}

func testS3PutRetriesWhileEndpointIsDown(t *testing.T, m *servers.S3, _ *minio.Client) {
	st, err := Open(context.Background(), "s3://results?endpoint="+m.Endpoint, Credentials{AccessKey: m.AccessKey, SecretKey: m.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	src, data := randomFile(t, 20<<20)
	m.Stop()
	done := make(chan error, 1)
	go func() { _, err := st.Put(context.Background(), "out.bin", src); done <- err }()
	time.Sleep(10 * time.Second) // the outage the issue prescribes
	select {
	case err := <-done:
		t.Fatalf("Put returned while the endpoint was down: %v", err)
	default:
	}
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("Put did not finish after the endpoint came back")
	}
	if got := getObject(t, m, "out.bin"); !bytes.Equal(got, data) {
		t.Error("stored object differs from the file")
	}
}

// A wrong secret key, an unknown access key and a missing bucket fail an upload at once
// (no retry for minutes), without the secret in the error; only the unknown key is
// IsUnknownKey (the one a controller can cure by making the account again).
func TestS3PutFailsFastOnAccessErrors(t *testing.T) { forEachS3(t, testS3PutFailsFastOnAccessErrors) }

func testS3PutFailsFastOnAccessErrors(t *testing.T, m *servers.S3, _ *minio.Client) {
	src, _ := randomFile(t, 1000)
	for name, tc := range map[string]struct {
		url     string
		creds   Credentials
		unknown bool
	}{
		"wrong key":      {"s3://results?endpoint=" + m.Endpoint, Credentials{AccessKey: m.AccessKey, SecretKey: "wrong"}, false},
		"unknown key":    {"s3://results?endpoint=" + m.Endpoint, Credentials{AccessKey: "nosuchkey0000", SecretKey: "wrong-secret"}, true},
		"missing bucket": {"s3://nobucket?endpoint=" + m.Endpoint, Credentials{AccessKey: m.AccessKey, SecretKey: m.SecretKey}, false},
	} {
		st, err := Open(context.Background(), tc.url, tc.creds)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, err = st.Put(context.Background(), "x", src)
		if err == nil {
			t.Errorf("%s: Put succeeded", name)
		}
		if time.Since(start) > 30*time.Second {
			t.Errorf("%s: Put retried an error that cannot go away (%v)", name, time.Since(start))
		}
		if strings.Contains(err.Error(), "wrong") {
			t.Errorf("%s: the error shows the secret: %v", name, err)
		}
		if IsUnknownKey(err) != tc.unknown {
			t.Errorf("%s: IsUnknownKey(%v) = %v, want %v", name, err, !tc.unknown, tc.unknown)
		}
	}
}

// growingFile is a file the test appends to; Wait follows its size and ends at close.
type growingFile struct {
	path   string
	mu     chan struct{} // closed and replaced at each append
	size   int64
	closed bool
	lock   chan struct{}
	// waitedAt is closed when a reader waits for bytes at offset notify or beyond.
	notify   int64
	waitedAt chan struct{}
}

func newGrowing(t *testing.T) *growingFile {
	p := filepath.Join(t.TempDir(), "growing")
	os.WriteFile(p, nil, 0o644)
	g := &growingFile{path: p, mu: make(chan struct{}), lock: make(chan struct{}, 1), notify: -1, waitedAt: make(chan struct{})}
	return g
}

func (g *growingFile) Path() string { return g.path }

func (g *growingFile) append(t *testing.T, data []byte, last bool) {
	g.lock <- struct{}{}
	f, _ := os.OpenFile(g.path, os.O_APPEND|os.O_WRONLY, 0)
	f.Write(data)
	f.Close()
	g.size += int64(len(data))
	g.closed = last
	close(g.mu)
	g.mu = make(chan struct{})
	<-g.lock
}

func (g *growingFile) Wait(ctx context.Context, off int64) (int64, bool, error) {
	for {
		g.lock <- struct{}{}
		size, closed, ch := g.size, g.closed, g.mu
		<-g.lock
		if off < size {
			return size - off, false, nil
		}
		if closed {
			return 0, true, nil
		}
		g.lock <- struct{}{}
		if g.notify >= 0 && off >= g.notify {
			close(g.waitedAt)
			g.notify = -1
		}
		<-g.lock
		select {
		case <-ch:
		case <-ctx.Done():
			return 0, false, ctx.Err()
		}
	}
}

// A file uploaded while it is written: the first parts go before the last bytes exist,
// and the object equals the file.
func TestS3PutGrowing(t *testing.T) { forEachS3(t, testS3PutGrowing) }

func testS3PutGrowing(t *testing.T, m *servers.S3, c *minio.Client) {
	st, err := Open(context.Background(), "s3://results?endpoint="+m.Endpoint, Credentials{AccessKey: m.AccessKey, SecretKey: m.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	g := newGrowing(t)
	g.notify = 2 * PartSize // parts go one after another: waiting there means two are sent
	data := make([]byte, 3*PartSize+12345)
	rand.Read(data)
	done := make(chan error, 1)
	var obj Object
	go func() {
		var err error
		obj, err = st.(Streamer).PutGrowing(context.Background(), "big.bin", g)
		done <- err
	}()
	g.append(t, data[:2*PartSize], false)
	select {
	case <-g.waitedAt:
	case err := <-done:
		t.Fatalf("upload ended before the file did: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("the uploader never waited for the third part")
	}
	// the first two parts are in the bucket while the file is still open
	core := minio.Core{Client: c}
	uploads, err := core.ListMultipartUploads(context.Background(), "results", "big.bin", "", "", "", 10)
	if err != nil || len(uploads.Uploads) != 1 {
		t.Fatalf("multipart uploads in progress: %+v, %v", uploads.Uploads, err)
	}
	parts, err := core.ListObjectParts(context.Background(), "results", "big.bin", uploads.Uploads[0].UploadID, 0, 10)
	if err != nil || len(parts.ObjectParts) != 2 {
		t.Fatalf("parts uploaded while the file was written: %d, %v; want 2", len(parts.ObjectParts), err)
	}
	g.append(t, data[2*PartSize:], true)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := getObject(t, m, "big.bin"); !bytes.Equal(got, data) {
		t.Fatalf("object of %d bytes differs from the file", len(got))
	}
	if obj.SHA256 != hexSum(data) || obj.Size != int64(len(data)) {
		t.Errorf("object = %+v", obj)
	}
	// a file smaller than a part is stored whole
	small := newGrowing(t)
	small.append(t, []byte("tiny"), true)
	if _, err := st.(Streamer).PutGrowing(context.Background(), "tiny.txt", small); err != nil {
		t.Fatal(err)
	}
	if got := getObject(t, m, "tiny.txt"); string(got) != "tiny" {
		t.Errorf("tiny = %q", got)
	}
}
