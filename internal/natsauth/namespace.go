package natsauth

import (
	"crypto/hmac"
	"crypto/sha256"
	"fmt"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/sluice-io/sluice/internal/wfmeta"
)

// NamespaceQuota bounds what one namespace's account may hold in JetStream: how many
// workflows of the namespace may be provisioned at once. Each workflow's stream and
// bucket carry their MaxBytes (wfmeta.Limits), and only the controller creates streams,
// so a namespace holds at most Workflows × (stream + bucket bytes) on the server's disk.
//
// The account's storage itself is left unbounded on purpose: a standalone nats-server
// refuses to enable an account's JetStream when the storage limits of all its accounts
// together exceed its own (75% of the disk free at its start), so a byte limit per
// namespace would leave the namespaces beyond that sum without JetStream at all. The
// server still refuses a stream whose MaxBytes no longer fits on its disk.
type NamespaceQuota struct {
	// Workflows is the most workflows of the namespace provisioned at once: the account
	// may have two streams for each (its stream and its KV bucket's).
	Workflows int64
	// Connections is the most client connections of the namespace's account at once:
	// a sidecar per pod, a store server per node and workflow, and the controller's.
	Connections int64
	// ConsumersPerStream is the most consumers of one stream of the account (0:
	// DefaultConsumersPerStream): its JWT's consumer limit, which nats-server applies to
	// each stream; the controller gives each workflow's streams fewer, from its pods
	// (wfmeta.StreamConsumers). The account holds at most 2 × Workflows × this.
	ConsumersPerStream int64
}

// DefaultConsumersPerStream bounds one stream of a namespace's account to 512 consumers:
// a workflow of 160 pods at once (wfmeta.StreamConsumers), a namespace to 7,168
// consumers at the default 7 workflows, about 250 MiB of the NATS server's memory (36 KiB
// a durable consumer, measured; docs/kubernetes.md, "NATS").
const DefaultConsumersPerStream = 512

// DefaultNamespaceQuota lets a namespace provision 7 workflows at once: at
// wfmeta.DefaultLimits (128 MiB + 16 MiB) 1 GiB, half of what the base's NATS server
// keeps on a node of a few GiB, so one namespace cannot take every slot; and hold 2,048
// connections (pods of its workflows running at once, with their nodes' store servers).
var DefaultNamespaceQuota = NamespaceQuota{Workflows: 7, Connections: 2048, ConsumersPerStream: DefaultConsumersPerStream}

// Validate reports whether q lets a namespace run a workflow; the error names the field.
func (q NamespaceQuota) Validate() error {
	if q.Workflows <= 0 {
		return fmt.Errorf("NATS namespace quota: workflows %d must be positive", q.Workflows)
	}
	if q.Connections <= 0 {
		return fmt.Errorf("NATS namespace quota: connections %d must be positive", q.Connections)
	}
	if q.ConsumersPerStream < 0 {
		return fmt.Errorf("NATS namespace quota: consumers per stream %d must not be negative", q.ConsumersPerStream)
	}
	return nil
}

// MaxAckPending bounds the unacknowledged messages of one consumer of a namespace's
// account: Sluice's consumers acknowledge nothing (ordered consumers, AckNone), so this
// only bounds what a consumer a tenant makes itself may keep the server tracking.
const MaxAckPending = 1024

// Consumers is the most consumers one stream of the namespace's account may have
// (ConsumersPerStream, or its default).
func (q NamespaceQuota) Consumers() int64 {
	if q.ConsumersPerStream > 0 {
		return q.ConsumersPerStream
	}
	return DefaultConsumersPerStream
}

// limits are q as an account JWT's JetStream limits: file storage only, every stream
// with a MaxBytes (the controller sets one on each, and a namespace account holds no
// stream made before quotas), two streams per workflow, Consumers per stream, and
// MaxAckPending per consumer.
func (q NamespaceQuota) limits() jwt.JetStreamLimits {
	return jwt.JetStreamLimits{MemoryStorage: 0, DiskStorage: -1, Streams: 2 * q.Workflows, Consumer: q.Consumers(),
		MaxAckPending: MaxAckPending, MaxBytesRequired: true}
}

