package objstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/minio/madmin-go/v3"
	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// Tenants apart on MinIO: MinIO lets a service account list, inspect and delete every
// service account of its own parent user, whatever its policy says
// (cmd/admin-handlers-users.go: a request for the requester's own parent needs no admin
// right). So no two namespaces' keys share a parent: each namespace has a MinIO user of
// its own (NamespaceUser), whose canned policy (NamespacePolicyName) reaches
// <bucket>/<installation prefix><namespace>/ only, and each workflow's keys are a
// service account of its namespace's user whose session policy reaches the workflow's
// prefix only (PrefixPolicy; MinIO grants a service account the intersection of its
// parent's policy and its own). A namespace user's own secret key is random and kept by
// nobody: it is a parent, never a login. Workflows of one namespace (one tenant) can
// still see and delete each other's accounts; the controller re-checks them
// (controller/storagecreds.go). The installation's user (the controller's key, never
// MinIO's root) may use one bucket and administer MinIO's users, policies and service
// accounts (ControllerPolicy): it needs that to make the namespaces' users.

// ControllerPolicyName is the name of the policy SetupMinIOUser attaches to the
// installation's user.
const ControllerPolicyName = "sluice-controller"

// policyDoc is an IAM policy document as MinIO reads it.
type policyDoc struct {
	Version   string      `json:"Version"`
	Statement []statement `json:"Statement"`
}

type statement struct {
	// Sid and Principal are set in a bucket policy's statements only (versitygw's).
	Sid       string                         `json:"Sid,omitempty"`
	Principal *principal                     `json:"Principal,omitempty"`
	Effect    string                         `json:"Effect"`
	Action    []string                       `json:"Action"`
	Resource  []string                       `json:"Resource,omitempty"`
	Condition map[string]map[string][]string `json:"Condition,omitempty"`
}

// principal is a bucket policy statement's Principal: access keys.
type principal struct {
	AWS []string `json:"AWS"`
}

// objectActions are what a sidecar does with its objects: upload (multipart, checked by
// reading the object back), withdraw, and list a prefix.
var objectActions = []string{"s3:GetObject", "s3:PutObject", "s3:DeleteObject",
	"s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"}

func checkPolicyArgs(bucket, prefix string) error {
	if bucket == "" || strings.ContainsAny(bucket, "/*?") {
		return fmt.Errorf("object storage policy: bad bucket %q", bucket)
	}
	if strings.ContainsAny(prefix, "*?") || strings.HasPrefix(prefix, "/") {
		return fmt.Errorf("object storage policy: bad prefix %q", prefix)
	}
	return nil
}

// PrefixPolicy is the policy of a workflow's credentials: the objects under
// bucket/prefix (read, write, delete, multipart uploads) and listing the bucket beneath
// prefix; nothing else. A prefix that is not empty must end with "/", so that "ns/wf/"
// does not also grant "ns/wf2/".
func PrefixPolicy(bucket, prefix string) ([]byte, error) {
	sts, err := prefixStatements(bucket, prefix)
	if err != nil {
		return nil, err
	}
	return json.Marshal(policyDoc{Version: "2012-10-17", Statement: sts})
}

// prefixStatements are PrefixPolicy's statements.
func prefixStatements(bucket, prefix string) ([]statement, error) {
	if err := checkPolicyArgs(bucket, prefix); err != nil {
		return nil, err
	}
	if prefix == "" || !strings.HasSuffix(prefix, "/") {
		return nil, fmt.Errorf("object storage policy: the prefix %q must end with /", prefix)
	}
	return []statement{
		{Effect: "Allow", Action: objectActions, Resource: []string{"arn:aws:s3:::" + bucket + "/" + prefix + "*"}},
		{Effect: "Allow", Action: []string{"s3:ListBucket"}, Resource: []string{"arn:aws:s3:::" + bucket},
			Condition: map[string]map[string][]string{"StringLike": {"s3:prefix": {prefix + "*"}}}},
		{Effect: "Allow", Action: []string{"s3:GetBucketLocation"}, Resource: []string{"arn:aws:s3:::" + bucket}},
	}, nil
}

