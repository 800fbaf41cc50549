package controller

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/natsauth"
	"github.com/sluice-io/sluice/internal/podconfig"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/internal/testutil"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

// operatorNATS runs nats-server with the configuration the controller writes for keys
// (operator mode, full resolver in a directory of t's), shut down when t ends, and
// returns its URL.
func operatorNATS(t *testing.T, keys natsauth.Keys) string {
	t.Helper()
	dir := t.TempDir()
	auth, err := keys.ServerConfig(natsauth.DefaultQuota)
	if err != nil {
		t.Fatal(err)
	}
	auth = strings.ReplaceAll(auth, natsauth.ResolverDir, filepath.Join(dir, "jwt"))
	return testutil.NATSFromConfig(t, fmt.Sprintf("listen: 127.0.0.1:-1\njetstream: {store_dir: %q}\n%s", filepath.Join(dir, "js"), auth)).ClientURL()
}

// credsOf returns the NATS credentials in workflow name's configuration Secret of ns.
func credsOf(ctx context.Context, e *env, ns, name string) ([]byte, error) {
	var sec corev1.Secret
	if err := e.k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: podconfig.SecretName(name)}, &sec); err != nil {
		return nil, err
	}
	c := sec.Data[v1alpha1.SecretKeyNATSCreds]
	if len(c) == 0 {
		return nil, errors.New("no NATS credentials in the Secret")
	}
	return c, nil
}

