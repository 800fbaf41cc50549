// Package natsauth issues the NATS identities of a Sluice installation in NATS's
// decentralised (operator) mode: one operator, a system account, the installation's
// account (which holds the workflows made before namespace accounts), and one account
// per namespace, derived from the installation's keys, which holds that namespace's
// workflows. The controller keeps the three seeds in a Secret and writes the server's
// configuration from them (operator JWT, system account, full resolver with the
// system and installation accounts preloaded); it pushes each namespace's account
// (Accounts), with its quota and the revoked users, through the system account. Each
// workflow gets a user of its namespace's account whose permissions are that
// workflow's subjects, stream, KV bucket and inbox only, which expires and which the
// controller revokes when the workflow goes: a pod of workflow A holds credentials that
// cannot publish to, subscribe to, or read the stream of workflow B, and that reach
// nothing of another namespace's.
package natsauth

import (
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"

	"github.com/sluice-io/sluice/internal/wfmeta"
)

// Keys are the seeds of the installation's NATS operator, system account and workflow
// account (nkeys seed strings, "SO…", "SA…", "SA…"). They are secrets: every
// namespace account and workflow user is derived from Account (namespace.go).
type Keys struct {
	// Operator signs the accounts.
	Operator string `json:"operator"`
	// System is the system account (server monitoring and events).
	System string `json:"system"`
	// Account is the installation's workflow account, which holds the workflows made
	// before namespace accounts; its seed is also what the namespace accounts' and the
	// workflow users' keys are derived from.
	Account string `json:"account"`
}

// GenerateKeys returns fresh random keys.
func GenerateKeys() (Keys, error) {
	op, err := nkeys.CreateOperator()
	if err != nil {
		return Keys{}, fmt.Errorf("creating the NATS operator key: %w", err)
	}
	sys, err := nkeys.CreateAccount()
	if err != nil {
		return Keys{}, fmt.Errorf("creating the NATS system account key: %w", err)
	}
	acc, err := nkeys.CreateAccount()
	if err != nil {
		return Keys{}, fmt.Errorf("creating the NATS account key: %w", err)
	}
	var k Keys
	for _, p := range []struct {
		kp  nkeys.KeyPair
		dst *string
	}{{op, &k.Operator}, {sys, &k.System}, {acc, &k.Account}} {
		seed, err := p.kp.Seed()
		if err != nil {
			return Keys{}, fmt.Errorf("encoding a NATS seed: %w", err)
		}
		*p.dst = string(seed)
	}
	return k, nil
}

type keyPairs struct{ op, sys, acc nkeys.KeyPair }

func (k Keys) pairs() (keyPairs, error) {
	var kp keyPairs
	for _, p := range []struct {
		name, seed string
		prefix     nkeys.PrefixByte
		dst        *nkeys.KeyPair
	}{
		{"operator", k.Operator, nkeys.PrefixByteOperator, &kp.op},
		{"system", k.System, nkeys.PrefixByteAccount, &kp.sys},
		{"account", k.Account, nkeys.PrefixByteAccount, &kp.acc},
	} {
		pair, err := nkeys.FromSeed([]byte(p.seed))
		if err != nil {
			return keyPairs{}, fmt.Errorf("NATS %s seed: %w", p.name, err)
		}
		pub, err := pair.PublicKey()
		if err != nil {
			return keyPairs{}, fmt.Errorf("NATS %s seed: %w", p.name, err)
		}
		if !nkeys.IsValidPublicKey(pub) || nkeys.Prefix(pub) != p.prefix {
			return keyPairs{}, fmt.Errorf("NATS %s seed: not an %s key", p.name, p.name)
		}
		*p.dst = pair
	}
	return kp, nil
}

// Validate reports whether every seed is present and of the right kind; the error names
// the bad one.
func (k Keys) Validate() error {
	_, err := k.pairs()
	return err
}

// Quota bounds what the installation's workflow account may hold in JetStream: the
// workflows made before namespace accounts (NamespaceQuota bounds each namespace's),
// and every workflow while the server takes no account JWTs (ErrNoResolver). The server
// reserves each stream's MaxBytes from Storage when the stream is created
// (wfmeta.Limits), so Storage over a workflow's stream and bucket quota is how many of
// those workflows may run at once; the next one's stream is refused until one is
// removed.
type Quota struct {
	// Storage is the most bytes of file storage (streams and KV buckets) the account may
	// hold. It must fit on the NATS server's volume: nats-server leaves the account
	// without JetStream when Storage exceeds 75% of the space free there at its start.
	Storage int64
	// Streams is the most streams the account may have (two per workflow: its stream and
	// its KV bucket's).
	Streams int64
}

