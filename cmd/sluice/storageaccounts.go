package main

import (
	"context"
	"fmt"

	"github.com/sluice-io/sluice/controller"
	"github.com/sluice-io/sluice/internal/objstore"
	"github.com/sluice-io/sluice/internal/podconfig"
)

// The values of the controller's --storage-accounts.
const (
	storageAccountsMinIO     = "minio"
	storageAccountsVersityGW = "versitygw"
	storageAccountsNone      = "none"
)

// newStorageAccounts returns what gives each workflow keys of its own on the
// installation's object storage, as --storage-accounts (kind) says: MinIO's service
// accounts, versitygw's accounts (its admin API at adminEndpoint, or the S3 endpoint when
// empty), or nil for none (and when the installation has no storage), in which case a
// workflow that stores there must name a secretRef. ca is the CA a TLS endpoint's
// certificate may chain to. An unknown kind, or an admin endpoint with another kind, is
// an error naming the flag.
func newStorageAccounts(kind string, storage *podconfig.Storage, adminEndpoint string, ca []byte) (controller.StorageAccounts, error) {
	switch kind {
	case storageAccountsMinIO, storageAccountsVersityGW, storageAccountsNone:
	default:
		return nil, fmt.Errorf("--storage-accounts=%q: want %s, %s or %s", kind, storageAccountsMinIO, storageAccountsVersityGW, storageAccountsNone)
	}
	if adminEndpoint != "" && kind != storageAccountsVersityGW {
		return nil, fmt.Errorf("--storage-admin-endpoint is for --storage-accounts=%s only (MinIO serves its admin API on the S3 port)", storageAccountsVersityGW)
	}
	if storage == nil || kind == storageAccountsNone {
		return nil, nil
	}
	creds := objstore.Credentials{AccessKey: storage.AccessKey, SecretKey: storage.SecretKey, CA: ca}
	var a controller.StorageAccounts
	var err error
	if kind == storageAccountsVersityGW {
		a, err = objstore.NewVersityGWAccounts(storage.Endpoint, adminEndpoint, storage.Bucket, storage.Secure, creds)
	} else {
		a, err = objstore.NewMinIOAccounts(storage.Endpoint, storage.Secure, creds)
	}
	if err != nil {
		return nil, fmt.Errorf("--storage-accounts=%s: %w", kind, err)
	}
	return namedAccounts{kind: kind, accounts: a}, nil
}

// namedAccounts prefixes accounts' errors with the --storage-accounts setting: the
// errors of one server's admin API asked of another (MinIO's of versitygw, say) do not
// name the setting to check otherwise.
type namedAccounts struct {
	kind     string
	accounts controller.StorageAccounts
}

// Ensure is the accounts' Ensure; its error names the setting.
func (n namedAccounts) Ensure(ctx context.Context, a objstore.Account) error {
	if err := n.accounts.Ensure(ctx, a); err != nil {
		return fmt.Errorf("--storage-accounts=%s: %w", n.kind, err)
	}
	return nil
}

// Remove is the accounts' Remove; its error names the setting.
func (n namedAccounts) Remove(ctx context.Context, accessKey string) error {
	if err := n.accounts.Remove(ctx, accessKey); err != nil {
		return fmt.Errorf("--storage-accounts=%s: %w", n.kind, err)
	}
	return nil
}
