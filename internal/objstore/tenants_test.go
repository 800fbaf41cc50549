package objstore

import (
	"context"
	"encoding/xml"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/sluice-io/sluice/internal/servers"
	"github.com/sluice-io/sluice/internal/testenv"
)

// On each server, the keys the installation's account (not root) makes for a workflow
// read, write, list and withdraw the workflow's own prefix and get AccessDenied on
// another tenant's prefix (reading, writing, deleting, listing), on a prefix that merely
// starts with the same letters, and on another bucket; another tenant's object is left
// as it was; removed keys stop working, and removing them again is no error.
func TestWorkflowKeysReachOnlyTheirPrefix(t *testing.T) {
	forEachS3WithAccounts(t, func(t *testing.T, m *servers.S3, accounts accountMaker) {
		ctx := context.Background()
		root, err := m.Client()
		if err != nil {
			t.Fatal(err)
		}
		if err := root.MakeBucket(ctx, "other", minio.MakeBucketOptions{}); err != nil {
			t.Fatal(err)
		}
		a := Account{AccessKey: "sluiceaaaaaaaaaaaaaa", SecretKey: "secret-of-workflow-a", Bucket: "results", Prefix: "tenant-a/wf-a/",
			Namespace: "tenant-a", NamespacePrefix: "tenant-a/", Description: "tenant-a/wf-a"}
		b := Account{AccessKey: "sluicebbbbbbbbbbbbbb", SecretKey: "secret-of-workflow-b", Bucket: "results", Prefix: "tenant-b/wf-b/",
			Namespace: "tenant-b", NamespacePrefix: "tenant-b/", Description: "tenant-b/wf-b"}
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
		if _, err := open(b, "results", b.Prefix).Put(ctx, "out.txt", src); err != nil {
			t.Fatalf("workflow b storing under its own prefix: %v", err)
		}
		own := open(a, "results", a.Prefix)
		if _, err := own.Put(ctx, "dir/out.txt", src); err != nil {
			t.Fatalf("workflow a storing under its own prefix: %v", err)
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

		if err := accounts.Remove(ctx, a.AccessKey); err != nil {
			t.Fatal(err)
		}
		if err := accounts.Remove(ctx, a.AccessKey); err != nil {
			t.Errorf("removing a removed account: %v", err)
		}
		if _, err := open(a, "results", a.Prefix).Put(ctx, "late.txt", src); err == nil {
			t.Error("workflow a's keys still store after its account was removed")
		}
		if _, err := open(b, "results", b.Prefix).Put(ctx, "again.txt", src); err != nil {
			t.Errorf("workflow b storing after a's account was removed: %v", err)
		}
	})
}

// versityAdminAs calls versitygw's admin API at m.AdminEndpoint (or at endpoint when
// given) with the keys creds, as anyone holding them could.
func versityAdminAs(t *testing.T, endpoint string, creds Credentials) *VersityGWAccounts {
	t.Helper()
	v, err := newVersityAdmin(endpoint, false, creds)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// On versitygw, tenant A's keys (an account of role user) administer nothing: versitygw's
// admin API refuses them listing, making, changing and deleting accounts, tenant B's
// among them, and B's keys keep storing; they can neither read nor change the bucket's
// policy (which names every workflow's access key); and the admin API does not answer on
// the S3 port at all (--admin-port), so a NetworkPolicy can keep tenants off it. An
// account an operator deleted, whose statements are still in the policy, does not stop
// the next workflow's grant (versitygw refuses policies naming unknown principals).
func TestVersityGWTenantKeysAdministerNothing(t *testing.T) {
	testenv.Integration(t, "versitygw")
	g, err := servers.StartVersityGW(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Stop)
	ctx := context.Background()
	root, err := g.Bucket(ctx, "results")
	if err != nil {
		t.Fatal(err)
	}
	rootCreds := Credentials{AccessKey: g.AccessKey, SecretKey: g.SecretKey}
	if err := SetupVersityGWUser(ctx, g.AdminEndpoint, false, rootCreds, "sluice-installation", "installation-secret-1"); err != nil {
		t.Fatal(err)
	}
	if err := SetupVersityGWUser(ctx, g.AdminEndpoint, false, rootCreds, "sluice-installation", "installation-secret-1"); err != nil {
		t.Fatalf("SetupVersityGWUser again: %v", err)
	}
	if err := SetupVersityGWUser(ctx, g.AdminEndpoint, false, rootCreds, g.AccessKey, "x"); err == nil {
		t.Error("SetupVersityGWUser accepted versitygw's root as the installation's key")
	}
	installation := Credentials{AccessKey: "sluice-installation", SecretKey: "installation-secret-1"}
	accounts, err := NewVersityGWAccounts(g.Endpoint, g.AdminEndpoint, "results", false, installation)
	if err != nil {
		t.Fatal(err)
	}
	a := Account{AccessKey: "sluiceaaaaaaaaaaaaaa", SecretKey: "secret-of-workflow-a", Bucket: "results", Prefix: "team-a/wf/", Namespace: "team-a", NamespacePrefix: "team-a/"}
	b := Account{AccessKey: "sluicebbbbbbbbbbbbbb", SecretKey: "secret-of-workflow-b", Bucket: "results", Prefix: "team-b/secret-project/", Namespace: "team-b", NamespacePrefix: "team-b/"}
	for _, acc := range []Account{a, b} {
		if err := accounts.Ensure(ctx, acc); err != nil {
			t.Fatal(err)
		}
	}
	tenant := versityAdminAs(t, g.AdminEndpoint, Credentials{AccessKey: a.AccessKey, SecretKey: a.SecretKey})
	if users, err := tenant.users(ctx); versityCode(err) != "XAdminAccessDenied" {
		t.Errorf("tenant A listing accounts: %v, %v; want XAdminAccessDenied", users, err)
	}
	if err := tenant.putUser(ctx, versityAccount{Access: b.AccessKey, Secret: "taken-over-by-tenant-a", Role: "user"}); versityCode(err) != "XAdminAccessDenied" {
		t.Errorf("tenant A re-keying tenant B's account: %v, want XAdminAccessDenied", err)
	}
	if err := tenant.putUser(ctx, versityAccount{Access: "intruder0001", Secret: "intruder-secret", Role: "admin"}); versityCode(err) != "XAdminAccessDenied" {
		t.Errorf("tenant A making itself an admin account: %v, want XAdminAccessDenied", err)
	}
	if _, err := tenant.adminCall(ctx, "/delete-user", map[string][]string{"access": {b.AccessKey}}, nil); versityCode(err) != "XAdminAccessDenied" {
		t.Errorf("tenant A deleting tenant B's account: %v, want XAdminAccessDenied", err)
	}
	aClient, err := minio.New(g.Endpoint, &minio.Options{Creds: credentials.NewStaticV4(a.AccessKey, a.SecretKey, "")})
	if err != nil {
		t.Fatal(err)
	}
	if err := aClient.MakeBucket(ctx, "tenant-a-own", minio.MakeBucketOptions{}); !isAccessDenied(err) {
		t.Errorf("tenant A making a bucket of its own: %v, want AccessDenied", err)
	}
	if pol, err := aClient.GetBucketPolicy(ctx, "results"); !isAccessDenied(err) {
		t.Errorf("tenant A reading the bucket's policy: %q, %v; want AccessDenied", pol, err)
	}
	wide := `{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"AWS":["` + a.AccessKey + `"]},"Action":["s3:*"],"Resource":["arn:aws:s3:::results/*"]}]}`
	if err := aClient.SetBucketPolicy(ctx, "results", wide); !isAccessDenied(err) {
		t.Errorf("tenant A widening the bucket's policy: %v, want AccessDenied", err)
	}
	src := filepath.Join(t.TempDir(), "out.txt")
	if err := os.WriteFile(src, []byte("b's result\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := Open(ctx, "s3://results/"+b.Prefix+"?endpoint="+g.Endpoint, Credentials{AccessKey: b.AccessKey, SecretKey: b.SecretKey})
	if err != nil {
		t.Fatal(err)
	}
	st.(*S3).RetryFor = 1
	if _, err := st.Put(ctx, "out.txt", src); err != nil {
		t.Errorf("tenant B storing after tenant A's attempts: %v", err)
	}

	// The S3 port does not serve the admin API, even to the installation's keys.
	onS3 := versityAdminAs(t, g.Endpoint, installation)
	if _, err := onS3.users(ctx); err == nil {
		t.Error("versitygw's S3 port answered the admin API")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPatch, "http://"+g.Endpoint+"/list-users", nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := http.DefaultClient.Do(req); err == nil {
		var e struct{ Code string }
		_ = xml.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode < 300 || strings.HasPrefix(e.Code, "XAdmin") {
			t.Errorf("PATCH /list-users on the S3 port: HTTP %d %s, want an S3 error", resp.StatusCode, e.Code)
		}
	}

	// An operator deletes b's account behind Sluice's back: its statements stay in the
	// policy, which versitygw would now refuse to store again; the next grant drops them.
	if _, err := versityAdminAs(t, g.AdminEndpoint, installation).adminCall(ctx, "/delete-user", map[string][]string{"access": {b.AccessKey}}, nil); err != nil {
		t.Fatal(err)
	}
	c := Account{AccessKey: "sluicecccccccccccccc", SecretKey: "secret-of-workflow-c", Bucket: "results", Prefix: "team-c/wf/", Namespace: "team-c", NamespacePrefix: "team-c/"}
	if err := accounts.Ensure(ctx, c); err != nil {
		t.Fatalf("a grant after an account was deleted behind Sluice's back: %v", err)
	}
	pol, err := root.GetBucketPolicy(ctx, "results")
	if err != nil || strings.Contains(pol, b.AccessKey) || !strings.Contains(pol, c.AccessKey) || !strings.Contains(pol, a.AccessKey) {
		t.Errorf("the bucket's policy is %s (%v): want a's and c's statements, not b's", pol, err)
	}
	if err := accounts.Ensure(ctx, Account{AccessKey: "sluicedddddddddddddd", SecretKey: "secret-of-workflow-d", Bucket: "other", Prefix: "team-d/wf/", Namespace: "team-d", NamespacePrefix: "team-d/"}); err == nil {
		t.Error("Ensure granted a prefix of a bucket whose policy it does not keep")
	}
}

// The bucket's policy holds every running workflow's grant (about 650 bytes each), more
// than the extended attribute versitygw's posix backend keeps it in without --sidecar
// (six on ext4): 12 workflows each store under their own prefix, and once all are
// removed the policy is gone.
func TestVersityGWGrantsManyWorkflows(t *testing.T) {
	testenv.Integration(t, "versitygw")
	g, err := servers.StartVersityGW(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Stop)
	ctx := context.Background()
	root, err := g.Bucket(ctx, "results")
	if err != nil {
		t.Fatal(err)
	}
	if err := SetupVersityGWUser(ctx, g.AdminEndpoint, false, Credentials{AccessKey: g.AccessKey, SecretKey: g.SecretKey}, "sluice-installation", "installation-secret-1"); err != nil {
		t.Fatal(err)
	}
	accounts, err := NewVersityGWAccounts(g.Endpoint, g.AdminEndpoint, "results", false, Credentials{AccessKey: "sluice-installation", SecretKey: "installation-secret-1"})
	if err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(t.TempDir(), "out.txt")
	if err := os.WriteFile(src, []byte("out\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var all []Account
	for i := range 12 {
		acc := Account{AccessKey: fmt.Sprintf("sluice%014d", i), SecretKey: fmt.Sprintf("secret-of-workflow-%d", i), Bucket: "results",
			Prefix: fmt.Sprintf("ns/wf-%d/", i), Namespace: "ns", NamespacePrefix: "ns/"}
		if err := accounts.Ensure(ctx, acc); err != nil {
			t.Fatalf("workflow %d: %v", i, err)
		}
		all = append(all, acc)
	}
	for _, acc := range all {
		st, err := Open(ctx, "s3://results/"+acc.Prefix+"?endpoint="+g.Endpoint, Credentials{AccessKey: acc.AccessKey, SecretKey: acc.SecretKey})
		if err != nil {
			t.Fatal(err)
		}
		st.(*S3).RetryFor = 1
		if _, err := st.Put(ctx, "out.txt", src); err != nil {
			t.Errorf("%s storing under its prefix: %v", acc.AccessKey, err)
		}
	}
	for _, acc := range all {
		if err := accounts.Remove(ctx, acc.AccessKey); err != nil {
			t.Fatal(err)
		}
	}
	if pol, err := root.GetBucketPolicy(ctx, "results"); err != nil || pol != "" {
		t.Errorf("the policy once every workflow is removed: %q, %v; want none", pol, err)
	}
	if err := accounts.Remove(ctx, all[0].AccessKey); err != nil {
		t.Errorf("removing an account again, with no policy left: %v", err)
	}
}
