package objstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/minio/minio-go/v7/pkg/signer"
)

// Tenants apart on versitygw: versitygw's own IAM (its internal one, accounts in a file on
// the gateway; the standalone IAM service of 1.8, AWS IAM's API in a second process, is
// not used) has no service accounts, no parent users and no identity policies; an
// account of role "user" reaches the buckets it owns and what a bucket's policy grants
// its access key, and only an account of role "admin" may use the admin API (accounts
// list, made, changed, deleted). So each workflow's keys are an account of its own of
// role "user", which owns no bucket, and the installation's bucket's policy grants each
// such account its workflow's prefix only (a statement per account, PrefixPolicy's three
// with the account as Principal): no two workflows' keys share anything but the bucket,
// none can see, change or delete another's account, nor read or change the bucket's
// policy (the bucket's owner, the installation's account, may). The installation's
// account is of role "admin": versitygw has no narrower role that may make accounts, and
// an admin reaches every bucket of the gateway (run a versitygw that serves Sluice only,
// and its admin API on a port of its own, --admin-port, that tenants' pods cannot reach).
// The policy grows by about 650 bytes a workflow, so versitygw's posix backend must keep
// metadata in files (--sidecar DIR): in an extended attribute it fits six workflows.

// VersityGWAccounts makes and removes the workflows' accounts on versitygw through its
// admin API, and keeps the installation's bucket's policy granting each its prefix, with
// the installation's keys (an account of role admin, or versitygw's root). It is safe for
// concurrent use; the bucket's policy is rewritten by one call at a time, so only one
// VersityGWAccounts (one controller) should manage a bucket.
type VersityGWAccounts struct {
	admin  string // admin API base URL, http[s]://host:port
	s3     *minio.Client
	creds  Credentials
	hc     *http.Client
	region string
	mu     sync.Mutex // the bucket policy's read-modify-write
	bucket string
}

// versityRegion is the region versitygw signs and checks requests in unless started with
// --region.
const versityRegion = "us-east-1"

// NewVersityGWAccounts returns the VersityGWAccounts of the admin account creds.AccessKey
// on the versitygw whose S3 API is at s3Endpoint and whose admin API is at adminEndpoint
// (both host:port; adminEndpoint empty: the S3 port, as versitygw serves it without
// --admin-port), over TLS when secure, trusting creds.CA (Transport), granting workflows
// prefixes of bucket (which the installation's account owns). It contacts nothing.
func NewVersityGWAccounts(s3Endpoint, adminEndpoint, bucket string, secure bool, creds Credentials) (*VersityGWAccounts, error) {
	if err := checkPolicyArgs(bucket, ""); err != nil {
		return nil, err
	}
	if adminEndpoint == "" {
		adminEndpoint = s3Endpoint
	}
	v, err := newVersityAdmin(adminEndpoint, secure, creds)
	if err != nil {
		return nil, err
	}
	tr, err := Transport(s3Endpoint, secure, creds.CA)
	if err != nil {
		return nil, err
	}
	v.s3, err = minio.New(s3Endpoint, &minio.Options{Creds: credentials.NewStaticV4(creds.AccessKey, creds.SecretKey, ""),
		Secure: secure, Transport: tr, Region: versityRegion})
	if err != nil {
		return nil, fmt.Errorf("versitygw S3 client for %s: %w", s3Endpoint, err)
	}
	v.bucket = bucket
	return v, nil
}

// newVersityAdmin is a VersityGWAccounts that reaches the admin API only.
func newVersityAdmin(adminEndpoint string, secure bool, creds Credentials) (*VersityGWAccounts, error) {
	tr, err := Transport(adminEndpoint, secure, creds.CA)
	if err != nil {
		return nil, err
	}
	scheme := "http"
	if secure {
		scheme = "https"
	}
	hc := &http.Client{Timeout: 30 * time.Second}
	if tr != nil {
		hc.Transport = tr
	}
	return &VersityGWAccounts{admin: scheme + "://" + adminEndpoint, creds: creds, hc: hc, region: versityRegion}, nil
}

