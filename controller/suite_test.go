package controller

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"github.com/nats-io/nats.go/jetstream"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/controller/inject"
	"github.com/sluice-io/sluice/controller/podwebhook"
	"github.com/sluice-io/sluice/internal/natsauth"
	"github.com/sluice-io/sluice/internal/testenv"
	"github.com/sluice-io/sluice/internal/testutil"
)

// env is a test's view of a real kube-apiserver and etcd (envtest, the binaries
// hack/cluster/build.sh builds; the package's one, or one of the test's own), an
// embedded JetStream server, and the controller and webhook running in a manager of the
// test's own against them.
type env struct {
	k8s     client.Client
	js      jetstream.JetStream
	streams *JetStreams
	cfg     *envtest.Environment
}

// assets finds the kube-apiserver and etcd binaries: $KUBEBUILDER_ASSETS, else the
// cluster build cache. `make test` builds them first.
func assets(t *testing.T) string {
	testenv.Integration(t, "kube-apiserver, etcd and kubectl (hack/cluster/build.sh envtest)")
	if d := os.Getenv("KUBEBUILDER_ASSETS"); d != "" {
		return d
	}
	cache := os.Getenv("SLUICE_CACHE")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache", "sluice")
	}
	d := filepath.Join(cache, "cluster", "kube-v1.35.4", "bin")
	for _, b := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(d, b)); err != nil {
			t.Fatalf("envtest needs %s in %s: run `make envtest-assets` (hack/cluster/build.sh) or set KUBEBUILDER_ASSETS", b, d)
		}
	}
	return d
}

var webhookSideEffects = admissionregistrationv1.SideEffectClassNoneOnDryRun

// sharedCluster is the package's one envtest, as cluster-api keeps one per package:
// started by the first test that needs it, stopped by TestMain after the last. Tests
// stay independent on it: each works in namespaces of its own (env.namespace), runs its
// own manager and NATS server, and its Workflows are deleted when it ends.
var sharedCluster struct {
	once sync.Once
	te   *envtest.Environment
	err  error
}

// TestMain stops the package's envtest, if a test started it, after the tests ran.
func TestMain(m *testing.M) {
	code := m.Run()
	if sharedCluster.te != nil {
		// Nothing of the ended tests may log through their testing.T now.
		ctrl.SetLogger(logr.Discard())
		if err := sharedCluster.te.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping envtest:", err)
		}
	}
	os.Exit(code)
}

// clusterOf returns the package's envtest, starting it on the first call.
func clusterOf(t *testing.T) *envtest.Environment {
	t.Helper()
	dir := assets(t)
	sharedCluster.once.Do(func() {
		sharedCluster.te = newCluster(dir)
		if _, err := sharedCluster.te.Start(); err != nil {
			sharedCluster.te, sharedCluster.err = nil, err
		}
	})
	if sharedCluster.err != nil {
		t.Fatalf("starting envtest: %v", sharedCluster.err)
	}
	return sharedCluster.te
}

// ownCluster starts an envtest for t alone, stopped when t ends: for a test that changes
// what every other test would see (nodes, a scheduler and a garbage collector).
func ownCluster(t *testing.T) *envtest.Environment {
	t.Helper()
	te := newCluster(assets(t))
	if _, err := te.Start(); err != nil {
		t.Fatalf("starting envtest: %v", err)
	}
	t.Cleanup(func() { _ = te.Stop() })
	return te
}

// newCluster is an envtest with the CRDs and the pod injection webhook's configuration.
func newCluster(assets string) *envtest.Environment {
	ignore := admissionregistrationv1.Ignore
	te := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     []string{filepath.Join("..", "crds")},
		ErrorIfCRDPathMissing: true,
		Scheme:                scheme(),
		WebhookInstallOptions: envtest.WebhookInstallOptions{
			MutatingWebhooks: []*admissionregistrationv1.MutatingWebhookConfiguration{{
				ObjectMeta: metav1.ObjectMeta{Name: "sluice"},
				Webhooks: []admissionregistrationv1.MutatingWebhook{{
					Name:                    "inject.sluice.io",
					AdmissionReviewVersions: []string{"v1"},
					SideEffects:             &webhookSideEffects,
					FailurePolicy:           &ignore,
					ObjectSelector:          &metav1.LabelSelector{MatchLabels: map[string]string{v1alpha1.LabelInject: "true"}},
					ClientConfig:            admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{Name: "sluice-webhook", Namespace: "sluice-system", Path: ptr.To(podwebhook.InjectPath)}},
					Rules: []admissionregistrationv1.RuleWithOperations{{
						Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
						Rule:       admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}},
					}},
				}},
			}},
		},
	}
	// The webhook denies with failurePolicy Fail in deploy/; here Ignore would hide a
	// crash, so every webhook test checks that injection happened.
	te.WebhookInstallOptions.MutatingWebhooks[0].Webhooks[0].FailurePolicy = ptr.To(admissionregistrationv1.Fail)
	return te
}

// scheme holds the types the tests read and write.
func scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = v1alpha1.AddToScheme(s)
	return s
}

// startEnv starts NATS and the manager with the reconciler and the webhook against the
// package's envtest; tweaks change the reconciler before it starts.
func startEnv(t *testing.T, tweaks ...func(*WorkflowReconciler)) *env {
	t.Helper()
	testenv.Integration(t, "kube-apiserver and etcd (envtest) and an embedded nats-server")
	return startEnvOn(t, clusterOf(t), tweaks...)
}

// startEnvOn is startEnv against the envtest te.
func startEnvOn(t *testing.T, te *envtest.Environment, tweaks ...func(*WorkflowReconciler)) *env {
	t.Helper()
	return startEnvAs(t, te, te.Config, tweaks...)
}

