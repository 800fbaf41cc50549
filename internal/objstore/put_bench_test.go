package objstore

import (
	"context"
	"crypto/rand"
	"os"
	"path/filepath"
	"testing"

	"github.com/sluice-io/sluice/internal/servers"
	"github.com/sluice-io/sluice/internal/testenv"
)

// BenchmarkPut uploads a 64 MiB file (multipart, PartSize parts) to a real MinIO: the
// uploader of permanent outputs' cost per byte (MB/s, and CPU through -cpuprofile).
func BenchmarkPut(b *testing.B) {
	testenv.Integration(b, "MinIO")
	m, err := servers.StartMinIO(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(m.Stop)
	ctx := context.Background()
	if _, err := m.Bucket(ctx, "results"); err != nil {
		b.Fatal(err)
	}
	st, err := Open(ctx, "s3://results/bench?endpoint="+m.Endpoint, Credentials{AccessKey: m.AccessKey, SecretKey: m.SecretKey})
	if err != nil {
		b.Fatal(err)
	}
	data := make([]byte, 64<<20)
	if _, err := rand.Read(data); err != nil {
		b.Fatal(err)
	}
	src := filepath.Join(b.TempDir(), "out.bin")
	if err := os.WriteFile(src, data, 0o644); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := st.Put(ctx, "out.bin", src); err != nil {
			b.Fatal(err)
		}
	}
}