// DefaultQuota is the controller's default quota of the installation's account: 2 GiB of
// file storage, room for 14 workflows at wfmeta.DefaultLimits, and 256 streams (128
// workflows). nats-server
// enables an account's JetStream only if its storage fits in 75% of the space free on
// the server's volume when it starts: 2 GiB needs 2.7 GiB free, which a node of a few
// GiB has for the base's emptyDir. Raise it with the NATS volume.
var DefaultQuota = Quota{Storage: 2 << 30, Streams: 256}

// Validate reports whether q bounds the account: positive storage and streams.
func (q Quota) Validate() error {
	if q.Storage <= 0 || q.Streams <= 0 {
		return fmt.Errorf("NATS account quota: storage %d and streams %d must be positive", q.Storage, q.Streams)
	}
	return nil
}

// limits are q as the account JWT's JetStream limits. Memory storage is not allowed
// (every stream and bucket of a workflow is on file storage, wfmeta.EnsureStream). A
// stream's MaxBytes is not required (max_bytes_required): the server would then refuse
// to load, at its restart, the streams an installation made before quotas; the
// controller sets it on every stream, and the account's storage bounds any stream's
// messages anyway.
func (q Quota) limits() jwt.JetStreamLimits {
	return jwt.JetStreamLimits{MemoryStorage: 0, DiskStorage: q.Storage, Streams: q.Streams, Consumer: -1, MaxAckPending: -1}
}

// ResolverDir is where the NATS server keeps the account JWTs the controller pushes
// (the full resolver's directory): on its data volume, next to its JetStream store.
const ResolverDir = "/data/jwt"

// ServerConfig returns the authorisation part of nats-server's configuration file: the
// operator JWT, the system account, and the full resolver (account JWTs in ResolverDir,
// updated by the controller through the system account: one account per namespace,
// NamespaceAccountJWT) preloaded with the system account and the installation's
// workflow account, whose JetStream is bounded by q (Quota). The caller adds listen,
// jetstream and the rest.
func (k Keys) ServerConfig(q Quota) (string, error) {
	return k.serverAuth(q, ResolverDir)
}

// resolverLine is how a configuration ServerConfig writes names its resolver.
const resolverLine = "resolver: {type: full, dir: "

