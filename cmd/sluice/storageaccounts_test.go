package main

import (
	"context"
	"strings"
	"testing"

	"github.com/sluice-io/sluice/internal/objstore"
	"github.com/sluice-io/sluice/internal/podconfig"
	"github.com/sluice-io/sluice/internal/servers"
	"github.com/sluice-io/sluice/internal/testenv"
)

// --storage-accounts takes minio, versitygw or none; anything else, or an admin endpoint
// for MinIO (whose admin API is its S3 port), is an error naming the flag; none, or no
// storage, gives workflows no keys of their own (they need a secretRef).
func TestStorageAccountsSetting(t *testing.T) {
	storage := &podconfig.Storage{Endpoint: "127.0.0.1:1", Bucket: "sluice", AccessKey: "installation", SecretKey: "installation-secret"}
	for _, tc := range []struct {
		kind, admin, wantErr string
		wantNone             bool
	}{
		{kind: "seaweedfs", wantErr: "--storage-accounts"},
		{kind: "minio", admin: "127.0.0.1:2", wantErr: "--storage-admin-endpoint"},
		{kind: "none", wantNone: true},
		{kind: "minio"},
		{kind: "versitygw", admin: "127.0.0.1:2"},
	} {
		a, err := newStorageAccounts(tc.kind, storage, tc.admin, nil)
		switch {
		case tc.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%s: %v, want an error naming %s", tc.kind, err, tc.wantErr)
			}
		case err != nil:
			t.Errorf("%s: %v", tc.kind, err)
		case (a == nil) != tc.wantNone:
			t.Errorf("%s: accounts %v, want none: %v", tc.kind, a, tc.wantNone)
		}
	}
	if a, err := newStorageAccounts("minio", nil, "", nil); a != nil || err != nil {
		t.Errorf("no storage: %v, %v; want no accounts", a, err)
	}
}

// A controller whose --storage-accounts names another server than the one at
// --storage-endpoint fails each workflow's account with an error that names the setting:
// minio against versitygw, versitygw against MinIO (and against versitygw's S3 port,
// which is not its admin API).
func TestStorageAccountsOfTheWrongServerNameTheSetting(t *testing.T) {
	testenv.Integration(t, "MinIO and versitygw")
	ctx := context.Background()
	m, err := servers.StartMinIO(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Stop)
	g, err := servers.StartVersityGW(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Stop)
	acc := objstore.Account{AccessKey: "sluiceaaaaaaaaaaaaaa", SecretKey: "secret-of-workflow-a", Bucket: "sluice", Prefix: "ns/wf/", Namespace: "ns", NamespacePrefix: "ns/"}
	for _, tc := range []struct {
		name, kind, admin, want string
		s3                      *servers.S3
	}{
		{"minio on versitygw", "minio", "", "--storage-accounts=minio", &g.S3},
		{"versitygw on MinIO", "versitygw", "", "not versitygw's admin API", &m.S3},
		{"versitygw's S3 port as its admin API", "versitygw", g.Endpoint, "not versitygw's admin API", &g.S3},
	} {
		storage := &podconfig.Storage{Endpoint: tc.s3.Endpoint, Bucket: "sluice", AccessKey: tc.s3.AccessKey, SecretKey: tc.s3.SecretKey}
		a, err := newStorageAccounts(tc.kind, storage, tc.admin, nil)
		if err != nil {
			t.Fatal(err)
		}
		err = a.Ensure(ctx, acc)
		if err == nil || !strings.Contains(err.Error(), "--storage-accounts="+tc.kind) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Ensure = %v, want an error naming --storage-accounts=%s and %q", tc.name, err, tc.kind, tc.want)
		}
	}
}