// derive returns the key pair of kind prefix for purpose and name, derived from the
// installation account's seed (HMAC-SHA256): the same keys give the same pairs, so a
// restarted controller finds the accounts and users it made, and nothing new is stored.
func (kp keyPairs) derive(prefix nkeys.PrefixByte, purpose, name string) (nkeys.KeyPair, error) {
	seed, err := kp.acc.Seed()
	if err != nil {
		return nil, fmt.Errorf("NATS account seed: %w", err)
	}
	_, raw, err := nkeys.DecodeSeed(seed)
	if err != nil {
		return nil, fmt.Errorf("NATS account seed: %w", err)
	}
	mac := hmac.New(sha256.New, raw)
	mac.Write([]byte(purpose + "\x00" + name))
	pair, err := nkeys.FromRawSeed(prefix, mac.Sum(nil))
	if err != nil {
		return nil, fmt.Errorf("deriving the NATS %s key of %q: %w", purpose, name, err)
	}
	return pair, nil
}

func (kp keyPairs) namespace(ns string) (nkeys.KeyPair, error) {
	if ns == "" {
		return nil, fmt.Errorf("NATS namespace account: no namespace")
	}
	return kp.derive(nkeys.PrefixByteAccount, "namespace-account", ns)
}

// namespacePairs returns the installation's key pairs and namespace ns's account's.
func (k Keys) namespacePairs(ns string) (keyPairs, nkeys.KeyPair, error) {
	kp, err := k.pairs()
	if err != nil {
		return keyPairs{}, nil, err
	}
	acc, err := kp.namespace(ns)
	return kp, acc, err
}

// NamespaceAccount returns the public key of namespace ns's account.
func (k Keys) NamespaceAccount(ns string) (string, error) {
	_, acc, err := k.namespacePairs(ns)
	if err != nil {
		return "", err
	}
	return acc.PublicKey()
}

// NamespaceAccountJWT returns the JWT of namespace ns's account ("ns-<namespace>"),
// signed by the operator: its JetStream bounded by q, and the users of revoked (public
// key: unix time) refused when issued at or before their time.
func (k Keys) NamespaceAccountJWT(ns string, q NamespaceQuota, revoked jwt.RevocationList) (string, error) {
	if err := q.Validate(); err != nil {
		return "", err
	}
	kp, acc, err := k.namespacePairs(ns)
	if err != nil {
		return "", err
	}
	pub, _ := acc.PublicKey()
	ac := jwt.NewAccountClaims(pub)
	ac.Name = "ns-" + ns
	ac.Limits.JetStreamLimits = q.limits()
	ac.Limits.Conn = q.Connections
	for user, at := range revoked {
		ac.RevokeAt(user, time.Unix(at, 0))
	}
	token, err := ac.Encode(kp.op)
	if err != nil {
		return "", fmt.Errorf("signing the NATS account JWT of namespace %s: %w", ns, err)
	}
	return token, nil
}

// operatorPublic returns the public key of the installation's operator, which signs
// the namespace accounts ("" if the keys are not valid: no JWT is then taken for ours).
func (k Keys) operatorPublic() string {
	kp, err := k.pairs()
	if err != nil {
		return ""
	}
	pub, err := kp.op.PublicKey()
	if err != nil {
		return ""
	}
	return pub
}

// WorkflowUser returns the public key of the user of workflow names, which
// WorkflowCreds signs: derived from the workflow's stream name, so the controller can
// revoke it knowing the workflow only.
func (k Keys) WorkflowUser(names wfmeta.Names) (string, error) {
	kp, err := k.pairs()
	if err != nil {
		return "", err
	}
	user, err := kp.derive(nkeys.PrefixByteUser, "workflow-user", names.Stream)
	if err != nil {
		return "", err
	}
	return user.PublicKey()
}

