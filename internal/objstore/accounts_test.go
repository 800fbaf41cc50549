package objstore

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/minio/madmin-go/v3"
	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

func isAccessDenied(err error) bool {
	var e minio.ErrorResponse
	return errors.As(err, &e) && e.Code == "AccessDenied"
}

// On a real MinIO, the installation's user made by SetupMinIOUser (not root) gives each
// workflow a service account that reads, writes, lists and withdraws its own prefix and
// is refused (AccessDenied) on another workflow's prefix, another bucket and admin
// actions; once removed, its keys no longer work.
func TestMinIOWorkflowAccountsReachOnlyTheirPrefix(t *testing.T) {
	m, root := minioFor(t) // bucket "results"
	ctx := context.Background()
	if _, err := root.ListBuckets(ctx); err != nil {
		t.Fatal(err)
	}
	if err := root.MakeBucket(ctx, "other", minio.MakeBucketOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := SetupMinIOUser(ctx, m.Endpoint, false, Credentials{AccessKey: m.AccessKey, SecretKey: m.SecretKey}, "sluice-installation", "installation-secret-1", "results"); err != nil {
		t.Fatal(err)
	}
	// Twice: the bundled MinIO's setup container runs it at every start.
	if err := SetupMinIOUser(ctx, m.Endpoint, false, Credentials{AccessKey: m.AccessKey, SecretKey: m.SecretKey}, "sluice-installation", "installation-secret-1", "results"); err != nil {
		t.Fatalf("SetupMinIOUser again: %v", err)
	}
	if err := SetupMinIOUser(ctx, m.Endpoint, false, Credentials{AccessKey: m.AccessKey, SecretKey: m.SecretKey}, m.AccessKey, "x", "results"); err == nil {
		t.Error("SetupMinIOUser accepted MinIO's root user as the installation's key")
	}

	accounts, err := NewMinIOAccounts(m.Endpoint, false, Credentials{AccessKey: "sluice-installation", SecretKey: "installation-secret-1"})
	if err != nil {
		t.Fatal(err)
	}
	a := Account{AccessKey: "sluice-wf-a", SecretKey: "secret-of-workflow-a", Bucket: "results", Prefix: "tenant-a/wf-a/", Description: "tenant-a/wf-a"}
	b := Account{AccessKey: "sluice-wf-b", SecretKey: "secret-of-workflow-b", Bucket: "results", Prefix: "tenant-b/wf-b/", Description: "tenant-b/wf-b"}
	for _, acc := range []Account{a, b, a} { // a twice: Ensure is idempotent
		if err := accounts.Ensure(ctx, acc); err != nil {
			t.Fatal(err)
		}
	}

	src := filepath.Join(t.TempDir(), "out.txt")
	if err := os.WriteFile(src, []byte("workflow output\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	open := func(acc Account, bucket, prefix string) *S3 {
		t.Helper()
		st, err := Open(ctx, "s3://"+bucket+"/"+prefix+"?endpoint="+m.Endpoint, Credentials{AccessKey: acc.AccessKey, SecretKey: acc.SecretKey})
		if err != nil {
			t.Fatal(err)
		}
		s := st.(*S3)
		s.RetryFor = 1 // access errors are not retried anyway
		return s
	}
	// b's object, stored with b's own keys.
	if _, err := open(b, "results", b.Prefix).Put(ctx, "out.txt", src); err != nil {
		t.Fatalf("workflow b storing under its own prefix: %v", err)
	}

	own := open(a, "results", a.Prefix)
	if _, err := own.Put(ctx, "dir/out.txt", src); err != nil {
		t.Fatalf("workflow a storing under its own prefix: %v", err)
	}
	if got := getObject(t, m, "tenant-a/wf-a/dir/out.txt"); string(got) != "workflow output\n" {
		t.Fatalf("stored %q", got)
	}
	objs, err := ListSource(ctx, "s3://results/"+a.Prefix+"dir?endpoint="+m.Endpoint, true, Credentials{AccessKey: a.AccessKey, SecretKey: a.SecretKey})
	if err != nil || len(objs) != 1 {
		t.Fatalf("workflow a listing its own prefix: %v, %v", objs, err)
	}
	if err := own.Remove(ctx, "dir/out.txt"); err != nil {
		t.Fatalf("workflow a withdrawing its own object: %v", err)
	}

	aClient, err := minio.New(m.Endpoint, &minio.Options{Creds: credentials.NewStaticV4(a.AccessKey, a.SecretKey, "")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := open(a, "results", b.Prefix).Put(ctx, "planted.txt", src); !isAccessDenied(err) {
		t.Errorf("workflow a writing under b's prefix: %v, want AccessDenied", err)
	}
	if _, err := open(a, "results", "tenant-a/wf-a2/").Put(ctx, "x.txt", src); !isAccessDenied(err) {
		t.Errorf("workflow a writing under tenant-a/wf-a2/ (shares a's prefix as a string): %v, want AccessDenied", err)
	}
	if _, err := open(a, "other", "").Put(ctx, "x.txt", src); !isAccessDenied(err) {
		t.Errorf("workflow a writing to another bucket: %v, want AccessDenied", err)
	}
	if _, err := aClient.StatObject(ctx, "results", b.Prefix+"out.txt", minio.StatObjectOptions{}); !isAccessDenied(err) {
		t.Errorf("workflow a reading b's object: %v, want AccessDenied", err)
	}
	if err := aClient.RemoveObject(ctx, "results", b.Prefix+"out.txt", minio.RemoveObjectOptions{}); !isAccessDenied(err) {
		t.Errorf("workflow a deleting b's object: %v, want AccessDenied", err)
	}
	for o := range aClient.ListObjects(ctx, "results", minio.ListObjectsOptions{Prefix: "tenant-b/", Recursive: true}) {
		if !isAccessDenied(o.Err) {
			t.Errorf("workflow a listing tenant-b/: %+v, want AccessDenied", o)
		}
	}
	if got := getObject(t, m, b.Prefix+"out.txt"); string(got) != "workflow output\n" {
		t.Errorf("b's object is now %q", got)
	}

	// Neither a workflow's keys nor the installation's are MinIO administrators.
	for _, k := range [][2]string{{a.AccessKey, a.SecretKey}, {"sluice-installation", "installation-secret-1"}} {
		adm, err := madmin.NewWithOptions(m.Endpoint, &madmin.Options{Creds: credentials.NewStaticV4(k[0], k[1], "")})
		if err != nil {
			t.Fatal(err)
		}
		if err := adm.AddUser(ctx, "intruder", "intruder-secret"); err == nil {
			t.Errorf("%s created a MinIO user", k[0])
		}
	}
	// A workflow cannot mint itself wider keys.
	aAccounts, err := NewMinIOAccounts(m.Endpoint, false, Credentials{AccessKey: a.AccessKey, SecretKey: a.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	if err := aAccounts.Ensure(ctx, Account{AccessKey: "sluice-wf-x", SecretKey: "secret-of-workflow-x", Bucket: "results", Prefix: "tenant-b/"}); err == nil {
		t.Error("workflow a's keys made a service account")
	}

	if err := accounts.Remove(ctx, a.AccessKey); err != nil {
		t.Fatal(err)
	}
	if err := accounts.Remove(ctx, a.AccessKey); err != nil {
		t.Errorf("removing a removed account: %v", err)
	}
	if _, err := open(a, "results", a.Prefix).Put(ctx, "late.txt", src); err == nil {
		t.Error("workflow a's keys still store after its account was removed")
	}
}

// The installation's user (the controller's keys) creates its bucket, as the controller
// does at start, and no other.
func TestMinIOInstallationUserCreatesOnlyItsBucket(t *testing.T) {
	m, _ := minioFor(t)
	ctx := context.Background()
	if err := SetupMinIOUser(ctx, m.Endpoint, false, Credentials{AccessKey: m.AccessKey, SecretKey: m.SecretKey}, "sluice-installation", "installation-secret-1", "fresh"); err != nil {
		t.Fatal(err)
	}
	c, err := minio.New(m.Endpoint, &minio.Options{Creds: credentials.NewStaticV4("sluice-installation", "installation-secret-1", "")})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := c.BucketExists(ctx, "fresh"); err != nil || ok {
		t.Fatalf("BucketExists(fresh) = %v, %v; want false", ok, err)
	}
	if err := c.MakeBucket(ctx, "fresh", minio.MakeBucketOptions{}); err != nil {
		t.Fatalf("the installation's user creating its bucket: %v", err)
	}
	if err := c.MakeBucket(ctx, "another", minio.MakeBucketOptions{}); !isAccessDenied(err) {
		t.Errorf("the installation's user creating another bucket: %v, want AccessDenied", err)
	}
	for o := range c.ListObjects(ctx, "results", minio.ListObjectsOptions{}) {
		if !isAccessDenied(o.Err) {
			t.Errorf("the installation's user listing another bucket: %+v, want AccessDenied", o)
		}
	}
}