// serverAuth is ServerConfig with the resolver's directory dir.
func (k Keys) serverAuth(q Quota, dir string) (string, error) {
	if err := q.Validate(); err != nil {
		return "", err
	}
	kp, err := k.pairs()
	if err != nil {
		return "", err
	}
	opPub, _ := kp.op.PublicKey()
	sysPub, _ := kp.sys.PublicKey()
	accPub, _ := kp.acc.PublicKey()

	oc := jwt.NewOperatorClaims(opPub)
	oc.Name = "sluice"
	oc.SystemAccount = sysPub
	opJWT, err := oc.Encode(kp.op)
	if err != nil {
		return "", fmt.Errorf("signing the NATS operator JWT: %w", err)
	}
	sc := jwt.NewAccountClaims(sysPub)
	sc.Name = "SYS"
	sysJWT, err := sc.Encode(kp.op)
	if err != nil {
		return "", fmt.Errorf("signing the NATS system account JWT: %w", err)
	}
	ac := jwt.NewAccountClaims(accPub)
	ac.Name = "sluice"
	ac.Limits.JetStreamLimits = q.limits()
	accJWT, err := ac.Encode(kp.op)
	if err != nil {
		return "", fmt.Errorf("signing the NATS account JWT: %w", err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "operator: %q\n", opJWT)
	fmt.Fprintf(&b, "system_account: %q\n", sysPub)
	// allow_delete stays off: the controller never deletes an account, and a deleted
	// namespace's account holds nothing once its workflows are removed.
	fmt.Fprintf(&b, "%s%q}\n", resolverLine, dir)
	b.WriteString("resolver_preload: {\n")
	fmt.Fprintf(&b, "  %s: %q\n", sysPub, sysJWT)
	fmt.Fprintf(&b, "  %s: %q\n", accPub, accJWT)
	b.WriteString("}\n")
	return b.String(), nil
}

// ConfiguredQuota returns the workflow account's JetStream limits in conf, a
// configuration ServerConfig wrote with these keys, and whether conf has them as Quota
// does and the full resolver (false: conf predates quotas or namespace accounts, or its
// account is not this one).
func (k Keys) ConfiguredQuota(conf string) (Quota, bool) {
	if !strings.Contains(conf, resolverLine) {
		return Quota{}, false
	}
	kp, err := k.pairs()
	if err != nil {
		return Quota{}, false
	}
	accPub, _ := kp.acc.PublicKey()
	_, rest, ok := strings.Cut(conf, accPub+": \"")
	if !ok {
		return Quota{}, false
	}
	token, _, ok := strings.Cut(rest, "\"")
	if !ok {
		return Quota{}, false
	}
	ac, err := jwt.DecodeAccountClaims(token)
	if err != nil || ac.Subject != accPub {
		return Quota{}, false
	}
	l := ac.Limits.JetStreamLimits
	q := Quota{Storage: l.DiskStorage, Streams: l.Streams}
	return q, l == q.limits()
}

// Permissions are the subjects a user may publish to and subscribe to; nil means all.
type Permissions struct {
	// Publish are the subjects (wildcards allowed) the user may publish to.
	Publish []string
	// Subscribe are the subjects the user may subscribe to.
	Subscribe []string
}

// Creds returns a NATS credentials file (user JWT and seed) for a new user of the workflow
// account named name, limited to perms (nil: every subject, for the controller).
func (k Keys) Creds(name string, perms *Permissions) ([]byte, error) {
	token, seed, err := k.User(name, perms)
	if err != nil {
		return nil, err
	}
	creds, err := jwt.FormatUserConfig(token, []byte(seed))
	if err != nil {
		return nil, fmt.Errorf("formatting NATS credentials of %s: %w", name, err)
	}
	return creds, nil
}

// User returns the JWT and seed of a new user of the workflow account (as Creds), for
// nats.UserJWTAndSeed.
func (k Keys) User(name string, perms *Permissions) (token, seed string, err error) {
	kp, err := k.pairs()
	if err != nil {
		return "", "", err
	}
	return newUser(kp.acc, name, perms, time.Time{})
}

// SidecarKeyPrefixes are the first segments of the KV keys a workflow's sidecars write
// (wfmeta.FileKey, the adopt claims, terminations, wfmeta.StatsKey,
// wfmeta.ReadsKey, wfmeta.WithdrawalKey). The controller's keys (outcome.<pod
// UID>, wfmeta.OutcomeKey; lost.<hex path>, wfmeta.LostKey) are not among them: a pod
// cannot forge another pod's outcome, nor its own, nor the loss of a file.
var SidecarKeyPrefixes = []string{"file", "adopt", "term", "stats", "reads", "withdrawn"}

// Limits of a workflow user's connections (jwt.NatsLimits): enough for the sidecars and
// store servers of one pod, bounded so that one connection cannot exhaust the server.
const (
	// MaxSubscriptions a workflow user's connection may hold.
	MaxSubscriptions = 4096
	// MaxPayload of a workflow user's message: a data chunk (wfmeta.MaxChunk) and
	// headers.
	MaxPayload = wfmeta.MaxChunk + 64<<10
)

// WorkflowPermissions are what one workflow's sidecars need and nothing more: publish
// on the workflow's subjects and the KV keys sidecars write (SidecarKeyPrefixes); the JetStream API calls that look up, read
// and follow (ordered consumers) the workflow's stream and KV bucket, with their acks and
// flow control; requests and replies of the data plane (wfmeta.Names.Fetch) and replies
// on the workflow's inbox prefix only. They cannot create, change or delete a stream, nor
// name another workflow's.
func WorkflowPermissions(names wfmeta.Names) *Permissions {
	var pub []string
	pub = append(pub, names.All(), names.Fetch+".>", names.Inbox+".>", "$JS.API.INFO")
	// KV writes: only the keys the sidecars write; outcome.* is the controller's.
	for _, prefix := range SidecarKeyPrefixes {
		pub = append(pub, "$KV."+names.Bucket+"."+prefix+".>")
	}
	for _, stream := range []string{names.Stream, "KV_" + names.Bucket} {
		pub = append(pub,
			"$JS.API.STREAM.INFO."+stream,
			"$JS.API.STREAM.MSG.GET."+stream,
			"$JS.API.DIRECT.GET."+stream,
			"$JS.API.DIRECT.GET."+stream+".>",
			"$JS.API.CONSUMER.CREATE."+stream,
			"$JS.API.CONSUMER.CREATE."+stream+".>",
			"$JS.API.CONSUMER.INFO."+stream+".*",
			"$JS.API.CONSUMER.DELETE."+stream+".*",
			"$JS.API.CONSUMER.MSG.NEXT."+stream+".*",
			"$JS.ACK."+stream+".>",
			"$JS.FC."+stream+".>",
		)
	}
	return &Permissions{Publish: pub, Subscribe: []string{names.Inbox + ".>", names.Fetch + ".>"}}
}