// WorkflowCreds returns a NATS credentials file for the user of workflow names
// (WorkflowUser) named name, signed by its namespace's account, allowed
// WorkflowPermissions only and expiring at expires (zero: never).
func (k Keys) WorkflowCreds(name string, names wfmeta.Names, expires time.Time) ([]byte, error) {
	kp, acc, err := k.namespacePairs(names.Namespace)
	if err != nil {
		return nil, err
	}
	user, err := kp.derive(nkeys.PrefixByteUser, "workflow-user", names.Stream)
	if err != nil {
		return nil, err
	}
	return creds(acc, user, name, WorkflowPermissions(names), expires)
}

// NamespaceUser returns the JWT and seed of a new user of namespace ns's account with
// every right, for the controller's own connection (nats.UserJWTAndSeed). It never
// expires and never leaves the controller's memory.
func (k Keys) NamespaceUser(ns, name string) (token, seed string, err error) {
	_, acc, err := k.namespacePairs(ns)
	if err != nil {
		return "", "", err
	}
	return newUser(acc, name, nil, time.Time{})
}

// SystemUser returns the JWT and seed of a new user of the system account, which may
// push account JWTs to the server ($SYS.REQ.CLAIMS.UPDATE).
func (k Keys) SystemUser(name string) (token, seed string, err error) {
	kp, err := k.pairs()
	if err != nil {
		return "", "", err
	}
	return newUser(kp.sys, name, nil, time.Time{})
}

// newUser signs with account a new random user named name, limited to perms (nil: all)
// and expiring at expires (zero: never), and returns its JWT and seed.
func newUser(account nkeys.KeyPair, name string, perms *Permissions, expires time.Time) (token, seed string, err error) {
	user, err := nkeys.CreateUser()
	if err != nil {
		return "", "", fmt.Errorf("creating NATS user %s: %w", name, err)
	}
	token, err = signUser(account, user, name, perms, expires)
	if err != nil {
		return "", "", err
	}
	s, _ := user.Seed()
	return token, string(s), nil
}

// creds is the credentials file of user, signed by account (signUser).
func creds(account, user nkeys.KeyPair, name string, perms *Permissions, expires time.Time) ([]byte, error) {
	token, err := signUser(account, user, name, perms, expires)
	if err != nil {
		return nil, err
	}
	seed, _ := user.Seed()
	c, err := jwt.FormatUserConfig(token, seed)
	if err != nil {
		return nil, fmt.Errorf("formatting NATS credentials of %s: %w", name, err)
	}
	return c, nil
}

// signUser returns the JWT of user named name, signed by account, limited to perms (nil:
// every subject, no connection limits) and expiring at expires (zero: never).
func signUser(account, user nkeys.KeyPair, name string, perms *Permissions, expires time.Time) (string, error) {
	pub, _ := user.PublicKey()
	uc := jwt.NewUserClaims(pub)
	uc.Name = name
	if perms != nil {
		uc.Pub.Allow.Add(perms.Publish...)
		uc.Sub.Allow.Add(perms.Subscribe...)
		uc.Limits.Subs = MaxSubscriptions
		uc.Limits.Payload = MaxPayload
	}
	if !expires.IsZero() {
		uc.Expires = expires.Unix()
	}
	token, err := uc.Encode(account)
	if err != nil {
		return "", fmt.Errorf("signing NATS user %s: %w", name, err)
	}
	return token, nil
}

// RenewAt returns when the credentials file creds (Credentials, WorkflowCreds) should be
// replaced: halfway between when it was issued and when it expires, so that a client
// that re-reads its file on every (re)connection (nats.UserCredentials) holds the new
// one well before the old one expires. Zero: creds never expire. The error is the
// file's, unreadable as a user JWT.
func RenewAt(creds []byte) (time.Time, error) {
	token, err := jwt.ParseDecoratedJWT(creds)
	if err != nil {
		return time.Time{}, fmt.Errorf("NATS credentials: %w", err)
	}
	uc, err := jwt.DecodeUserClaims(token)
	if err != nil {
		return time.Time{}, fmt.Errorf("NATS credentials: %w", err)
	}
	if uc.Expires == 0 {
		return time.Time{}, nil
	}
	return time.Unix(uc.IssuedAt+(uc.Expires-uc.IssuedAt)/2, 0), nil
}