// iamActions are the admin actions the installation's user needs to give each namespace
// a user and each workflow a service account of it: make and read users, make, read and
// attach policies, make, read, change and remove service accounts. MinIO scopes admin
// actions to no resource, so this is administering MinIO's identities (it could give a
// user of its own any policy): run a MinIO of Sluice's own, and keep the key in
// sluice-system (docs/security.md).
var iamActions = []string{"admin:CreateUser", "admin:GetUser", "admin:ListUsers",
	"admin:CreatePolicy", "admin:GetPolicy", "admin:AttachUserOrGroupPolicy", "admin:ListUserPolicies",
	"admin:CreateServiceAccount", "admin:UpdateServiceAccount", "admin:RemoveServiceAccount", "admin:ListServiceAccounts"}

// ControllerPolicy is the policy of the installation's user: create bucket, and read,
// write, list and delete its objects, and the admin actions of iamActions; no other
// bucket, no bucket policy, no other admin action (configuration, server, data).
func ControllerPolicy(bucket string) ([]byte, error) {
	if err := checkPolicyArgs(bucket, ""); err != nil {
		return nil, err
	}
	doc := policyDoc{Version: "2012-10-17", Statement: []statement{
		{Effect: "Allow", Action: objectActions, Resource: []string{"arn:aws:s3:::" + bucket + "/*"}},
		{Effect: "Allow", Action: []string{"s3:CreateBucket", "s3:ListBucket", "s3:GetBucketLocation", "s3:ListBucketMultipartUploads"},
			Resource: []string{"arn:aws:s3:::" + bucket}},
		{Effect: "Allow", Action: iamActions}, // admin actions name no resource
	}}
	return json.Marshal(doc)
}

// NamespaceUser is the name of the MinIO user of namespace ns, the parent of its
// workflows' service accounts.
func NamespaceUser(ns string) string { return "sluice-ns-" + ns }

// NamespacePolicyName is the name of the canned policy of namespace ns's user.
func NamespacePolicyName(ns string) string { return "sluice-ns-" + ns }

// MinIOAccounts makes and removes the workflows' service accounts, and their namespaces'
// users, through MinIO's admin API (madmin) with the installation's keys. It is safe for
// concurrent use.
type MinIOAccounts struct {
	admin     *madmin.AdminClient
	endpoint  string
	secure    bool
	transport http.RoundTripper
}

// NewMinIOAccounts returns the MinIOAccounts of the user creds.AccessKey at endpoint
// (host:port), over TLS when secure, trusting creds.CA (Transport).
func NewMinIOAccounts(endpoint string, secure bool, creds Credentials) (*MinIOAccounts, error) {
	tr, err := Transport(endpoint, secure, creds.CA)
	if err != nil {
		return nil, err
	}
	adm, err := madmin.NewWithOptions(endpoint, &madmin.Options{Creds: credentials.NewStaticV4(creds.AccessKey, creds.SecretKey, ""), Secure: secure, Transport: tr})
	if err != nil {
		return nil, fmt.Errorf("MinIO admin client for %s: %w", endpoint, err)
	}
	return &MinIOAccounts{admin: adm, endpoint: endpoint, secure: secure, transport: tr}, nil
}