// versityError is an error answer of versitygw's admin API.
type versityError struct {
	// Status is the HTTP status code.
	Status int
	// Code is versitygw's error code, e.g. XAdminUserExists, XAdminAccessDenied.
	Code string `xml:"Code"`
	// Message is its description.
	Message string `xml:"Message"`
}

func (e *versityError) Error() string {
	return fmt.Sprintf("versitygw admin API: %s (%s, HTTP %d)", e.Message, e.Code, e.Status)
}

// versitygw's admin API codes that Sluice acts on.
const (
	codeVersityUserExists   = "XAdminUserExists"
	codeVersityUserNotFound = "XAdminUserNotFound"
)

// versityAuthCodes are the S3 error codes versitygw's admin API answers for a request
// whose keys or signature it refuses.
var versityAuthCodes = map[string]bool{"AccessDenied": true, "InvalidAccessKeyId": true, "SignatureDoesNotMatch": true,
	"RequestTimeTooSkewed": true, "XAmzContentSHA256Mismatch": true}

// versityAccount is an account as versitygw's admin API reads and lists it (XML).
type versityAccount struct {
	Access string `xml:"Access"`
	Secret string `xml:"Secret,omitempty"`
	Role   string `xml:"Role"`
}

// adminCall makes a SigV4-signed PATCH request of versitygw's admin API at path with
// query and body, and returns the answer's body; an error answer is a *versityError.
func (v *VersityGWAccounts) adminCall(ctx context.Context, path string, query url.Values, body []byte) ([]byte, error) {
	u := v.admin + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPatch, u, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(body)
	req.Header.Set("X-Amz-Content-Sha256", hex.EncodeToString(sum[:]))
	req = signer.SignV4(*req, v.creds.AccessKey, v.creds.SecretKey, "", v.region)
	resp, err := v.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("versitygw admin API %s: %w", v.admin, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("versitygw admin API %s: %w", v.admin, err)
	}
	if resp.StatusCode >= 300 {
		e := &versityError{Status: resp.StatusCode}
		if xml.Unmarshal(out, e) != nil || !strings.HasPrefix(e.Code, "XAdmin") && !versityAuthCodes[e.Code] {
			// No error of versitygw's admin API (its own XAdmin codes, or S3's for keys
			// it refuses): another server, or versitygw's S3 port (MethodNotAllowed).
			return nil, fmt.Errorf("%s%s answered HTTP %d %s: not versitygw's admin API (is the storage versitygw, and its admin endpoint, --admin-port, this one?)",
				v.admin, path, resp.StatusCode, e.Code)
		}
		return nil, e
	}
	return out, nil
}

