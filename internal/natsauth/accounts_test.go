package natsauth

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/sluice-io/sluice/internal/testutil"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

// accountsOn returns Accounts on the server at url for keys, bounding each namespace by
// q, its users expiring after maxAge, closed when t ends.
func accountsOn(t *testing.T, url string, keys Keys, q NamespaceQuota, maxAge time.Duration) *Accounts {
	t.Helper()
	a, err := NewAccounts(url, keys, q, maxAge, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	return a
}

// provisionIn creates the stream and bucket of names in its namespace's account, as the
// controller does.
func provisionIn(ctx context.Context, a *Accounts, names wfmeta.Names) error {
	js, err := a.JetStream(ctx, names.Namespace)
	if err != nil {
		return err
	}
	if err := wfmeta.EnsureStream(ctx, js, names, testLimits); err != nil {
		return err
	}
	_, err = wfmeta.EnsureBucket(ctx, js, names, testLimits)
	return err
}

// eventually calls f until it returns nil or a minute passed.
func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	var last error
	if err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		last = f()
		return last == nil, nil
	}); err != nil {
		t.Fatalf("%s: %v", what, last)
	}
}

func testKeys(t *testing.T) Keys {
	t.Helper()
	keys, err := GenerateKeys()
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// Two namespaces are two accounts: a workflow user of namespace A reaches nothing of
// namespace B even where every name coincides (same stream, bucket and subjects): its
// messages land in A's stream only, its KV writes in A's bucket only, and its requests
// on the data plane reach no server of B's.
func TestNamespacesAreSeparateAccounts(t *testing.T) {
	keys := testKeys(t)
	url := startServer(t, keys, DefaultQuota)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := accountsOn(t, url, keys, DefaultNamespaceQuota, time.Hour)

	na := wfmeta.NamesForWorkflow("team-a", "wf", "0f1e2d3c-aaaa")
	nb := na
	nb.Namespace = "team-b" // every NATS name the same, another namespace
	for _, n := range []wfmeta.Names{na, nb} {
		if err := provisionIn(ctx, a, n); err != nil {
			t.Fatalf("provisioning %s in namespace %s: %v", n.Stream, n.Namespace, err)
		}
	}
	if pa, _ := keys.NamespaceAccount("team-a"); pa == "" {
		t.Fatal("no account for team-a")
	} else if pb, _ := keys.NamespaceAccount("team-b"); pb == pa {
		t.Fatal("two namespaces got the same account")
	}

	credsB, err := a.Credentials(ctx, "team-b/wf", nb)
	if err != nil {
		t.Fatal(err)
	}
	ncB, _, err := testutil.DialCreds(t, url, credsB, nb.Inbox)
	if err != nil {
		t.Fatalf("B's user connecting: %v", err)
	}
	served := make(chan struct{}, 1)
	if _, err := ncB.Subscribe(nb.Serve("node-1"), func(m *nats.Msg) {
		served <- struct{}{}
		_ = m.Respond([]byte("bytes of B"))
	}); err != nil {
		t.Fatal(err)
	}
	if err := ncB.Flush(); err != nil {
		t.Fatal(err)
	}

	credsA, err := a.Credentials(ctx, "team-a/wf", na)
	if err != nil {
		t.Fatal(err)
	}
	ncA, _, err := testutil.DialCreds(t, url, credsA, na.Inbox)
	if err != nil {
		t.Fatalf("A's user connecting: %v", err)
	}
	jsA := jsOf(t, ncA)
	if _, err := jsA.Publish(ctx, na.Events("p-0"), []byte("event of A")); err != nil {
		t.Fatalf("A publishing on its own subjects: %v", err)
	}
	kvA, err := jsA.KeyValue(ctx, na.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kvA.Put(ctx, wfmeta.FileKey("f"), []byte(`{"path":"f"}`)); err != nil {
		t.Fatalf("A writing its own bucket: %v", err)
	}
	short, cancelShort := context.WithTimeout(ctx, 2*time.Second)
	_, err = ncA.RequestWithContext(short, na.Serve("node-1"), nil)
	cancelShort()
	if err == nil {
		t.Error("A's request for bytes was answered by namespace B's server of the same subject")
	}
	select {
	case <-served:
		t.Error("namespace B's server received A's request")
	default:
	}

	jsB, err := a.JetStream(ctx, "team-b")
	if err != nil {
		t.Fatal(err)
	}
	s, err := jsB.Stream(ctx, nb.Stream)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := s.Info(ctx); err != nil || info.State.Msgs != 0 {
		t.Errorf("namespace B's stream of the same name holds %+v (%v) after A published, want no message", info.State, err)
	}
	kvB, err := jsB.KeyValue(ctx, nb.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kvB.Get(ctx, wfmeta.FileKey("f")); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("namespace B's bucket of the same name after A wrote its own: %v, want the key not found", err)
	}
	jsAdminA, err := a.JetStream(ctx, "team-a")
	if err != nil {
		t.Fatal(err)
	}
	if s, err := jsAdminA.Stream(ctx, na.Stream); err != nil {
		t.Fatal(err)
	} else if info, err := s.Info(ctx); err != nil || info.State.Msgs != 1 {
		t.Errorf("namespace A's stream holds %+v (%v), want A's one event", info.State, err)
	}
}

// One namespace filling its quota does not stop another's workflows: A's third
// workflow is refused (two at once), B's is provisioned.
func TestNamespaceQuotaLeavesOtherNamespaces(t *testing.T) {
	keys := testKeys(t)
	url := startServer(t, keys, DefaultQuota)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := accountsOn(t, url, keys, NamespaceQuota{Workflows: 2, Connections: 100}, time.Hour)

	for _, wf := range []string{"one", "two"} {
		if err := provisionIn(ctx, a, wfmeta.NamesForWorkflow("team-a", wf, wf+"-uid")); err != nil {
			t.Fatalf("namespace A's workflow %s within its quota: %v", wf, err)
		}
	}
	err := provisionIn(ctx, a, wfmeta.NamesForWorkflow("team-a", "three", "three-uid"))
	if err == nil {
		t.Fatal("namespace A's third workflow was provisioned beyond its quota of two")
	}
	if !strings.Contains(err.Error(), "maximum number of streams reached") {
		t.Errorf("namespace A's third workflow: %v, want the server's maximum number of streams reached", err)
	}
	if err := provisionIn(ctx, a, wfmeta.NamesForWorkflow("team-b", "one", "one-uid")); err != nil {
		t.Errorf("namespace B's first workflow while A is at its quota: %v", err)
	}
	// A stream without MaxBytes is refused in a namespace account.
	js, err := a.JetStream(ctx, "team-b")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "UNBOUNDED", Subjects: []string{"unbounded.>"}}); err == nil {
		t.Error("a stream without MaxBytes was created in a namespace account")
	}
}

