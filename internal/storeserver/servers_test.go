package storeserver

import (
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/podconfig"
	"github.com/sluice-io/sluice/internal/published"
)

// instanceFunc is an Instance whose Stop calls the function.
type instanceFunc func()

func (f instanceFunc) Stop() { f() }

// recorded returns workflow ns/name, its node directory and the options of a node
// whose API has it with its agent Secret, the plugin's record of its publication kept.
func recorded(t *testing.T, ns, name string) (*v1alpha1.Workflow, string, Options) {
	t.Helper()
	wf := &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name)}}
	if err := yaml.UnmarshalStrict([]byte(spec), &wf.Spec); err != nil {
		t.Fatal(err)
	}
	dir := joinedDir(t, wf)
	if err := published.Record(recordOf(dir), string(wf.UID)); err != nil {
		t.Fatal(err)
	}
	return wf, dir, options(t, "node-a", "nats://127.0.0.1:1", wf)
}

// A store server's start can be slow (a store of many files, a NATS server that does
// not answer; its workflow's tenant chooses both): it must hold up neither the other
// workflows' starts on the node nor Stop, which the plugin calls while it retires the
// workflow with every publish on the node waiting. Stop cancels the start and returns
// once nothing of it holds the workflow's directories: the start ended, and what it
// made was stopped.
func TestAStoreServerStartHoldsUpNothingElse(t *testing.T) {
	_, slowDir, opts := recorded(t, "tenant-a", "slow")
	fast, fastDir, _ := recorded(t, "tenant-b", "fast")
	slow := opts.Workflow
	opts.Workflow = func(ctx context.Context, ns, name string) (*v1alpha1.Workflow, error) {
		if name == fast.Name {
			return fast.DeepCopy(), nil
		}
		return slow(ctx, ns, name)
	}
	opts.Connection = func(context.Context, *v1alpha1.Workflow) (*podconfig.Connection, error) {
		return &podconfig.Connection{URL: "nats://127.0.0.1:1"}, nil
	}
	entered := make(chan struct{}, 1)
	var stopped atomic.Int32
	opts.Start = func(ctx context.Context, c Config) (Instance, error) {
		if c.Dir == slowDir {
			entered <- struct{}{}
			<-ctx.Done() // as Children.Start: a start ends when it is cancelled
			return nil, ctx.Err()
		}
		return instanceFunc(func() { stopped.Add(1) }), nil
	}
	servers := New(opts)
	ensured := make(chan error, 1)
	go func() { ensured <- servers.Ensure(context.Background(), slowDir) }()
	<-entered

	done := make(chan error, 1)
	go func() { done <- servers.Ensure(context.Background(), fastDir) }()
	select {
	case err := <-done:
		if err != nil || !servers.Serving(fastDir) {
			t.Fatalf("another workflow's start: %v, running %v", err, servers.Running())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("another workflow's start waited for the slow one")
	}
	stop := make(chan struct{})
	go func() { servers.Stop(slowDir); close(stop) }()
	select {
	case <-stop:
	case <-time.After(10 * time.Second):
		t.Fatal("Stop did not end the workflow's start")
	}
	if err := <-ensured; err != nil {
		t.Errorf("a start stopped by Stop: %v, want no error (nothing to report or retry)", err)
	}
	if got := servers.Running(); len(got) != 1 || got[0] != fastDir {
		t.Errorf("running %v, want only %s", got, fastDir)
	}

	// A start that made its server as Stop came: Stop returns once it is stopped. The
	// server's Stop holds until the test has looked whether Stop returned before it.
	release, stopping, letStop := make(chan struct{}), make(chan struct{}), make(chan struct{})
	opts.Start = func(ctx context.Context, c Config) (Instance, error) {
		entered <- struct{}{}
		<-release // ignores the cancel, then returns what it made
		return instanceFunc(func() { close(stopping); <-letStop; stopped.Add(1) }), nil
	}
	servers = New(opts)
	go func() { ensured <- servers.Ensure(context.Background(), slowDir) }()
	<-entered
	stop = make(chan struct{})
	go func() { servers.Stop(slowDir); close(stop) }()
	for !func() bool { servers.mu.Lock(); defer servers.mu.Unlock(); return servers.starting[slowDir].stopped }() {
		runtime.Gosched()
	}
	close(release)
	<-stopping
	select {
	case <-stop:
		t.Error("Stop returned while the server its cancelled start made was still stopping")
	default:
	}
	close(letStop)
	<-stop
	if n := stopped.Load(); n != 1 {
		t.Errorf("Stop returned with %d servers of the start stopped, want 1", n)
	}
	if err := <-ensured; err != nil || servers.Serving(slowDir) {
		t.Errorf("Ensure %v, serving %v, want the stopped start to leave nothing", err, servers.Serving(slowDir))
	}
}

// A workflow whose store server cannot start is not tried at every tick of the plugin's
// loop, but after a wait that doubles; a workflow made again under the same name (a new
// UID, so a new record) is tried at once.
func TestAFailedStoreServerStartWaitsBeforeTheNext(t *testing.T) {
	wf, dir, opts := recorded(t, "tenant-a", "wf")
	var starts atomic.Int32
	opts.Start = func(ctx context.Context, c Config) (Instance, error) {
		starts.Add(1)
		return nil, errors.New("NATS refused the credentials")
	}
	servers := New(opts)
	for i := 0; i < 5; i++ {
		_ = servers.Ensure(context.Background(), dir)
	}
	if n := starts.Load(); n != 1 {
		t.Errorf("5 calls in a row started %d times, want 1 (the others within %s of the failure)", n, firstRetry)
	}
	wf.UID = "uid-wf-again" // what the API has now
	if err := published.Record(recordOf(dir), string(wf.UID)); err != nil {
		t.Fatal(err)
	}
	if err := servers.Ensure(context.Background(), dir); err == nil || starts.Load() != 2 {
		t.Errorf("a new record: Ensure %v after %d starts, want a second start at once", err, starts.Load())
	}
}