func versityCode(err error) string {
	var e *versityError
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// putUser makes the account acc, or gives the existing one acc's secret key and role.
func (v *VersityGWAccounts) putUser(ctx context.Context, acc versityAccount) error {
	body, err := xml.Marshal(struct {
		XMLName xml.Name `xml:"Account"`
		versityAccount
	}{versityAccount: acc})
	if err != nil {
		return err
	}
	_, err = v.adminCall(ctx, "/create-user", nil, body)
	if versityCode(err) == codeVersityUserExists {
		props, merr := xml.Marshal(struct {
			XMLName xml.Name `xml:"MutableProps"`
			Secret  string   `xml:"Secret"`
			Role    string   `xml:"Role"`
		}{Secret: acc.Secret, Role: acc.Role})
		if merr != nil {
			return merr
		}
		_, err = v.adminCall(ctx, "/update-user", url.Values{"access": {acc.Access}}, props)
	}
	if err != nil {
		return fmt.Errorf("making versitygw account %s (role %s): %w", acc.Access, acc.Role, err)
	}
	return nil
}

// users lists the gateway's accounts' access keys.
func (v *VersityGWAccounts) users(ctx context.Context) (map[string]bool, error) {
	out, err := v.adminCall(ctx, "/list-users", nil, nil)
	if err != nil {
		return nil, fmt.Errorf("listing versitygw accounts: %w", err)
	}
	var res struct {
		Accounts []versityAccount `xml:"Accounts"`
	}
	if err := xml.Unmarshal(out, &res); err != nil {
		return nil, fmt.Errorf("listing versitygw accounts: %w", err)
	}
	users := make(map[string]bool, len(res.Accounts))
	for _, a := range res.Accounts {
		users[a.Access] = true
	}
	return users, nil
}

// Ensure makes a's account (role user, a's keys) if it is missing, or gives an existing
// one a's secret key and role user again (an operator's change is undone), then makes the
// policy of a's bucket grant it a.Prefix: the objects under it (read, write, delete,
// multipart uploads), listing beneath it, and the bucket's location; nothing else.
// a.Namespace and a.NamespacePrefix only bound a.Prefix: versitygw has no parent users.
// The errors are versitygw's, and one naming the field of a that is malformed.
func (v *VersityGWAccounts) Ensure(ctx context.Context, a Account) error {
	if a.Namespace == "" || !strings.HasPrefix(a.Prefix, a.NamespacePrefix) {
		return fmt.Errorf("object storage account %s: prefix %q is not under namespace %q's prefix %q", a.AccessKey, a.Prefix, a.Namespace, a.NamespacePrefix)
	}
	if a.Bucket != v.bucket {
		return fmt.Errorf("object storage account %s: bucket %q is not the bucket %q whose policy Sluice keeps", a.AccessKey, a.Bucket, v.bucket)
	}
	if _, err := PrefixPolicy(a.Bucket, a.Prefix); err != nil {
		return err
	}
	if err := v.putUser(ctx, versityAccount{Access: a.AccessKey, Secret: a.SecretKey, Role: "user"}); err != nil {
		return err
	}
	return v.grant(ctx, a.AccessKey, a.Prefix)
}

// Remove takes accessKey's statements out of the bucket's policy, then deletes the
// account; one that does not exist is not an error.
func (v *VersityGWAccounts) Remove(ctx context.Context, accessKey string) error {
	if err := v.grant(ctx, accessKey, ""); err != nil {
		return err
	}
	_, err := v.adminCall(ctx, "/delete-user", url.Values{"access": {accessKey}}, nil)
	if err != nil && versityCode(err) != codeVersityUserNotFound {
		return fmt.Errorf("deleting versitygw account %s: %w", accessKey, err)
	}
	return nil
}

// sidPrefix begins the Sid of every statement VersityGWAccounts writes in the bucket's
// policy; it owns those, and keeps every other statement as it is.
const sidPrefix = "sluice-"

// grant rewrites the bucket's policy so that accessKey's statements grant prefix (none
// when prefix is ""), keeping everyone else's. When versitygw refuses the policy for
// naming an unknown principal (an account of Sluice's deleted behind its back), it drops
// the statements of Sluice's accounts that no longer exist and writes it again; only then
// does it list the accounts.
func (v *VersityGWAccounts) grant(ctx context.Context, accessKey, prefix string) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	cur, err := v.s3.GetBucketPolicy(ctx, v.bucket)
	if err != nil {
		return fmt.Errorf("reading the policy of bucket %s: %w", v.bucket, err)
	}
	next, err := v.nextPolicy(cur, accessKey, prefix, nil)
	if err != nil {
		return err
	}
	if cur == "" && next == nil || cur != "" && jsonEqual([]byte(cur), next) {
		return nil // nothing to change
	}
	err = v.s3.SetBucketPolicy(ctx, v.bucket, string(next))
	if minio.ToErrorResponse(err).Code == "MalformedPolicy" {
		users, uerr := v.users(ctx)
		if uerr != nil {
			return uerr
		}
		if next, err = v.nextPolicy(cur, accessKey, prefix, users); err != nil {
			return err
		}
		err = v.s3.SetBucketPolicy(ctx, v.bucket, string(next))
	}
	if err != nil {
		if minio.ToErrorResponse(err).StatusCode >= 500 {
			// versitygw's posix backend keeps a bucket's policy in an extended attribute
			// of its directory unless told otherwise: on ext4 about 4 KiB, six workflows.
			return fmt.Errorf("writing the policy of bucket %s (%d bytes, about 650 a workflow) for account %s: %w "+
				"(run versitygw's posix backend with --sidecar DIR, which keeps metadata in files, not extended attributes)",
				v.bucket, len(next), accessKey, err)
		}
		return fmt.Errorf("writing the policy of bucket %s for account %s: %w", v.bucket, accessKey, err)
	}
	return nil
}