// errCode is the MinIO admin API error code of err, "" if it has none.
func errCode(err error) string {
	var e madmin.ErrorResponse
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// codeServiceAccountNotFound is the code MinIO answers (HTTP 404) for a service account
// that does not exist, or is not the caller's to see.
const codeServiceAccountNotFound = "XMinioInvalidIAMCredentials"

// Account is a workflow's credentials: a service account of its namespace's user
// (NamespaceUser(Namespace), whose policy is PrefixPolicy(Bucket, NamespacePrefix)) whose
// session policy is PrefixPolicy(Bucket, Prefix).
type Account struct {
	// AccessKey and SecretKey are the service account's keys. MinIO takes access keys
	// of 3 to 20 characters and secret keys of 8 to 40.
	AccessKey, SecretKey string
	// Bucket and Prefix are all it reaches (Prefix ends with "/").
	Bucket, Prefix string
	// Namespace is the Kubernetes namespace of the workflow, whose MinIO user is the
	// account's parent; NamespacePrefix is all that user reaches of Bucket: it ends with
	// "/" and Prefix lies under it.
	Namespace, NamespacePrefix string
	// Description tells an operator whose it is (at most 256 characters).
	Description string
}

// Ensure makes the service account a.AccessKey of a's namespace's user with a's secret
// key and policy, making the namespace's user and its policy first if they are missing.
// One that exists under that user and takes a's keys is left as it is (a workflow's
// account is named after the workflow, so its policy does not change); one that does not
// take them, or has another parent (an account made before namespace users, under the
// installation's user), is made again with the same keys. The errors are MinIO's, and
// one naming the field of a that is malformed.
func (m *MinIOAccounts) Ensure(ctx context.Context, a Account) error {
	if a.Namespace == "" || !strings.HasPrefix(a.Prefix, a.NamespacePrefix) {
		return fmt.Errorf("object storage account %s: prefix %q is not under namespace %q's prefix %q", a.AccessKey, a.Prefix, a.Namespace, a.NamespacePrefix)
	}
	policy, err := PrefixPolicy(a.Bucket, a.Prefix)
	if err != nil {
		return err
	}
	parent := NamespaceUser(a.Namespace)
	info, err := m.admin.InfoServiceAccount(ctx, a.AccessKey)
	switch {
	case errCode(err) == codeServiceAccountNotFound:
	case err != nil:
		return fmt.Errorf("reading MinIO service account %s: %w", a.AccessKey, err)
	default:
		if info.ParentUser == parent && m.keysWork(ctx, a) == nil {
			return nil
		}
		if err := m.Remove(ctx, a.AccessKey); err != nil {
			return err
		}
	}
	if err := m.ensureNamespace(ctx, a); err != nil {
		return err
	}
	_, err = m.admin.AddServiceAccount(ctx, madmin.AddServiceAccountReq{
		TargetUser: parent, AccessKey: a.AccessKey, SecretKey: a.SecretKey, Policy: policy, Description: a.Description})
	if err != nil {
		return fmt.Errorf("creating MinIO service account %s of user %s: %w", a.AccessKey, parent, err)
	}
	return nil
}

// codeNoSuchUser is the code MinIO answers for a user that does not exist.
const codeNoSuchUser = "XMinioAdminNoSuchUser"

// ensureNamespace makes the MinIO user of a's namespace, with a random secret key nobody
// keeps, if it is missing, and gives it its policy, PrefixPolicy(a.Bucket,
// a.NamespacePrefix), written again each time (an operator's change is undone).
func (m *MinIOAccounts) ensureNamespace(ctx context.Context, a Account) error {
	user, name := NamespaceUser(a.Namespace), NamespacePolicyName(a.Namespace)
	pol, err := PrefixPolicy(a.Bucket, a.NamespacePrefix)
	if err != nil {
		return err
	}
	if err := m.admin.AddCannedPolicy(ctx, name, pol); err != nil {
		return fmt.Errorf("writing MinIO policy %s: %w", name, err)
	}
	info, err := m.admin.GetUserInfo(ctx, user)
	switch {
	case errCode(err) == codeNoSuchUser:
		secret, err := randomSecret()
		if err != nil {
			return err
		}
		if err := m.admin.AddUser(ctx, user, secret); err != nil {
			return fmt.Errorf("creating MinIO user %s: %w", user, err)
		}
	case err != nil:
		return fmt.Errorf("reading MinIO user %s: %w", user, err)
	}
	for _, p := range strings.Split(info.PolicyName, ",") {
		if p == name {
			return nil
		}
	}
	_, err = m.admin.AttachPolicy(ctx, madmin.PolicyAssociationReq{Policies: []string{name}, User: user})
	if err != nil && errCode(err) != codePolicyAlreadyApplied {
		return fmt.Errorf("attaching policy %s to MinIO user %s: %w", name, user, err)
	}
	return nil
}

// codePolicyAlreadyApplied is the code MinIO answers for attaching a policy a user has.
const codePolicyAlreadyApplied = "XMinioAdminPolicyChangeAlreadyApplied"

// randomSecret is 40 random hex characters, MinIO's longest secret key.
func randomSecret() (string, error) {
	b := make([]byte, 20)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("making a secret key: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// keysWork makes a request with a's keys that its policy allows.
func (m *MinIOAccounts) keysWork(ctx context.Context, a Account) error {
	c, err := minio.New(m.endpoint, &minio.Options{Creds: credentials.NewStaticV4(a.AccessKey, a.SecretKey, ""), Secure: m.secure, Transport: m.transport})
	if err != nil {
		return err
	}
	_, err = c.GetBucketLocation(ctx, a.Bucket)
	return err
}

// Remove deletes the service account accessKey; one that does not exist is not an error.
func (m *MinIOAccounts) Remove(ctx context.Context, accessKey string) error {
	err := m.admin.DeleteServiceAccount(ctx, accessKey)
	if err != nil && errCode(err) != codeServiceAccountNotFound {
		return fmt.Errorf("deleting MinIO service account %s: %w", accessKey, err)
	}
	return nil
}

// SetupMinIOUser gives the installation its own MinIO user, run with MinIO's root keys
// (root: its keys, and the CA to trust) by the bundled MinIO's setup container and
// nowhere else: the policy ControllerPolicyName (ControllerPolicy of bucket) and the user
// accessKey with secretKey and that policy. It is idempotent: an existing user gets
// secretKey again.
func SetupMinIOUser(ctx context.Context, endpoint string, secure bool, root Credentials, accessKey, secretKey, bucket string) error {
	if accessKey == root.AccessKey {
		return fmt.Errorf("the installation's object storage key %q is MinIO's root user: give it its own", accessKey)
	}
	tr, err := Transport(endpoint, secure, root.CA)
	if err != nil {
		return err
	}
	adm, err := madmin.NewWithOptions(endpoint, &madmin.Options{Creds: credentials.NewStaticV4(root.AccessKey, root.SecretKey, ""), Secure: secure, Transport: tr})
	if err != nil {
		return fmt.Errorf("MinIO admin client for %s: %w", endpoint, err)
	}
	pol, err := ControllerPolicy(bucket)
	if err != nil {
		return err
	}
	if err := adm.AddCannedPolicy(ctx, ControllerPolicyName, pol); err != nil {
		return fmt.Errorf("creating MinIO policy %s: %w", ControllerPolicyName, err)
	}
	if err := adm.AddUser(ctx, accessKey, secretKey); err != nil {
		return fmt.Errorf("creating MinIO user %s: %w", accessKey, err)
	}
	info, err := adm.GetUserInfo(ctx, accessKey)
	if err != nil {
		return fmt.Errorf("reading MinIO user %s: %w", accessKey, err)
	}
	if info.PolicyName == ControllerPolicyName {
		return nil
	}
	if info.PolicyName != "" {
		if _, err := adm.DetachPolicy(ctx, madmin.PolicyAssociationReq{Policies: strings.Split(info.PolicyName, ","), User: accessKey}); err != nil {
			return fmt.Errorf("detaching policies %s from MinIO user %s: %w", info.PolicyName, accessKey, err)
		}
	}
	if _, err := adm.AttachPolicy(ctx, madmin.PolicyAssociationReq{Policies: []string{ControllerPolicyName}, User: accessKey}); err != nil {
		return fmt.Errorf("attaching policy %s to MinIO user %s: %w", ControllerPolicyName, accessKey, err)
	}
	return nil
}