// startEnvAs is startEnvOn with the manager (the controller and the webhook) talking to
// the API server with cfg (an impersonating one: the controller's RBAC); the env's
// client is the administrator's.
func startEnvAs(t *testing.T, te *envtest.Environment, managerCfg *rest.Config, tweaks ...func(*WorkflowReconciler)) *env {
	t.Helper()
	s := te.Scheme
	cfg := te.Config
	ctrl.SetLogger(testr.NewWithOptions(t, testr.Options{Verbosity: 1}))
	k8s, err := client.New(cfg, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	restoreCABundle(t, k8s, te)

	js, err := jetstream.New(testutil.Connect(t, testutil.NATS(t)))
	if err != nil {
		t.Fatal(err)
	}
	keys, err := natsauth.GenerateKeys()
	if err != nil {
		t.Fatal(err)
	}
	streams := &JetStreams{JS: js, Keys: keys}

	wo := te.WebhookInstallOptions
	mgr, err := ctrl.NewManager(managerCfg, ctrl.Options{
		Scheme:        s,
		Logger:        testr.New(t),
		Client:        ManagerClientOptions(), // as cmd/sluice/controller.go
		Metrics:       metricsserver.Options{BindAddress: "0"},
		Controller:    config.Controller{SkipNameValidation: ptr.To(true)}, // one manager per test
		WebhookServer: webhook.NewServer(webhook.Options{Host: wo.LocalServingHost, Port: wo.LocalServingPort, CertDir: wo.LocalServingCertDir}),
	})
	if err != nil {
		t.Fatal(err)
	}
	opts := inject.Options{Image: "sluice:test"}
	r := &WorkflowReconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorderFor("sluice-controller"), //nolint:staticcheck // SA1019: as cmd/sluice/controller.go, core/v1 Events
		Streams: streams, Inject: opts, NATSURL: "nats://sluice-nats:4222"}
	for _, tweak := range tweaks {
		tweak(r)
	}
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	mgr.GetWebhookServer().Register(podwebhook.InjectPath, &webhook.Admission{Handler: &podwebhook.PodInjector{
		Reader: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Decoder: admission.NewDecoder(s), Options: opts,
		Recorder: mgr.GetEventRecorderFor("sluice-webhook"), AgentUser: r.EnsureAgentUser}}) //nolint:staticcheck // SA1019: as cmd/sluice/controller.go
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
	// The webhook server must be up before pods are created.
	eventually(t, 30*time.Second, "webhook server started", func() error { return mgr.GetWebhookServer().StartedChecker()(nil) })
	return &env{k8s: k8s, js: js, streams: streams, cfg: te}
}

// restoreCABundle gives the webhook configuration envtest's CA again: a test of the
// webhook's certificates patches its own in, and the API server must trust the next
// test's webhook server.
func restoreCABundle(t *testing.T, k8s client.Client, te *envtest.Environment) {
	t.Helper()
	ctx := context.Background()
	var cfg admissionregistrationv1.MutatingWebhookConfiguration
	if err := k8s.Get(ctx, types.NamespacedName{Name: "sluice"}, &cfg); err != nil {
		t.Fatal(err)
	}
	ca := te.WebhookInstallOptions.LocalServingCAData
	changed := false
	for i := range cfg.Webhooks {
		if !bytes.Equal(cfg.Webhooks[i].ClientConfig.CABundle, ca) {
			cfg.Webhooks[i].ClientConfig.CABundle, changed = ca, true
		}
	}
	if changed {
		if err := k8s.Update(ctx, &cfg); err != nil {
			t.Fatal(err)
		}
	}
}

// startClient is a client of a started envtest.
func startClient(t *testing.T, te *envtest.Environment) client.Client {
	t.Helper()
	c, err := client.New(te.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// namespace creates a namespace for t alone: a name another test of the package took
// fails t. When t ends, its Workflows are deleted (their finalizers run by t's manager,
// still running then), so that no later test's manager reconciles them.
func (e *env) namespace(t *testing.T, name string) string {
	t.Helper()
	if err := e.k8s.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		t.Fatalf("namespace %s (each test of the package needs namespaces of its own): %v", name, err)
	}
	t.Cleanup(func() { e.deleteWorkflows(t, name) })
	return name
}

// deleteWorkflows deletes the Workflows of namespace ns and waits until they are gone,
// taking off the finalizers of those still there after a while.
func (e *env) deleteWorkflows(t *testing.T, ns string) {
	ctx := context.Background()
	if err := e.k8s.DeleteAllOf(ctx, &v1alpha1.Workflow{}, client.InNamespace(ns)); err != nil {
		t.Logf("deleting the Workflows of %s: %v", ns, err)
		return
	}
	left := func() []v1alpha1.Workflow {
		var list v1alpha1.WorkflowList
		if err := e.k8s.List(ctx, &list, client.InNamespace(ns)); err != nil {
			t.Logf("listing the Workflows of %s: %v", ns, err)
			return nil
		}
		return list.Items
	}
	if wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return len(left()) == 0, nil
	}) == nil {
		return
	}
	for _, wf := range left() {
		patch := client.MergeFrom(wf.DeepCopy())
		wf.Finalizers = nil
		if err := e.k8s.Patch(ctx, &wf, patch); err != nil && !apierrors.IsNotFound(err) {
			t.Logf("taking off the finalizers of %s/%s: %v", ns, wf.Name, err)
		}
	}
}

// eventually polls cond until it returns nil, failing with its last error after d.
func eventually(t *testing.T, d time.Duration, what string, cond func() error) {
	t.Helper()
	poll(t, d, 50*time.Millisecond, what, cond)
}
