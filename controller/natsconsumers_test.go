package controller

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-io/sluice/internal/natsauth"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/internal/testutil"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

// controllerNATS runs nats-server with the whole configuration the controller writes
// into Secret sluice-nats for keys at quota q (natsauth.ServerBase, with its server-wide
// limits, and the operator, accounts and full resolver), its ports and directories moved
// into t's, and returns the server and its URL.
func controllerNATS(t *testing.T, keys natsauth.Keys, q natsauth.Quota) (*server.Server, string) {
	t.Helper()
	dir := t.TempDir()
	auth, err := keys.ServerConfig(q)
	if err != nil {
		t.Fatal(err)
	}
	auth = strings.ReplaceAll(auth, natsauth.ResolverDir, filepath.Join(dir, "jwt"))
	base := strings.NewReplacer("listen: 0.0.0.0:4222", "listen: 127.0.0.1:-1", "http: 127.0.0.1:8222\n", "",
		"store_dir: /data/jetstream", fmt.Sprintf("store_dir: %q", filepath.Join(dir, "js"))).Replace(natsauth.ServerBase)
	srv := testutil.NATSFromConfig(t, base+auth)
	return srv, srv.ClientURL()
}

// One workflow's credentials cannot exhaust the NATS server's consumers (issue 43: 2,000
// durable consumers made with them, none refused, +52 MiB of heap, +8,001 goroutines):
// each of the workflow's streams takes the consumers its pods need
// (wfmeta.StreamConsumers) and refuses the next with "maximum consumers limit reached",
// within the namespace account's per-stream limit; a consumer the tenant makes gets the
// stream's inactivity threshold, so the server removes it once unused, and one asking to
// outlive it is refused, while Sluice's own ordered consumers are taken. The server runs
// with the server-wide connection, subscription and pending limits the controller
// configures.
func TestAWorkflowsCredentialsCannotExhaustNATSConsumers(t *testing.T) {
	testenv.Integration(t, "an embedded nats-server in operator mode")
	keys, err := natsauth.GenerateKeys()
	if err != nil {
		t.Fatal(err)
	}
	srv, url := controllerNATS(t, keys, natsauth.DefaultQuota)
	quota := natsauth.DefaultNamespaceQuota
	accounts, err := natsauth.NewAccounts(url, keys, quota, time.Hour, testr.New(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(accounts.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	limits := wfmeta.Limits{StreamBytes: 8 << 20, BucketBytes: 1 << 20, MaxAge: time.Hour,
		MaxConsumers: int(quota.Consumers()), ConsumerInactive: wfmeta.ConsumerInactive}
	streams := &JetStreams{Keys: keys, Accounts: accounts, Limits: limits}
	names := wfmeta.NamesForWorkflow("hoarder", "wf", "0f1e2d3c-bbbb")
	const pods = 3
	if err := streams.Ensure(ctx, names, pods); err != nil {
		t.Fatal(err)
	}
	creds, err := streams.Credentials(ctx, "hoarder/wf", names)
	if err != nil {
		t.Fatal(err)
	}
	nc, _, err := testutil.DialCreds(t, url, creds, names.Inbox)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// What a sidecar makes first: an ordered consumer of the stream, with Sluice's
	// inactivity threshold.
	if _, err := js.OrderedConsumer(ctx, names.Stream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{names.All()}, HeadersOnly: true, InactiveThreshold: wfmeta.OrderedInactive}); err != nil {
		t.Fatalf("a sidecar's ordered consumer: %v", err)
	}
	want := wfmeta.StreamConsumers(pods)
	for _, stream := range []string{names.Stream, "KV_" + names.Bucket} {
		made, refused := 0, 0
		if stream == names.Stream {
			made = 1 // the ordered consumer above
		}
		for i := 0; i < 2000; i++ {
			_, err := js.CreateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: fmt.Sprintf("tenant-%d", i), AckPolicy: jetstream.AckExplicitPolicy})
			switch {
			case err == nil:
				made++
			case errors.Is(err, jetstream.ErrMaximumConsumersLimit):
				refused++
			default:
				t.Fatalf("consumer %d of %s: %v, want it made or refused for the limit", i, stream, err)
			}
		}
		if made != want || refused != 2000-(want-1) && stream == names.Stream || refused != 2000-want && stream != names.Stream {
			t.Errorf("%s: %d consumers made, %d refused of 2,000 creates; want %d made (a workflow of %d pods), the rest refused", stream, made, refused, want, pods)
		}
	}
	c, err := js.Consumer(ctx, "KV_"+names.Bucket, "tenant-0")
	if err != nil {
		t.Fatal(err)
	}
	if got := c.CachedInfo().Config.InactiveThreshold; got != wfmeta.ConsumerInactive {
		t.Errorf("a durable consumer the tenant made has inactivity threshold %s, want the stream's %s (removed once unused)", got, wfmeta.ConsumerInactive)
	}
	if err := js.DeleteConsumer(ctx, "KV_"+names.Bucket, "tenant-0"); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateConsumer(ctx, "KV_"+names.Bucket, jetstream.ConsumerConfig{Durable: "forever", InactiveThreshold: 24 * time.Hour}); err == nil {
		t.Error("a consumer asking to outlive the stream's inactivity threshold was made")
	}
	v, err := srv.Varz(nil)
	if err != nil {
		t.Fatal(err)
	}
	if v.MaxConn != natsauth.ServerMaxConnections || v.MaxSubs != natsauth.ServerMaxSubscriptions || v.MaxPending != natsauth.ServerMaxPending {
		t.Errorf("the server runs with max_connections %d, max_subscriptions %d, max_pending %d; want %d, %d, %d",
			v.MaxConn, v.MaxSubs, v.MaxPending, natsauth.ServerMaxConnections, natsauth.ServerMaxSubscriptions, natsauth.ServerMaxPending)
	}
}
