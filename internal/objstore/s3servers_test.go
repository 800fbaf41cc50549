package objstore

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/minio/minio-go/v7"

	"github.com/sluice-io/sluice/internal/servers"
	"github.com/sluice-io/sluice/internal/testenv"
)

// s3Server is one of the S3 servers the tests about S3 behaviour run against
// (servers.S3Kinds), with what makes workflows' accounts there.
type s3Server struct {
	servers.S3Kind
	// accounts returns what makes workflows' keys of their own on the server, with an
	// installation account that is not root, for bucket (which must exist).
	accounts func(t *testing.T, s *servers.S3, bucket string) accountMaker
}

// accountMaker makes and removes workflows' accounts (controller.StorageAccounts).
type accountMaker interface {
	Ensure(ctx context.Context, a Account) error
	Remove(ctx context.Context, accessKey string) error
}

// s3Servers are servers.S3Kinds with their accounts.
var s3Servers = func() []s3Server {
	accounts := map[string]func(t *testing.T, s *servers.S3, bucket string) accountMaker{
		"minio": func(t *testing.T, s *servers.S3, bucket string) accountMaker {
			ctx := context.Background()
			if err := SetupMinIOUser(ctx, s.Endpoint, false, Credentials{AccessKey: s.AccessKey, SecretKey: s.SecretKey}, "sluice-installation", "installation-secret-1", bucket); err != nil {
				t.Fatal(err)
			}
			a, err := NewMinIOAccounts(s.Endpoint, false, Credentials{AccessKey: "sluice-installation", SecretKey: "installation-secret-1"})
			if err != nil {
				t.Fatal(err)
			}
			return a
		},
		"versitygw": func(t *testing.T, s *servers.S3, bucket string) accountMaker {
			ctx := context.Background()
			if err := SetupVersityGWUser(ctx, s.AdminEndpoint, false, Credentials{AccessKey: s.AccessKey, SecretKey: s.SecretKey}, "sluice-installation", "installation-secret-1"); err != nil {
				t.Fatal(err)
			}
			a, err := NewVersityGWAccounts(s.Endpoint, s.AdminEndpoint, bucket, false, Credentials{AccessKey: "sluice-installation", SecretKey: "installation-secret-1"})
			if err != nil {
				t.Fatal(err)
			}
			return a
		},
	}
	var out []s3Server
	for _, k := range servers.S3Kinds {
		if accounts[k.Name] == nil {
			panic("objstore tests: no accounts for S3 server " + k.Name)
		}
		out = append(out, s3Server{S3Kind: k, accounts: accounts[k.Name]})
	}
	return out
}()

// forEachS3 runs test as a subtest against each of s3Servers, each started afresh with a
// bucket "results", given the server and a client with its root keys.
func forEachS3(t *testing.T, test func(t *testing.T, s *servers.S3, root *minio.Client)) {
	t.Helper()
	testenv.Integration(t, "MinIO and versitygw")
	for _, srv := range s3Servers {
		t.Run(srv.Name, func(t *testing.T) {
			s := startS3(t, srv)
			c, err := s.Bucket(context.Background(), "results")
			if err != nil {
				t.Fatal(err)
			}
			test(t, s, c)
		})
	}
}

// startS3 starts srv for t and stops it when t ends.
func startS3(t *testing.T, srv s3Server) *servers.S3 {
	t.Helper()
	s, err := srv.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// forEachS3WithAccounts is forEachS3 with the server's accountMaker for "results".
func forEachS3WithAccounts(t *testing.T, test func(t *testing.T, s *servers.S3, accounts accountMaker)) {
	t.Helper()
	testenv.Integration(t, "MinIO and versitygw")
	for _, srv := range s3Servers {
		t.Run(srv.Name, func(t *testing.T) {
			s := startS3(t, srv)
			if _, err := s.Bucket(context.Background(), "results"); err != nil {
				t.Fatal(err)
			}
			test(t, s, srv.accounts(t, s, "results"))
		})
	}
}

// What stage-in and withdrawal rely on: ListSource lists a prefix recursively (sorted,
// keys relative to it, directory markers skipped) and names one object; each listed
// object reads back its bytes; a missing object is an error naming it; Remove withdraws
// an object, and removing a missing one is not an error.
func TestS3ListSourceGetAndRemove(t *testing.T) { forEachS3(t, testS3ListSourceGetAndRemove) }

func testS3ListSourceGetAndRemove(t *testing.T, m *servers.S3, c *minio.Client) {
	ctx := context.Background()
	creds := Credentials{AccessKey: m.AccessKey, SecretKey: m.SecretKey}
	st, err := Open(ctx, "s3://results/wf?endpoint="+m.Endpoint, creds)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"a.txt": "alpha\n", "dir/b.txt": "beta\n", "dir/sub/c.txt": "gamma\n"}
	for key, body := range want {
		p := filepath.Join(t.TempDir(), "f")
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Put(ctx, key, p); err != nil {
			t.Fatal(err)
		}
	}
	// A directory marker, as a console makes for an empty folder: not a file.
	if _, err := c.PutObject(ctx, "results", "wf/dir/empty/", strings.NewReader(""), 0, minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	objs, err := ListSource(ctx, "s3://results/wf/?endpoint="+m.Endpoint, false, creds)
	if err != nil {
		t.Fatal(err)
	}
	var rels []string
	for _, o := range objs {
		rels = append(rels, o.Rel)
		r, err := o.Open(ctx)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(r)
		r.Close()
		if err != nil || string(b) != want[o.Rel] || o.Size != int64(len(want[o.Rel])) {
			t.Errorf("%s: read %q (%d bytes listed), %v; want %q", o.Rel, b, o.Size, err, want[o.Rel])
		}
	}
	if got := strings.Join(rels, ","); got != "a.txt,dir/b.txt,dir/sub/c.txt" {
		t.Errorf("listed %s", got)
	}
	one, err := ListSource(ctx, "s3://results/wf/dir/b.txt?endpoint="+m.Endpoint, false, creds)
	if err != nil || len(one) != 1 || one[0].Rel != "" || one[0].Size != 5 {
		t.Errorf("ListSource of one object: %+v, %v", one, err)
	}
	if _, err := ListSource(ctx, "s3://results/wf/missing.txt?endpoint="+m.Endpoint, false, creds); err == nil || !strings.Contains(err.Error(), "wf/missing.txt") {
		t.Errorf("ListSource of a missing object: %v, want an error naming it", err)
	}

	s := st.(*S3)
	if err := s.Remove(ctx, "dir/b.txt"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.StatObject(ctx, "results", "wf/dir/b.txt", minio.StatObjectOptions{}); minio.ToErrorResponse(err).Code != "NoSuchKey" {
		t.Errorf("after Remove: %v, want NoSuchKey", err)
	}
	if err := s.Remove(ctx, "dir/b.txt"); err != nil {
		t.Errorf("removing a missing object: %v", err)
	}
	if err := s.Remove(ctx, "../escape"); err == nil {
		t.Error("Remove accepted a key outside the prefix")
	}
}
