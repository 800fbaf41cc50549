package natsauth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
// The revocations live in the account JWTs on the server: a restarted controller reads
// them back (the account's lookup) before it pushes a namespace. A server that lost its
// resolver directory and a controller restarted since both forget them; the users they
// named expire anyway within the workflows' MaxAge (Credentials).
type Accounts struct {
	keys   Keys
	quota  NamespaceQuota
	maxAge time.Duration
	url    string
	log    logr.Logger
	sys    *nats.Conn

	mu sync.Mutex
	ns map[string]*namespaceState
}

type namespaceState struct {
	revoked jwt.RevocationList
	pushed  bool // once: the server's revocations were read back and ours pushed
	js      jetstream.JetStream
	nc      *nats.Conn
}

// ErrNoResolver is the error of a server that takes no account JWTs: its nats.conf
// predates namespace accounts (MEMORY resolver) and it has not been restarted since the
// controller rewrote it.
var ErrNoResolver = errors.New("the NATS server takes no account updates: its nats.conf predates namespace accounts; restart it to load the one the controller wrote")

// pushTimeout bounds one account lookup or update.
const pushTimeout = 10 * time.Second

// NewAccounts connects to the NATS server at url as a system-account user of keys and
// returns the Accounts bounding each namespace by q, whose workflow users expire after
// maxAge (the workflows' stream MaxAge: revocations older than that are dropped from
// the account JWTs). The connection retries for ever; it is closed by Close.
func NewAccounts(url string, keys Keys, q NamespaceQuota, maxAge time.Duration, log logr.Logger) (*Accounts, error) {
	if err := q.Validate(); err != nil {
		return nil, err
	}
	if maxAge <= 0 {
		return nil, fmt.Errorf("NATS workflow users: max age %s must be positive", maxAge)
	}
	a := &Accounts{keys: keys, quota: q, maxAge: maxAge, url: url, log: log, ns: map[string]*namespaceState{}}
	tok, seed, err := keys.SystemUser("sluice-controller-system")
	if err != nil {
		return nil, err
	}
	repush := func(*nats.Conn) { go a.pushAll() }
	a.sys, err = nats.Connect(url, nats.UserJWTAndSeed(tok, seed), nats.Name("sluice-controller-system"),
		nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1), nats.ReconnectWait(time.Second),
		nats.IgnoreAuthErrorAbort(), nats.ConnectHandler(repush), nats.ReconnectHandler(repush))
	if err != nil {
		return nil, fmt.Errorf("connecting to NATS at %s as the system account: %w", url, err)
	}
	return a, nil
}

// Close closes the system connection and every namespace's.
func (a *Accounts) Close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, st := range a.ns {
		if st.nc != nil {
			st.nc.Close()
		}
	}
	a.sys.Close()
}

// Keys are the installation's keys the accounts derive from.
func (a *Accounts) Keys() Keys { return a.keys }

// JetStream returns a JetStream context of the controller's user of namespace ns's
// account, pushing the account first if this controller has not yet.
func (a *Accounts) JetStream(ctx context.Context, ns string) (jetstream.JetStream, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	st, err := a.state(ctx, ns)
	if err != nil {
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
	nc, err := nats.Connect(a.url, nats.UserJWTAndSeed(tok, seed), nats.Name("sluice-controller "+ns),
		nats.MaxReconnects(-1), nats.ReconnectWait(time.Second), nats.IgnoreAuthErrorAbort())
	if err != nil {
		return nil, fmt.Errorf("connecting to NATS at %s as namespace %s's controller: %w", a.url, ns, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	st.nc, st.js = nc, js
	return js, nil
}

// Credentials returns a credentials file of workflow names' user (WorkflowCreds) named
// name, expiring after the workflows' max age, signed by its namespace's account,
// which is pushed first if this controller has not yet.
func (a *Accounts) Credentials(ctx context.Context, name string, names wfmeta.Names) ([]byte, error) {
	a.mu.Lock()
	_, err := a.state(ctx, names.Namespace)
	a.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return a.keys.WorkflowCreds(name, names, time.Now().Add(a.maxAge))
}

// Revoke revokes every credentials of workflow names issued until now and pushes its
// namespace's account: the server refuses the user's new connections and closes those
// it has. A push that fails keeps the revocation for the next one, and is an error.
func (a *Accounts) Revoke(ctx context.Context, names wfmeta.Names) error {
	user, err := a.keys.WorkflowUser(names)
	if err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	st := a.ns[names.Namespace]
	if st == nil || !st.pushed {
		// Read the server's revocations back before ours replace them.
		if st, err = a.state(ctx, names.Namespace); err != nil {
			return err
		}
	}
	st.revoked.Revoke(user, time.Now())
	return a.push(ctx, names.Namespace, st)
}

// state returns namespace ns's state, reading its revocations back from the server and
// pushing its account the first time. a.mu is held.
func (a *Accounts) state(ctx context.Context, ns string) (*namespaceState, error) {
	st := a.ns[ns]
	if st == nil {
		st = &namespaceState{revoked: jwt.RevocationList{}}
		a.ns[ns] = st
	}
	if st.pushed {
		return st, nil
	}
	if err := a.lookup(ctx, ns, st); err != nil {
		return nil, err
	}
	if err := a.push(ctx, ns, st); err != nil {
		return nil, err
	}
	st.pushed = true
	return st, nil
}

// lookup adds to st the revocations of the account JWT the server holds for ns, if it
// holds one this installation's operator signed.
func (a *Accounts) lookup(ctx context.Context, ns string, st *namespaceState) error {
	pub, err := a.keys.NamespaceAccount(ns)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, pushTimeout)
	defer cancel()
	msg, err := a.sys.RequestWithContext(ctx, "$SYS.REQ.ACCOUNT."+pub+".CLAIMS.LOOKUP", nil)
	if errors.Is(err, nats.ErrNoResponders) {
		return fmt.Errorf("looking up the NATS account of namespace %s: %w", ns, ErrNoResolver)
	}
	if err != nil {
		return fmt.Errorf("looking up the NATS account of namespace %s: %w", ns, err)
	}
	if len(msg.Data) == 0 {
		return nil // unknown to the server
	}
	ac, err := jwt.DecodeAccountClaims(string(msg.Data))
	if err != nil || ac.Subject != pub {
		return nil // not one of ours: ours replaces it
	}
	for user, at := range ac.Revocations {
		if prev, ok := st.revoked[user]; !ok || at > prev {
			st.revoked[user] = at
		}
	}
	return nil
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

// push drops st's revocations older than the users' max age (those users expired) and
// sends namespace ns's account JWT to the server, checking its answer. a.mu is held.
func (a *Accounts) push(ctx context.Context, ns string, st *namespaceState) error {
	cutoff := time.Now().Add(-a.maxAge).Unix()
	for user, at := range st.revoked {
		if at < cutoff {
			delete(st.revoked, user)
		}
	}
	token, err := a.keys.NamespaceAccountJWT(ns, a.quota, st.revoked)
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
	a.mu.Lock()
	defer a.mu.Unlock()
	for ns, st := range a.ns {
		if !st.pushed {
			continue
		}
		if err := a.push(context.Background(), ns, st); err != nil {
			// The namespace's next use (JetStream, Credentials, Revoke) tries again.
			st.pushed = false
			a.log.Error(err, "pushing a namespace's NATS account after reconnecting", "namespace", ns)
			continue
		}
		a.log.V(1).Info("NATS account pushed after reconnecting", "namespace", ns)
	}
}
