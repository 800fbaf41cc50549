package natsauth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-io/sluice/internal/wfmeta"
)

// Accounts keeps the namespace accounts of an installation on its NATS server (full
// resolver, ServerConfig): it pushes each namespace's account JWT (NamespaceAccountJWT:
// quota and revocations) with a user of the system account the first time the namespace
// is used, whenever a user is revoked, and again for every namespace whenever its
// connection to the server is re-established (a restarted server on an emptyDir has
// lost them); and it holds the controller's connection of each namespace's account.
// Those connections are kept, one per namespace that had a workflow since the
// controller started: a namespace's next workflow reuses it.
//
// The revocations live in the account JWTs on the server, which is the record of them:
// every push first reads the server's JWT back and merges its revocations into the ones
// this controller made, then reads it again to check that they are all there, and
// pushes again if another controller's push replaced them meanwhile (two controllers
// overlap in a rolling update). A server that lost its resolver directory and a
// controller restarted since both forget them; the users they named expire anyway
// within the workflows' MaxAge (Credentials).
//
// Each namespace's pushes and connection are serialised by a lock of its own: one
// namespace whose push waits on the server holds up no other namespace.
type Accounts struct {
	keys   Keys
	quota  NamespaceQuota
	maxAge time.Duration
	url    string
	opts   []nats.Option // of every connection (TLS)
	log    logr.Logger
	sys    *nats.Conn

	mu sync.Mutex // guards ns only
	ns map[string]*namespaceState
}

// namespaceState is what Accounts keeps of one namespace; mu serialises its pushes and
// connection, and guards the other fields.
type namespaceState struct {
	mu      sync.Mutex
	revoked jwt.RevocationList // made by this controller or read back from the server
	pushed  bool               // once: the server's revocations were read back and ours pushed
	js      jetstream.JetStream
	nc      *nats.Conn
}

// ErrNoResolver is the error of a server that takes no account JWTs: its nats.conf
// predates namespace accounts (MEMORY resolver) and it has not been restarted since the
// controller rewrote it.
var ErrNoResolver = errors.New("the NATS server takes no account updates: its nats.conf predates namespace accounts; restart it to load the one the controller wrote")

// MaxRevocations bounds the revocations one namespace's account JWT carries: at about
// 70 bytes each, 4,096 make a JWT of under 400 KB, within nats-server's default
// max_payload (1 MB) that the push travels in. Revocations older than the users' max age
// are dropped first (those users expired); beyond the bound the oldest go, and their
// users, whose workflows are deleted with their streams and buckets, may connect again
// until they expire, reaching only subjects nothing serves.
const MaxRevocations = 4096

// pushTimeout bounds one account lookup or update.
const pushTimeout = 10 * time.Second

// pushAttempts bounds the pushes of one namespace's account that another controller's
// concurrent push may undo before a push gives up with an error.
const pushAttempts = 4

// NewAccounts connects to the NATS server at url as a system-account user of keys and
// returns the Accounts bounding each namespace by q, whose workflow users expire after
// maxAge (the workflows' stream MaxAge: revocations older than that are dropped from
// the account JWTs); opts are added to each of its connections (the server's CA, for
// TLS). The connection retries for ever; it is closed by Close. The errors are q's or
// maxAge's (invalid) and the connection's.
func NewAccounts(url string, keys Keys, q NamespaceQuota, maxAge time.Duration, log logr.Logger, opts ...nats.Option) (*Accounts, error) {
	if err := q.Validate(); err != nil {
		return nil, err
	}
	if maxAge <= 0 {
		return nil, fmt.Errorf("NATS workflow users: max age %s must be positive", maxAge)
	}
	a := &Accounts{keys: keys, quota: q, maxAge: maxAge, url: url, opts: opts, log: log, ns: map[string]*namespaceState{}}
	tok, seed, err := keys.SystemUser("sluice-controller-system")
	if err != nil {
		return nil, err
	}
	repush := func(*nats.Conn) { go a.pushAll() }
	a.sys, err = nats.Connect(url, append(a.connOptions(), nats.UserJWTAndSeed(tok, seed), nats.Name("sluice-controller-system"),
		nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1), nats.ReconnectWait(time.Second),
		nats.IgnoreAuthErrorAbort(), nats.ConnectHandler(repush), nats.ReconnectHandler(repush))...)
	if err != nil {
		return nil, fmt.Errorf("connecting to NATS at %s as the system account: %w", url, err)
	}
	return a, nil
}

// connOptions returns a copy of the options every connection gets.
func (a *Accounts) connOptions() []nats.Option { return append([]nats.Option(nil), a.opts...) }

// Close closes the system connection and every namespace's.
func (a *Accounts) Close() {
	for _, st := range a.namespaces() {
		st.mu.Lock()
		if st.nc != nil {
			st.nc.Close()
		}
		st.mu.Unlock()
	}
	a.sys.Close()
}

