package controller

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
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
	"github.com/sluice-io/sluice/internal/transport"
)

// env is one real kube-apiserver and etcd (envtest, the binaries hack/cluster/build.sh
// builds), an embedded JetStream server, and the controller and webhook running in a
// manager against them.
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

var webhookSideEffects = admissionregistrationv1.SideEffectClassNone

// startEnv starts envtest, NATS and the manager with the reconciler and the webhook;
// tweaks change the reconciler before it starts.
func startEnv(t *testing.T, tweaks ...func(*WorkflowReconciler)) *env {
	t.Helper()
	testenv.Integration(t, "kube-apiserver and etcd (envtest) and an embedded nats-server")
	s := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(s)
	_ = v1alpha1.AddToScheme(s)
	ignore := admissionregistrationv1.Ignore
	te := &envtest.Environment{
		BinaryAssetsDirectory: assets(t),
		CRDDirectoryPaths:     []string{filepath.Join("..", "crds")},
		ErrorIfCRDPathMissing: true,
		Scheme:                s,
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
	ctrl.SetLogger(testr.NewWithOptions(t, testr.Options{Verbosity: 1}))
	cfg, err := te.Start()
	if err != nil {
		t.Fatalf("starting envtest: %v", err)
	}
	t.Cleanup(func() { _ = te.Stop() })

	srv, err := transport.StartEmbedded(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := natsauth.GenerateKeys()
	if err != nil {
		t.Fatal(err)
	}
	streams := &JetStreams{JS: js, Keys: keys}

	wo := te.WebhookInstallOptions
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:        s,
		Logger:        testr.New(t),
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
		Reader: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Decoder: admission.NewDecoder(s), Options: opts}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
	k8s, err := client.New(cfg, client.Options{Scheme: s})
	if err != nil {
		t.Fatal(err)
	}
	// The webhook server must be up before pods are created.
	eventually(t, 30*time.Second, "webhook server started", func() error { return mgr.GetWebhookServer().StartedChecker()(nil) })
	return &env{k8s: k8s, js: js, streams: streams, cfg: te}
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

// namespace creates a fresh namespace.
func (e *env) namespace(t *testing.T, name string) string {
	t.Helper()
	if err := e.k8s.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		t.Fatal(err)
	}
	return name
}

// eventually polls cond until it returns nil, failing with its last error after d.
func eventually(t *testing.T, d time.Duration, what string, cond func() error) {
	t.Helper()
	poll(t, d, 50*time.Millisecond, what, cond)
}