// A workflow's credentials expire: the server refuses them once past their expiry, and
// closes a connection made before.
func TestWorkflowCredentialsExpire(t *testing.T) {
	keys := testKeys(t)
	url := startServer(t, keys, DefaultQuota)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := accountsOn(t, url, keys, DefaultNamespaceQuota, 2*time.Second)
	names := wfmeta.NamesForWorkflow("team-a", "wf", "0f1e2d3c-aaaa")
	if err := provisionIn(ctx, a, names); err != nil {
		t.Fatal(err)
	}
	creds, err := a.Credentials(ctx, "team-a/wf", names)
	if err != nil {
		t.Fatal(err)
	}
	_, closed, err := testutil.DialCreds(t, url, creds, names.Inbox)
	if err != nil {
		t.Fatalf("connecting with fresh credentials: %v", err)
	}
	select {
	case <-closed:
	case <-ctx.Done():
		t.Fatal("the connection of expired credentials stayed open")
	}
	// The server compares whole seconds: the connection closes at the expiry, and a new
	// one within that second still gets in.
	eventually(t, "connecting with expired credentials", func() error {
		nc, _, err := testutil.DialCreds(t, url, creds, names.Inbox)
		if err == nil {
			nc.Close()
			return errors.New("expired credentials connected")
		}
		if !strings.Contains(strings.ToLower(err.Error()), "expired") && !strings.Contains(strings.ToLower(err.Error()), "authorization") {
			t.Errorf("connecting with expired credentials: %v, want the server's refusal", err)
		}
		return nil
	})
}