// Keys are the installation's keys the accounts derive from.
func (a *Accounts) Keys() Keys { return a.keys }

// namespace returns namespace ns's state, made empty the first time.
func (a *Accounts) namespace(ns string) *namespaceState {
	a.mu.Lock()
	defer a.mu.Unlock()
	st := a.ns[ns]
	if st == nil {
		st = &namespaceState{revoked: jwt.RevocationList{}}
		a.ns[ns] = st
	}
	return st
}

// namespaces returns the state of every namespace used so far.
func (a *Accounts) namespaces() map[string]*namespaceState {
	a.mu.Lock()
	defer a.mu.Unlock()
	all := make(map[string]*namespaceState, len(a.ns))
	for ns, st := range a.ns {
		all[ns] = st
	}
	return all
}

// JetStream returns a JetStream context of the controller's user of namespace ns's
// account, pushing the account first if this controller has not yet. The errors are the
// push's (ErrNoResolver: the server takes no accounts) and the connection's.
func (a *Accounts) JetStream(ctx context.Context, ns string) (jetstream.JetStream, error) {
	st := a.namespace(ns)
	st.mu.Lock()
	defer st.mu.Unlock()
	if err := a.ensurePushed(ctx, ns, st); err != nil {
		return nil, err
	}
	if st.nc != nil && !st.nc.IsClosed() {
		return st.js, nil
	}
	tok, seed, err := a.keys.NamespaceUser(ns, "sluice-controller")
	if err != nil {
		return nil, err
	}
	// Reconnects retry for ever, authorisation errors too: after a server restart the
	// account is unknown until pushAll has run.
	nc, err := nats.Connect(a.url, append(a.connOptions(), nats.UserJWTAndSeed(tok, seed), nats.Name("sluice-controller "+ns),
		nats.MaxReconnects(-1), nats.ReconnectWait(time.Second), nats.IgnoreAuthErrorAbort())...)
	if err != nil {
		return nil, fmt.Errorf("connecting to NATS at %s as namespace %s's controller: %w", a.url, ns, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("JetStream of namespace %s's NATS account: %w", ns, err)
	}
	st.nc, st.js = nc, js
	return js, nil
}

// Credentials returns a credentials file of workflow names' user (WorkflowCreds) named
// name, expiring after the workflows' max age, signed by its namespace's account,
// which is pushed first if this controller has not yet (the errors are the push's).
func (a *Accounts) Credentials(ctx context.Context, name string, names wfmeta.Names) ([]byte, error) {
	st := a.namespace(names.Namespace)
	st.mu.Lock()
	err := a.ensurePushed(ctx, names.Namespace, st)
	st.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return a.keys.WorkflowCreds(name, names, time.Now().Add(a.maxAge))
}

// Revoke revokes every credentials of workflow names issued until now and pushes its
// namespace's account: the server refuses the user's new connections and closes those
// it has. A push that fails keeps the revocation for the next one, and is an error
// (ErrNoResolver: the server takes no accounts).
func (a *Accounts) Revoke(ctx context.Context, names wfmeta.Names) error {
	user, err := a.keys.WorkflowUser(names)
	if err != nil {
		return err
	}
	st := a.namespace(names.Namespace)
	st.mu.Lock()
	defer st.mu.Unlock()
	st.revoked.Revoke(user, time.Now())
	if err := a.push(ctx, names.Namespace, st); err != nil {
		return err
	}
	st.pushed = true
	return nil
}

// ensurePushed pushes namespace ns's account unless this controller did since it last
// (re)connected. st.mu is held.
func (a *Accounts) ensurePushed(ctx context.Context, ns string, st *namespaceState) error {
	if st.pushed {
		return nil
	}
	if err := a.push(ctx, ns, st); err != nil {
		return err
	}
	st.pushed = true
	return nil
}

// lookup returns the revocations of the account JWT the server holds for ns (nil if it
// holds none, or one this installation's operator did not sign, which ours replaces).
func (a *Accounts) lookup(ctx context.Context, ns string) (jwt.RevocationList, error) {
	pub, err := a.keys.NamespaceAccount(ns)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, pushTimeout)
	defer cancel()
	msg, err := a.sys.RequestWithContext(ctx, "$SYS.REQ.ACCOUNT."+pub+".CLAIMS.LOOKUP", nil)
	if errors.Is(err, nats.ErrNoResponders) {
		return nil, fmt.Errorf("looking up the NATS account of namespace %s: %w", ns, ErrNoResolver)
	}
	if err != nil {
		return nil, fmt.Errorf("looking up the NATS account of namespace %s: %w", ns, err)
	}
	if len(msg.Data) == 0 {
		return nil, nil // unknown to the server
	}
	ac, err := jwt.DecodeAccountClaims(string(msg.Data))
	if err != nil {
		a.log.Error(err, "the NATS server's JWT of a namespace account does not decode; ours replaces it", "namespace", ns)
		return nil, nil
	}
	if ac.Subject != pub || ac.Issuer != a.keys.operatorPublic() {
		a.log.Info("the NATS server holds a namespace account JWT this installation did not sign; ours replaces it",
			"namespace", ns, "subject", ac.Subject, "issuer", ac.Issuer)
		return nil, nil
	}
	return ac.Revocations, nil
}

