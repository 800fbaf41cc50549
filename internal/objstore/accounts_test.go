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

	"github.com/sluice-io/sluice/internal/servers"
)

func isAccessDenied(err error) bool {
	var e minio.ErrorResponse
	return errors.As(err, &e) && e.Code == "AccessDenied"
}

// MinIO's admin API (this test is about MinIO's accounts; what every server's workflow
// keys reach is TestWorkflowKeysReachOnlyTheirPrefix): SetupMinIOUser is idempotent and
// refuses MinIO's root as the installation's key; a workflow's keys administer nothing
// and cannot mint themselves wider keys; the installation's user administers identities
// only, not the server or its configuration.
func TestMinIOWorkflowAccountsAdministerNothing(t *testing.T) {
	m, _ := minioFor(t) // bucket "results"
	ctx := context.Background()
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
	a := Account{AccessKey: "sluice-wf-a", SecretKey: "secret-of-workflow-a", Bucket: "results", Prefix: "tenant-a/wf-a/",
		Namespace: "tenant-a", NamespacePrefix: "tenant-a/", Description: "tenant-a/wf-a"}
	if err := accounts.Ensure(ctx, a); err != nil {
		t.Fatal(err)
	}

	// A workflow's keys administer nothing; the installation's administer identities only
	// (users, policies, service accounts), not the server or its configuration.
	adm, err := madmin.NewWithOptions(m.Endpoint, &madmin.Options{Creds: credentials.NewStaticV4(a.AccessKey, a.SecretKey, "")})
	if err != nil {
		t.Fatal(err)
	}
	if err := adm.AddUser(ctx, "intruder", "intruder-secret"); err == nil {
		t.Error("a workflow's keys created a MinIO user")
	}
	inst, err := madmin.NewWithOptions(m.Endpoint, &madmin.Options{Creds: credentials.NewStaticV4("sluice-installation", "installation-secret-1", "")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := inst.ServerInfo(ctx); err == nil {
		t.Error("the installation's keys read the server's information")
	}
	if _, err := inst.GetConfig(ctx); err == nil {
		t.Error("the installation's keys read the server's configuration")
	}
	// A workflow cannot mint itself wider keys.
	aAccounts, err := NewMinIOAccounts(m.Endpoint, false, Credentials{AccessKey: a.AccessKey, SecretKey: a.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	if err := aAccounts.Ensure(ctx, Account{AccessKey: "sluice-wf-x", SecretKey: "secret-of-workflow-x", Bucket: "results", Prefix: "tenant-b/x/",
		Namespace: "tenant-b", NamespacePrefix: "tenant-b/"}); err == nil {
		t.Error("workflow a's keys made a service account")
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

// adminAs is a MinIO admin client with the keys of acc, as a tenant holding only its
// workflow's Secret has them.
func adminAs(t *testing.T, endpoint string, acc Account) *madmin.AdminClient {
	t.Helper()
	adm, err := madmin.NewWithOptions(endpoint, &madmin.Options{Creds: credentials.NewStaticV4(acc.AccessKey, acc.SecretKey, "")})
	if err != nil {
		t.Fatal(err)
	}
	return adm
}

// No two namespaces' keys share a parent (issue 43: every workflow's keys were service
// accounts of the installation's user, and MinIO lets siblings list, inspect and delete
// each other with no admin right). With only tenant A's keys, tenant B's account can
// be neither listed, inspected, changed nor deleted, nor can A make one for B or more
// for itself, and B's keys keep storing; A's listing shows its own namespace's accounts
// only. An account made before namespace users, under the installation's user, is made
// again under its namespace's user, with the same keys.
func TestTenantKeysCannotManageAnotherTenantsAccount(t *testing.T) {
	m, _ := minioFor(t)
	ctx := context.Background()
	root := Credentials{AccessKey: m.AccessKey, SecretKey: m.SecretKey}
	if err := SetupMinIOUser(ctx, m.Endpoint, false, root, "sluice-installation", "installation-secret-1", "results"); err != nil {
		t.Fatal(err)
	}
	installation := Credentials{AccessKey: "sluice-installation", SecretKey: "installation-secret-1"}
	accounts, err := NewMinIOAccounts(m.Endpoint, false, installation)
	if err != nil {
		t.Fatal(err)
	}
	a := Account{AccessKey: "sluiceaaaaaaaaaaaaaa", SecretKey: "secret-of-workflow-a", Bucket: "results", Prefix: "team-a/wf/", Namespace: "team-a", NamespacePrefix: "team-a/"}
	a2 := Account{AccessKey: "sluiceaaaaaaaaaaaaa2", SecretKey: "secret-of-workflow-a2", Bucket: "results", Prefix: "team-a/wf2/", Namespace: "team-a", NamespacePrefix: "team-a/"}
	b := Account{AccessKey: "sluicebbbbbbbbbbbbbb", SecretKey: "secret-of-workflow-b", Bucket: "results", Prefix: "team-b/secret-project/", Namespace: "team-b", NamespacePrefix: "team-b/"}
	for _, acc := range []Account{a, a2, b} {
		if err := accounts.Ensure(ctx, acc); err != nil {
			t.Fatal(err)
		}
	}
	tenant := adminAs(t, m.Endpoint, a)
	if list, err := tenant.ListServiceAccounts(ctx, NamespaceUser("team-b")); err == nil {
		t.Errorf("tenant A listed tenant B's accounts: %+v", list)
	}
	list, err := tenant.ListServiceAccounts(ctx, "")
	if err != nil {
		t.Fatalf("tenant A listing its own namespace's accounts: %v", err)
	}
	for _, sa := range list.Accounts {
		if sa.AccessKey == b.AccessKey {
			t.Errorf("tenant A's listing shows tenant B's account %s", b.AccessKey)
		}
	}
	if info, err := tenant.InfoServiceAccount(ctx, b.AccessKey); err == nil {
		t.Errorf("tenant A read tenant B's account: %+v", info)
	}
	if err := tenant.UpdateServiceAccount(ctx, b.AccessKey, madmin.UpdateServiceAccountReq{NewSecretKey: "taken-over-by-tenant-a"}); err == nil {
		t.Error("tenant A changed tenant B's secret key")
	}
	if err := tenant.DeleteServiceAccount(ctx, b.AccessKey); err == nil {
		t.Error("tenant A deleted tenant B's account")
	}
	if _, err := tenant.AddServiceAccount(ctx, madmin.AddServiceAccountReq{TargetUser: NamespaceUser("team-b"), AccessKey: "intruderkey0001", SecretKey: "intruder-secret"}); err == nil {
		t.Error("tenant A made an account of tenant B's user")
	}
	if _, err := tenant.AddServiceAccount(ctx, madmin.AddServiceAccountReq{AccessKey: "spamkey000001", SecretKey: "spam-secret-1"}); err == nil {
		t.Error("tenant A made itself another account")
	}
	src := filepath.Join(t.TempDir(), "out.txt")
	if err := os.WriteFile(src, []byte("b's result\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := Open(ctx, "s3://results/"+b.Prefix+"?endpoint="+m.Endpoint, Credentials{AccessKey: b.AccessKey, SecretKey: b.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	st.(*S3).RetryFor = 1
	if _, err := st.Put(ctx, "out.txt", src); err != nil {
		t.Errorf("tenant B storing after tenant A's attempts: %v", err)
	}

	// An account of the installation's user, as a release before namespace users made
	// it, is made again under its namespace's user, keeping its keys.
	old := Account{AccessKey: "sluiceoooooooooooooo", SecretKey: "secret-of-an-old-one", Bucket: "results", Prefix: "team-b/old/", Namespace: "team-b", NamespacePrefix: "team-b/"}
	pol, err := PrefixPolicy("results", old.Prefix)
	if err != nil {
		t.Fatal(err)
	}
	instAdm, err := madmin.NewWithOptions(m.Endpoint, &madmin.Options{Creds: credentials.NewStaticV4(installation.AccessKey, installation.SecretKey, "")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := instAdm.AddServiceAccount(ctx, madmin.AddServiceAccountReq{AccessKey: old.AccessKey, SecretKey: old.SecretKey, Policy: pol}); err != nil {
		t.Fatal(err)
	}
	if err := accounts.Ensure(ctx, old); err != nil {
		t.Fatal(err)
	}
	info, err := instAdm.InfoServiceAccount(ctx, old.AccessKey)
	if err != nil || info.ParentUser != NamespaceUser("team-b") {
		t.Errorf("the old account's parent is %q (%v), want %s", info.ParentUser, err, NamespaceUser("team-b"))
	}
	if err := accounts.keysWork(ctx, old); err != nil {
		t.Errorf("the old account's keys after it was made again: %v", err)
	}
}

// An upload whose keys the server does not know (its account was deleted) is retried
// with RetryUnknownKeys, telling OnRetry, and completes once the account is made again,
// as the controller does; without it the upload fails at once. On MinIO and versitygw.
func TestUnknownKeyIsRetriedUntilTheAccountIsBack(t *testing.T) {
	forEachS3WithAccounts(t, testUnknownKeyIsRetriedUntilTheAccountIsBack)
}

func testUnknownKeyIsRetriedUntilTheAccountIsBack(t *testing.T, m *servers.S3, accounts accountMaker) {
	ctx := context.Background()
	acc := Account{AccessKey: "sluicecccccccccccccc", SecretKey: "secret-of-workflow-c", Bucket: "results", Prefix: "team-c/wf/", Namespace: "team-c", NamespacePrefix: "team-c/"}
	src := filepath.Join(t.TempDir(), "out.txt")
	if err := os.WriteFile(src, []byte("kept\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	open := func() *S3 {
		st, err := Open(ctx, "s3://results/"+acc.Prefix+"?endpoint="+m.Endpoint, Credentials{AccessKey: acc.AccessKey, SecretKey: acc.SecretKey})
		if err != nil {
			t.Fatal(err)
		}
		return st.(*S3)
	}
	if _, err := open().Put(ctx, "out.txt", src); !IsUnknownKey(err) {
		t.Fatalf("an upload with unknown keys: %v, want InvalidAccessKeyId at once", err)
	}
	s := open()
	s.RetryUnknownKeys = true
	retried := make(chan error, 100)
	s.OnRetry = func(err error) { retried <- err }
	done := make(chan error, 1)
	go func() { _, err := s.Put(ctx, "out.txt", src); done <- err }()
	select {
	case err := <-retried:
		if !IsUnknownKey(err) {
			t.Fatalf("OnRetry got %v, want the unknown key", err)
		}
	case err := <-done:
		t.Fatalf("the upload ended before it was retried: %v", err)
	}
	if err := accounts.Ensure(ctx, acc); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the upload once the account is back: %v", err)
	}
	if got := getObject(t, m, acc.Prefix+"out.txt"); string(got) != "kept\n" {
		t.Errorf("stored %q", got)
	}
}