// On a server in operator mode, as installed, each namespace's workflows get users of
// their namespace's NATS account: of two workflows of the same name in two namespaces,
// each one's credentials publish into its own stream only. The credentials are renewed halfway to their expiry, and revoked when the
// Workflow is deleted: the server closes the deleted workflow's connection and refuses
// it again, while the other namespace's workflow keeps publishing.
func TestWorkflowsGetUsersOfTheirNamespacesAccount(t *testing.T) {
	keys, err := natsauth.GenerateKeys()
	if err != nil {
		t.Fatal(err)
	}
	url := operatorNATS(t, keys)
	const maxAge = 20 * time.Second // the credentials' lifetime: renewed after 10 s
	accounts, err := natsauth.NewAccounts(url, keys, natsauth.DefaultNamespaceQuota, maxAge, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(accounts.Close)
	e := startEnv(t, func(r *WorkflowReconciler) {
		r.Streams = &JetStreams{Keys: keys, Accounts: accounts, Limits: wfmeta.Limits{StreamBytes: 8 << 20, BucketBytes: 1 << 20, MaxAge: time.Hour}}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	nsA, nsB := e.namespace(t, "nats-team-a"), e.namespace(t, "nats-team-b")
	spec := `
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: same}
spec:
  steps:
  - name: a
    outputs: [{path: out.txt}]
`
	wfA := workflowFrom(t, nsA, spec)
	for _, ns := range []string{nsA, nsB} {
		wf := wfA
		if ns == nsB {
			wf = workflowFrom(t, nsB, spec)
		}
		if err := e.k8s.Create(ctx, wf); err != nil {
			t.Fatal(err)
		}
	}
	var credsA, credsB []byte
	eventually(t, 30*time.Second, "both workflows' credentials", func() error {
		if credsA, err = credsOf(ctx, e, nsA, "same"); err != nil {
			return err
		}
		credsB, err = credsOf(ctx, e, nsB, "same")
		return err
	})
	namesA := wfmeta.NamesForWorkflow(nsA, "same", string(wfA.UID))
	var wfB v1alpha1.Workflow
	if err := e.k8s.Get(ctx, types.NamespacedName{Namespace: nsB, Name: "same"}, &wfB); err != nil {
		t.Fatal(err)
	}
	namesB := wfmeta.NamesForWorkflow(nsB, "same", string(wfB.UID))

	// Each workflow's credentials publish into its own namespace's stream.
	ncA, _, err := testutil.DialCreds(t, url, credsA, namesA.Inbox)
	if err != nil {
		t.Fatalf("workflow A's credentials: %v", err)
	}
	jsA, err := jetstream.New(ncA)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := jsA.Publish(ctx, namesA.Events("p-0"), []byte("from A")); err != nil {
		t.Fatalf("workflow A publishing to its stream: %v", err)
	}
	streamMsgs := func(ns string, names wfmeta.Names) uint64 {
		t.Helper()
		js, err := accounts.JetStream(ctx, ns)
		if err != nil {
			t.Fatal(err)
		}
		s, err := js.Stream(ctx, names.Stream)
		if err != nil {
			t.Fatalf("stream %s of namespace %s: %v", names.Stream, ns, err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs
	}
	if a, b := streamMsgs(nsA, namesA), streamMsgs(nsB, namesB); a != 1 || b != 0 {
		t.Errorf("after A's publish: %d messages in A's stream, %d in B's; want 1 and 0", a, b)
	}

	// Renewed halfway to their expiry.
	firstRenew, err := natsauth.RenewAt(credsA)
	if err != nil || firstRenew.IsZero() {
		t.Fatalf("workflow A's credentials expire at no time (%v)", err)
	}
	eventually(t, 30*time.Second, "workflow A's credentials renewed", func() error {
		c, err := credsOf(ctx, e, nsA, "same")
		if err != nil {
			return err
		}
		if bytes.Equal(c, credsA) {
			return errors.New("the Secret still holds the first credentials")
		}
		next, err := natsauth.RenewAt(c)
		if err != nil {
			return fmt.Errorf("renewed credentials: %w", err)
		}
		if !next.After(firstRenew) {
			return fmt.Errorf("renewed credentials due at %v, the first were due at %v", next, firstRenew)
		}
		credsA = c
		return nil
	})

	// Deleting A revokes its user: a connection with the renewed credentials (valid
	// for 20 s more) is closed at once, they are refused after, and B's still publish.
	_, closedA, err := testutil.DialCreds(t, url, credsA, namesA.Inbox)
	if err != nil {
		t.Fatalf("workflow A's renewed credentials: %v", err)
	}
	if err := e.k8s.Delete(ctx, wfA); err != nil {
		t.Fatal(err)
	}
	select {
	case <-closedA:
	case <-time.After(10 * time.Second):
		t.Fatal("the deleted workflow's connection was not closed within 10 s of its deletion")
	}
	eventually(t, 30*time.Second, "the deleted workflow's credentials refused", func() error {
		nc, _, err := testutil.DialCreds(t, url, credsA, namesA.Inbox)
		if err == nil {
			nc.Close()
			return errors.New("they connected")
		}
		return nil
	})
	ncB, _, err := testutil.DialCreds(t, url, credsB, namesB.Inbox)
	if err != nil {
		t.Fatalf("workflow B's credentials after A's deletion: %v", err)
	}
	jsB, err := jetstream.New(ncB)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := jsB.Publish(ctx, namesB.Events("p-0"), []byte("from B")); err != nil {
		t.Errorf("workflow B publishing after A's deletion: %v", err)
	}
}

// A tenant that holds every connection its namespace's account allows, with its
// workflow's credentials, cannot keep them past the workflow's deletion: a controller
// (restarted, so without a connection of that account) revokes the user through the
// system account before it needs one, the server closes the tenant's connections, and
// the stream goes.
func TestDeleteRevokesWhenTheTenantHoldsEveryConnection(t *testing.T) {
	testenv.Integration(t, "an embedded nats-server in operator mode")
	keys, err := natsauth.GenerateKeys()
	if err != nil {
		t.Fatal(err)
	}
	url := operatorNATS(t, keys)
	quota := natsauth.NamespaceQuota{Workflows: 2, Connections: 3}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	limits := wfmeta.Limits{StreamBytes: 8 << 20, BucketBytes: 1 << 20, MaxAge: time.Hour}
	first, err := natsauth.NewAccounts(url, keys, quota, time.Hour, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	names := wfmeta.NamesForWorkflow("greedy", "wf", "0f1e2d3c-aaaa")
	streams := &JetStreams{Keys: keys, Accounts: first, Limits: limits}
	if err := streams.Ensure(ctx, names, 1); err != nil {
		t.Fatal(err)
	}
	creds, err := streams.Credentials(ctx, "greedy/wf", names)
	if err != nil {
		t.Fatal(err)
	}
	first.Close() // the controller restarts: its connection of the account is gone
	var closed []<-chan struct{}
	for i := 0; i < 3; i++ {
		_, c, err := testutil.DialCreds(t, url, creds, names.Inbox)
		if err != nil {
			t.Fatalf("the tenant's connection %d of 3: %v", i+1, err)
		}
		closed = append(closed, c)
	}

	restarted, err := natsauth.NewAccounts(url, keys, quota, time.Hour, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(restarted.Close)
	streams = &JetStreams{Keys: keys, Accounts: restarted, Limits: limits}
	if err := streams.Delete(ctx, names); err == nil {
		t.Log("deleted at once: the server closed the revoked connections before the controller connected")
	} else {
		t.Logf("first delete: %v", err)
	}
	for i, c := range closed {
		select {
		case <-c:
		case <-time.After(10 * time.Second):
			t.Fatalf("the tenant's connection %d was not closed by the revocation", i+1)
		}
	}
	// Retried, as the reconciler does, it removes the stream.
	eventually(t, 30*time.Second, "deleting the workflow", func() error { return streams.Delete(ctx, names) })
	js, err := restarted.JetStream(ctx, "greedy")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Stream(ctx, names.Stream); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("the deleted workflow's stream: %v, want ErrStreamNotFound", err)
	}
}