// nextPolicy is the policy cur with accessKey's statements granting prefix (none when
// prefix is ""), in a stable order (nil: no statement left); with users, also without the
// statements of Sluice's accounts not among them.
func (v *VersityGWAccounts) nextPolicy(cur, accessKey, prefix string, users map[string]bool) ([]byte, error) {
	var doc struct {
		Version   string            `json:"Version"`
		Statement []json.RawMessage `json:"Statement"`
	}
	if cur != "" {
		if err := json.Unmarshal([]byte(cur), &doc); err != nil {
			return nil, fmt.Errorf("reading the policy of bucket %s: %w", v.bucket, err)
		}
	}
	kept := doc.Statement[:0:0]
	for _, raw := range doc.Statement {
		var st struct {
			Sid       string `json:"Sid"`
			Principal struct {
				AWS []string `json:"AWS"`
			} `json:"Principal"`
		}
		if json.Unmarshal(raw, &st) == nil && strings.HasPrefix(st.Sid, sidPrefix) {
			if len(st.Principal.AWS) != 1 || st.Principal.AWS[0] == accessKey || users != nil && !users[st.Principal.AWS[0]] {
				continue
			}
		}
		kept = append(kept, raw)
	}
	if prefix != "" {
		sts, err := prefixStatements(v.bucket, prefix)
		if err != nil {
			return nil, err
		}
		for i, st := range sts {
			st.Sid = fmt.Sprintf("%s%s-%d", sidPrefix, accessKey, i)
			st.Principal = &principal{AWS: []string{accessKey}}
			b, err := json.Marshal(st)
			if err != nil {
				return nil, err
			}
			kept = append(kept, b)
		}
	}
	if len(kept) == 0 {
		return nil, nil
	}
	// Statements in a stable order, so that an unchanged grant writes nothing.
	sort.SliceStable(kept, func(i, j int) bool { return bytes.Compare(kept[i], kept[j]) < 0 })
	doc.Version, doc.Statement = "2012-10-17", kept
	return json.Marshal(doc)
}

// jsonEqual reports whether a and b are the same JSON value.
func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	xb, _ := json.Marshal(x)
	yb, _ := json.Marshal(y)
	return bytes.Equal(xb, yb)
}

// SetupVersityGWUser gives the installation its own versitygw account, run with
// versitygw's root keys (root: its keys, and the CA to trust) at the admin API at
// adminEndpoint (host:port): the account accessKey with secretKey and role admin, the
// only role that may make accounts. It is idempotent: an existing account gets secretKey
// and role admin again.
func SetupVersityGWUser(ctx context.Context, adminEndpoint string, secure bool, root Credentials, accessKey, secretKey string) error {
	if accessKey == root.AccessKey {
		return fmt.Errorf("the installation's object storage key %q is versitygw's root: give it its own", accessKey)
	}
	v, err := newVersityAdmin(adminEndpoint, secure, root)
	if err != nil {
		return err
	}
	return v.putUser(ctx, versityAccount{Access: accessKey, Secret: secretKey, Role: "admin"})
}