// claimUpdate is the server's answer to an account JWT update
// (server.ServerAPIClaimUpdateResponse).
type claimUpdate struct {
	Data *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"data"`
	Error *struct {
		Code        int    `json:"code"`
		Description string `json:"description"`
	} `json:"error"`
}

// push sends namespace ns's account JWT to the server with st's revocations merged with
// the server's, and checks that the server then holds all of them: another controller
// pushing at the same time may have replaced them, and then push merges and sends again,
// at most pushAttempts times. st.mu is held.
func (a *Accounts) push(ctx context.Context, ns string, st *namespaceState) error {
	for attempt := 1; ; attempt++ {
		theirs, err := a.lookup(ctx, ns)
		if err != nil {
			return err
		}
		merge(st.revoked, theirs)
		a.prune(ns, st.revoked)
		if err := a.update(ctx, ns, st.revoked); err != nil {
			return err
		}
		held, err := a.lookup(ctx, ns)
		if err != nil {
			return err
		}
		missing := 0
		for user, at := range st.revoked {
			if held[user] < at {
				missing++
			}
		}
		if missing == 0 {
			return nil
		}
		if attempt == pushAttempts {
			return fmt.Errorf("pushing the NATS account of namespace %s: %d revocations were replaced by another push %d times in a row", ns, missing, attempt)
		}
		a.log.V(1).Info("another push replaced a namespace account's revocations; merging and pushing again", "namespace", ns, "missing", missing)
	}
}

// merge adds to dst the revocations of src it lacks or has at an earlier time.
func merge(dst, src jwt.RevocationList) {
	for user, at := range src {
		if at > dst[user] {
			dst[user] = at
		}
	}
}

// prune drops from revoked the revocations older than the users' max age (their users
// have expired), then the oldest beyond MaxRevocations, which it logs.
func (a *Accounts) prune(ns string, revoked jwt.RevocationList) {
	cutoff := time.Now().Add(-a.maxAge).Unix()
	for user, at := range revoked {
		if at < cutoff {
			delete(revoked, user)
		}
	}
	over := len(revoked) - MaxRevocations
	if over <= 0 {
		return
	}
	users := make([]string, 0, len(revoked))
	for user := range revoked {
		users = append(users, user)
	}
	sort.Slice(users, func(i, j int) bool {
		if revoked[users[i]] != revoked[users[j]] {
			return revoked[users[i]] < revoked[users[j]]
		}
		return users[i] < users[j]
	})
	for _, user := range users[:over] {
		delete(revoked, user)
	}
	a.log.Info("a namespace's NATS account holds too many revocations: the oldest are dropped before their users expire",
		"namespace", ns, "dropped", over, "max", MaxRevocations)
}

// update sends namespace ns's account JWT with revoked to the server and checks its
// answer.
func (a *Accounts) update(ctx context.Context, ns string, revoked jwt.RevocationList) error {
	token, err := a.keys.NamespaceAccountJWT(ns, a.quota, revoked)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, pushTimeout)
	defer cancel()
	msg, err := a.sys.RequestWithContext(ctx, "$SYS.REQ.CLAIMS.UPDATE", []byte(token))
	if errors.Is(err, nats.ErrNoResponders) {
		return fmt.Errorf("pushing the NATS account of namespace %s: %w", ns, ErrNoResolver)
	}
	if err != nil {
		return fmt.Errorf("pushing the NATS account of namespace %s: %w", ns, err)
	}
	var resp claimUpdate
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return fmt.Errorf("pushing the NATS account of namespace %s: the server's answer %q: %w", ns, msg.Data, err)
	}
	if resp.Error != nil {
		return fmt.Errorf("pushing the NATS account of namespace %s: the server refused it (%d): %s", ns, resp.Error.Code, resp.Error.Description)
	}
	if resp.Data == nil || resp.Data.Code != 200 {
		return fmt.Errorf("pushing the NATS account of namespace %s: unexpected answer %q", ns, msg.Data)
	}
	return nil
}

// pushAll pushes every namespace's account pushed before: after the system connection
// (re)connects, to a server that may have lost them.
func (a *Accounts) pushAll() {
	for ns, st := range a.namespaces() {
		st.mu.Lock()
		if st.pushed {
			if err := a.push(context.Background(), ns, st); err != nil {
				// The namespace's next use (JetStream, Credentials, Revoke) tries again.
				st.pushed = false
				a.log.Error(err, "pushing a namespace's NATS account after reconnecting", "namespace", ns)
			} else {
				a.log.V(1).Info("NATS account pushed after reconnecting", "namespace", ns)
			}
		}
		st.mu.Unlock()
	}
}