// Revoking a workflow refuses its user's new connections and closes the open ones; the
// revocation survives a controller restart (read back from the server) and another
// workflow of the namespace is unaffected.
func TestRevokedWorkflowIsDisconnected(t *testing.T) {
	keys := testKeys(t)
	url := startServer(t, keys, DefaultQuota)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := accountsOn(t, url, keys, DefaultNamespaceQuota, time.Hour)
	gone := wfmeta.NamesForWorkflow("team-a", "gone", "0f1e2d3c-aaaa")
	stays := wfmeta.NamesForWorkflow("team-a", "stays", "99887766-bbbb")
	var creds [2][]byte
	for i, n := range []wfmeta.Names{gone, stays} {
		if err := provisionIn(ctx, a, n); err != nil {
			t.Fatal(err)
		}
		var err error
		if creds[i], err = a.Credentials(ctx, n.Stream, n); err != nil {
			t.Fatal(err)
		}
	}
	_, closed, err := testutil.DialCreds(t, url, creds[0], gone.Inbox)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Revoke(ctx, gone); err != nil {
		t.Fatalf("revoking: %v", err)
	}
	select {
	case <-closed:
	case <-ctx.Done():
		t.Fatal("the revoked workflow's open connection was not closed")
	}
	if _, _, err := testutil.DialCreds(t, url, creds[0], gone.Inbox); err == nil {
		t.Error("the revoked workflow's credentials connected")
	}
	ncStays, _, err := testutil.DialCreds(t, url, creds[1], stays.Inbox)
	if err != nil {
		t.Fatalf("another workflow of the namespace after the revocation: %v", err)
	}
	if _, err := jsOf(t, ncStays).Publish(ctx, stays.Events("p-0"), []byte("x")); err != nil {
		t.Errorf("another workflow of the namespace publishing after the revocation: %v", err)
	}

	// A restarted controller pushes the namespace again with the revocation it reads back.
	restarted := accountsOn(t, url, keys, DefaultNamespaceQuota, time.Hour)
	if _, err := restarted.JetStream(ctx, "team-a"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := testutil.DialCreds(t, url, creds[0], gone.Inbox); err == nil {
		t.Error("the revoked workflow's credentials connected after the controller restarted")
	}
}

// A server restarted with an empty resolver directory (an emptyDir lost with its pod,
// JetStream kept here) gets the namespace accounts again when the controller's system
// connection comes back: the controller provisions new workflows, and a running
// workflow's credentials reach its stream again.
func TestAccountsPushedAgainAfterServerRestart(t *testing.T) {
	keys := testKeys(t)
	dir := t.TempDir()
	jsDir := filepath.Join(dir, "js")
	srv := runServer(t, keys, DefaultQuota, filepath.Join(dir, "jwt-1"), jsDir, -1)
	url := srv.ClientURL()
	port := srv.Addr().(*net.TCPAddr).Port
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	a := accountsOn(t, url, keys, DefaultNamespaceQuota, time.Hour)
	running := wfmeta.NamesForWorkflow("team-a", "running", "0f1e2d3c-aaaa")
	if err := provisionIn(ctx, a, running); err != nil {
		t.Fatal(err)
	}
	creds, err := a.Credentials(ctx, "team-a/running", running)
	if err != nil {
		t.Fatal(err)
	}

	srv.Shutdown()
	srv.WaitForShutdown()
	runServer(t, keys, DefaultQuota, filepath.Join(dir, "jwt-2"), jsDir, port)

	next := wfmeta.NamesForWorkflow("team-a", "next", "99887766-bbbb")
	eventually(t, "provisioning a workflow after the server restarted", func() error { return provisionIn(ctx, a, next) })
	eventually(t, "the running workflow publishing after the server restarted", func() error {
		nc, _, err := testutil.DialCreds(t, url, creds, running.Inbox)
		if err != nil {
			return err
		}
		defer nc.Close()
		_, err = jsOf(t, nc).Publish(ctx, running.Events("p-0"), []byte("x"))
		return err
	})
}

// A server still running a nats.conf from before namespace accounts (MEMORY resolver:
// upgraded, not restarted) takes no account JWTs: Accounts says so with ErrNoResolver,
// which the controller takes to keep the installation's account meanwhile.
func TestAccountsOnAServerWithoutResolver(t *testing.T) {
	keys := testKeys(t)
	dir := t.TempDir()
	auth, err := keys.serverAuth(DefaultQuota, filepath.Join(dir, "jwt"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, _ := strings.Cut(auth, resolverLine)
	_, rest, _ = strings.Cut(rest, "}\n")
	head, _, _ := strings.Cut(auth, resolverLine)
	srv := testutil.NATSFromConfig(t, fmt.Sprintf("listen: 127.0.0.1:-1\njetstream: {store_dir: %q}\n%sresolver: MEMORY\n%s", filepath.Join(dir, "js"), head, rest))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := accountsOn(t, srv.ClientURL(), keys, DefaultNamespaceQuota, time.Hour)
	if _, err := a.JetStream(ctx, "team-a"); !errors.Is(err, ErrNoResolver) {
		t.Errorf("a namespace on a server with the MEMORY resolver: %v, want ErrNoResolver", err)
	}
}

// Two controllers at once (a rolling update) each revoke a workflow of one namespace
// after both pushed it: each push merges the server's revocations, so neither drops the
// other's, and both users stay refused.
func TestTwoControllersKeepEachOthersRevocations(t *testing.T) {
	keys := testKeys(t)
	url := startServer(t, keys, DefaultQuota)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	first := accountsOn(t, url, keys, DefaultNamespaceQuota, time.Hour)
	second := accountsOn(t, url, keys, DefaultNamespaceQuota, time.Hour)
	one := wfmeta.NamesForWorkflow("team-a", "one", "0f1e2d3c-aaaa")
	two := wfmeta.NamesForWorkflow("team-a", "two", "99887766-bbbb")
	var creds [2][]byte
	for i, n := range []wfmeta.Names{one, two} {
		if err := provisionIn(ctx, first, n); err != nil {
			t.Fatal(err)
		}
		var err error
		if creds[i], err = first.Credentials(ctx, n.Stream, n); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := second.JetStream(ctx, "team-a"); err != nil { // both have pushed the namespace
		t.Fatal(err)
	}
	if err := first.Revoke(ctx, one); err != nil {
		t.Fatal(err)
	}
	if err := second.Revoke(ctx, two); err != nil {
		t.Fatal(err)
	}
	for i, n := range []wfmeta.Names{one, two} {
		if _, _, err := testutil.DialCreds(t, url, creds[i], n.Inbox); err == nil {
			t.Errorf("workflow %s's revoked credentials connected", n.Stream)
		}
	}
}

// The revocations an account JWT carries are bounded: those older than the users' max
// age go first, then the oldest beyond MaxRevocations; a JWT of MaxRevocations of them
// travels within nats-server's default max_payload (1 MB).
func TestRevocationsAreBounded(t *testing.T) {
	keys := testKeys(t)
	a := &Accounts{keys: keys, quota: DefaultNamespaceQuota, maxAge: 24 * time.Hour, log: testr.New(t)}
	now := time.Now().Unix()
	revoked := jwt.RevocationList{}
	var newest, expired string
	for i := 0; i < MaxRevocations+10; i++ {
		u, err := nkeys.CreateUser()
		if err != nil {
			t.Fatal(err)
		}
		pub, _ := u.PublicKey()
		revoked[pub] = now - int64(MaxRevocations+10-i) // i = last: the newest
		newest = pub
	}
	u, _ := nkeys.CreateUser()
	expired, _ = u.PublicKey()
	revoked[expired] = now - 25*3600
	a.prune("team-a", revoked)
	if len(revoked) != MaxRevocations {
		t.Errorf("%d revocations kept, want %d", len(revoked), MaxRevocations)
	}
	if _, ok := revoked[newest]; !ok {
		t.Error("the newest revocation was dropped")
	}
	if _, ok := revoked[expired]; ok {
		t.Error("a revocation older than the max age was kept")
	}
	token, err := keys.NamespaceAccountJWT("team-a", DefaultNamespaceQuota, revoked)
	if err != nil {
		t.Fatal(err)
	}
	if len(token) >= 1<<20 {
		t.Errorf("an account JWT of %d revocations is %d bytes, beyond nats-server's default max_payload", MaxRevocations, len(token))
	}
}

// Credentials are due for renewal halfway through their lifetime; those that never
// expire never are.
func TestRenewAtIsHalfwayToExpiry(t *testing.T) {
	keys := testKeys(t)
	names := wfmeta.NamesForWorkflow("team-a", "wf", "0f1e2d3c-aaaa")
	before := time.Now().Unix()
	c, err := keys.WorkflowCreds("team-a/wf", names, time.Now().Add(10*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	at, err := RenewAt(c)
	if err != nil {
		t.Fatal(err)
	}
	if got := at.Unix() - before; got < 5*3600-1 || got > 5*3600+1 {
		t.Errorf("renewal due %d s after issue, want 5 h", got)
	}
	never, err := keys.Creds("legacy", WorkflowPermissions(names))
	if err != nil {
		t.Fatal(err)
	}
	if at, err := RenewAt(never); err != nil || !at.IsZero() {
		t.Errorf("credentials that never expire: renewal due %v (%v), want never", at, err)
	}
	if _, err := RenewAt([]byte("not a credentials file")); err == nil {
		t.Error("an unreadable file: no error")
	}
}

// A namespace's account holds at most its quota's connections at once: beyond it the
// server refuses the next, of any workflow of the namespace, and another namespace's
// connect as before.
func TestNamespaceConnectionsAreBounded(t *testing.T) {
	keys := testKeys(t)
	url := startServer(t, keys, DefaultQuota)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := accountsOn(t, url, keys, NamespaceQuota{Workflows: 2, Connections: 3}, time.Hour)
	names := wfmeta.NamesForWorkflow("team-a", "wf", "0f1e2d3c-aaaa")
	other := wfmeta.NamesForWorkflow("team-b", "wf", "99887766-bbbb")
	for _, n := range []wfmeta.Names{names, other} {
		if err := provisionIn(ctx, a, n); err != nil { // the controller's connection: one
			t.Fatal(err)
		}
	}
	c, err := a.Credentials(ctx, "team-a/wf", names)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if _, _, err := testutil.DialCreds(t, url, c, names.Inbox); err != nil {
			t.Fatalf("connection %d of 3: %v", i+2, err)
		}
	}
	if _, _, err := testutil.DialCreds(t, url, c, names.Inbox); err == nil {
		t.Error("a fourth connection of a namespace allowed three was accepted")
	}
	cb, err := a.Credentials(ctx, "team-b/wf", other)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := testutil.DialCreds(t, url, cb, other.Inbox); err != nil {
		t.Errorf("another namespace's workflow: %v", err)
	}
}
