package objstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/sluice-io/sluice/internal/servers"
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

// minioFor starts a real MinIO with a bucket "results" and returns it with a client.
func minioFor(t *testing.T) (*servers.MinIO, *minio.Client) {
	t.Helper()
	m, err := servers.StartMinIO(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Stop)
	c, err := minio.New(m.Endpoint, &minio.Options{Creds: credentials.NewStaticV4(m.AccessKey, m.SecretKey, "")})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.MakeBucket(context.Background(), "results", minio.MakeBucketOptions{}); err != nil {
		t.Fatal(err)
	}
	return m, c
}

func getObject(t *testing.T, c *minio.Client, key string) []byte {
	t.Helper()
	o, err := c.GetObject(context.Background(), "results", key, minio.GetObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	b, err := io.ReadAll(o)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A multipart upload (40 MiB in 16 MiB parts) stores exactly the file's bytes, with its
// digest, at the URI it reports.
func TestS3PutMultipart(t *testing.T) {
	m, c := minioFor(t)
	st, err := Open(context.Background(), "s3://results/wordcount?endpoint="+m.Endpoint, Credentials{m.AccessKey, m.SecretKey})
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
	if got := getObject(t, c, "wordcount/result/big.bin"); !bytes.Equal(got, data) {
		t.Errorf("stored object differs from the file (%d bytes)", len(got))
	}
	info, err := c.StatObject(context.Background(), "results", "wordcount/result/big.bin", minio.StatObjectOptions{})
	if err != nil || info.UserMetadata["Sha256"] != obj.SHA256 {
		t.Errorf("metadata = %v (%v)", info.UserMetadata, err)
	}
}

// With MinIO down for 10 s, an upload keeps retrying and completes once it is back.
func TestS3PutRetriesWhileEndpointIsDown(t *testing.T) {
	m, c := minioFor(t)
	st, err := Open(context.Background(), "s3://results?endpoint="+m.Endpoint, Credentials{m.AccessKey, m.SecretKey})
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
	if got := getObject(t, c, "out.bin"); !bytes.Equal(got, data) {
		t.Error("stored object differs from the file")
	}
}

func TestS3PutFailsFastOnAccessErrors(t *testing.T) {
	m, _ := minioFor(t)
	src, _ := randomFile(t, 1000)
	for name, tc := range map[string]struct {
		url   string
		creds Credentials
	}{
		"wrong key":      {"s3://results?endpoint=" + m.Endpoint, Credentials{m.AccessKey, "wrong"}},
		"missing bucket": {"s3://nobucket?endpoint=" + m.Endpoint, Credentials{m.AccessKey, m.SecretKey}},
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
	}
}
