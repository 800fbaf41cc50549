//go:build e2e

// Package e2e runs Sluice on a real cluster: it installs deploy/ with kubectl, runs
// Workflows and labelled Jobs on it, and checks what users depend on (results in object
// storage byte for byte, recovery from a killed sidecar, cleanup on deletion). It runs
// against any cluster KUBECONFIG points at:
//
//	make e2e         # kind (deploy/overlays/kind, images pulled or kind-loaded)
//	make e2e-local   # the local cluster of hack/cluster/local.sh (deploy/overlays/local)
//
// Settings (environment): E2E_INSTALL, how to install Sluice: kustomize (default) or helm;
// E2E_DEPLOY, the kustomize directory to apply (default deploy/overlays/kind;
// E2E_DEPLOY=none skips the install, whichever the way); E2E_HELM_VALUES, the values file
// of a Helm install (default charts/sluice/ci/local-values.yaml); E2E_IMAGE, the shell image
// the example steps run (default busybox:1.36); E2E_PULL_POLICY, their imagePullPolicy
// (default IfNotPresent). kubectl must be on PATH. On failure a spec prints the cluster's
// state and the Sluice logs that explain it.
package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"github.com/nats-io/nats.go"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/objstore"
	"github.com/sluice-io/sluice/internal/transport"
)

const system = "sluice-system"

var (
	cfg       *rest.Config
	k8s       client.Client
	clientset *kubernetes.Clientset
	repoRoot  string
	image     = envOr("E2E_IMAGE", "busybox:1.36")
	pullPol   = corev1.PullPolicy(envOr("E2E_PULL_POLICY", string(corev1.PullIfNotPresent)))
)

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func TestE2E(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Sluice e2e")
}

var _ = BeforeSuite(func(ctx SpecContext) {
	var err error
	repoRoot, err = filepath.Abs("..")
	Expect(err).NotTo(HaveOccurred())
	cfg, err = ctrl.GetConfig()
	Expect(err).NotTo(HaveOccurred(), "KUBECONFIG must name the cluster to test")
	scheme := runtime.NewScheme()
	Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	Expect(v1alpha1.AddToScheme(scheme)).To(Succeed())
	k8s, err = client.New(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
	clientset, err = kubernetes.NewForConfig(cfg)
	Expect(err).NotTo(HaveOccurred())

	dir := envOr("E2E_DEPLOY", "deploy/overlays/kind")
	if dir == "none" {
		return
	}
	switch install := envOr("E2E_INSTALL", "kustomize"); install {
	case "kustomize":
		By("installing Sluice from " + dir)
		kubectl("apply", "--server-side", "--force-conflicts", "-k", filepath.Join(repoRoot, dir))
	case "helm":
		values := envOr("E2E_HELM_VALUES", "charts/sluice/ci/local-values.yaml")
		By("installing Sluice with Helm from charts/sluice, values " + values)
		helmInstall(filepath.Join(repoRoot, values))
	default:
		Fail("E2E_INSTALL must be kustomize or helm, not " + install)
	}
	for _, w := range []string{"deployment/sluice-controller", "daemonset/sluice-csi", "statefulset/sluice-nats", "deployment/sluice-minio"} {
		kubectl("-n", system, "rollout", "status", w, "--timeout=300s")
	}
	waitWebhook(ctx)
}, NodeTimeout(10*time.Minute))

// waitWebhook waits until the API server gets an answer from the injection webhook.
func waitWebhook(ctx context.Context) {
	GinkgoHelper()
	// A rolled-out controller is not yet a reachable webhook (Service endpoints, proxy
	// rules, caBundle): wait until the API server gets an answer from it. A server-side
	// dry run calls the webhook; its refusal (no such Workflow) is an answer.
	probe := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "sluice-webhook-probe",
		Labels: map[string]string{v1alpha1.LabelInject: "true"}, Annotations: map[string]string{v1alpha1.AnnotationWorkflow: "none", v1alpha1.AnnotationStep: "none"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: image}}}}
	Eventually(func() error {
		err := k8s.Create(ctx, probe.DeepCopy(), client.DryRunAll)
		if err != nil && strings.Contains(err.Error(), "failed calling webhook") {
			return err
		}
		return nil
	}).WithContext(ctx).WithTimeout(3*time.Minute).WithPolling(2*time.Second).Should(Succeed(), "the injection webhook never answered")
}

// helmInstall installs (or upgrades) the chart as release "sluice" into the system
// namespace, created first with the pod-security label the CSI plugin needs, with the
// values file values and helm's further args; helm is the pinned build of hack/tools.sh.
func helmInstall(values string, args ...string) {
	GinkgoHelper()
	ns := kubectl("create", "namespace", system, "--dry-run=client", "-o", "yaml")
	apply := exec.Command("kubectl", "apply", "-f", "-")
	apply.Stdin = strings.NewReader(ns)
	out, err := apply.CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "creating namespace %s: %s", system, out)
	kubectl("label", "namespace", system, "--overwrite", "pod-security.kubernetes.io/enforce=privileged")
	helm, err := exec.Command(filepath.Join(repoRoot, "hack", "tools.sh"), "helm").Output()
	Expect(err).NotTo(HaveOccurred(), "building helm (hack/tools.sh helm)")
	args = append([]string{"upgrade", "--install", "sluice", filepath.Join(repoRoot, "charts", "sluice"), "--namespace", system, "-f", values}, args...)
	cmd := exec.Command(strings.TrimSpace(string(helm)), args...)
	out, err = cmd.CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "helm upgrade --install: %s", out)
}

// kubectl runs kubectl with args and returns its standard output; a failure fails the spec.
func kubectl(args ...string) string {
	GinkgoHelper()
	var out, errb bytes.Buffer
	cmd := exec.Command("kubectl", args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	Expect(cmd.Run()).To(Succeed(), "kubectl %s: %s", strings.Join(args, " "), errb.String())
	return out.String()
}

// namespace creates a namespace for one spec, deleted after it (after the failure dump).
func namespace(ctx context.Context, prefix string) string {
	GinkgoHelper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-", Labels: map[string]string{"sluice.io/e2e": "true"}}}
	Expect(k8s.Create(ctx, ns)).To(Succeed())
	DeferCleanup(func(ctx SpecContext) {
		if CurrentSpecReport().Failed() {
			dump(ctx, ns.Name)
		}
		Expect(client.IgnoreNotFound(k8s.Delete(ctx, ns))).To(Succeed())
	})
	return ns.Name
}

// dump prints what explains a failure: the objects of the spec's namespace and of Sluice's,
// recent events, and the logs (current and previous) of every container there.
func dump(ctx context.Context, ns string) {
	w := GinkgoWriter
	fmt.Fprintf(w, "\n===== cluster state for namespace %s =====\n", ns)
	for _, args := range [][]string{
		{"get", "nodes", "-o", "wide"},
		{"-n", ns, "get", "workflows.sluice.io,jobs,pods,secrets,configmaps", "-o", "wide"},
		{"-n", ns, "get", "workflows.sluice.io", "-o", "yaml"},
		{"-n", ns, "get", "events", "--sort-by=.lastTimestamp"},
		{"-n", system, "get", "all", "-o", "wide"},
		{"-n", system, "get", "events", "--sort-by=.lastTimestamp"},
	} {
		out, err := exec.CommandContext(ctx, "kubectl", args...).CombinedOutput()
		fmt.Fprintf(w, "\n$ kubectl %s\n%s", strings.Join(args, " "), out)
		if err != nil {
			fmt.Fprintf(w, "(%v)\n", err)
		}
	}
	for _, n := range []string{ns, system} {
		pods, err := clientset.CoreV1().Pods(n).List(ctx, metav1.ListOptions{})
		if err != nil {
			fmt.Fprintf(w, "listing pods of %s: %v\n", n, err)
			continue
		}
		for _, p := range pods.Items {
			var names []string
			for _, c := range p.Spec.InitContainers {
				names = append(names, c.Name)
			}
			for _, c := range p.Spec.Containers {
				names = append(names, c.Name)
			}
			for _, c := range names {
				for _, previous := range []bool{true, false} {
					b, err := clientset.CoreV1().Pods(n).GetLogs(p.Name, &corev1.PodLogOptions{Container: c, Previous: previous, TailLines: ptrTo(int64(200))}).DoRaw(ctx)
					if err != nil {
						continue
					}
					fmt.Fprintf(w, "\n----- logs %s/%s [%s] previous=%v -----\n%s", n, p.Name, c, previous, b)
				}
			}
		}
	}
}

func ptrTo[T any](v T) *T { return &v }

// workflowPhase returns the Workflow's phase (polled by Eventually).
func workflowPhase(ctx context.Context, ns, name string) func() (v1alpha1.WorkflowPhase, error) {
	return func() (v1alpha1.WorkflowPhase, error) {
		var wf v1alpha1.Workflow
		err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &wf)
		return wf.Status.Phase, err
	}
}

// waitSucceeded waits until the Workflow succeeds; it fails at once if it fails.
func waitSucceeded(ctx context.Context, ns, name string, timeout time.Duration) {
	GinkgoHelper()
	Eventually(func() (v1alpha1.WorkflowPhase, error) {
		phase, err := workflowPhase(ctx, ns, name)()
		if phase == v1alpha1.WorkflowFailed {
			return phase, StopTrying("Workflow " + ns + "/" + name + " failed")
		}
		return phase, err
	}).WithContext(ctx).WithTimeout(timeout).WithPolling(2 * time.Second).Should(Equal(v1alpha1.WorkflowSucceeded))
}

// forward forwards a local port to port of the first Running pod matching selector in
// namespace ns, for the rest of the spec, and returns the local address (host:port).
func forward(ctx context.Context, ns, selector string, port int) string {
	GinkgoHelper()
	var pod string
	Eventually(func(g Gomega) {
		pods, err := clientset.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		g.Expect(err).NotTo(HaveOccurred())
		var running []string
		for _, p := range pods.Items {
			if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
				running = append(running, p.Name)
			}
		}
		g.Expect(running).NotTo(BeEmpty(), "no running pod matches %s", selector)
		sort.Strings(running)
		pod = running[0]
	}).WithContext(ctx).WithTimeout(2 * time.Minute).Should(Succeed())
	rt, upgrader, err := spdy.RoundTripperFor(cfg)
	Expect(err).NotTo(HaveOccurred())
	url := clientset.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("portforward").URL()
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: rt}, http.MethodPost, url)
	stop, ready := make(chan struct{}), make(chan struct{})
	fw, err := portforward.New(dialer, []string{fmt.Sprintf("0:%d", port)}, stop, ready, io.Discard, GinkgoWriter)
	Expect(err).NotTo(HaveOccurred())
	errc := make(chan error, 1)
	go func() { errc <- fw.ForwardPorts() }()
	select {
	case <-ready:
	case err := <-errc:
		Fail(fmt.Sprintf("port-forward to %s/%s:%d: %v", ns, pod, port, err))
	case <-time.After(time.Minute):
		Fail(fmt.Sprintf("port-forward to %s/%s:%d not ready after a minute", ns, pod, port))
	}
	DeferCleanup(func() { close(stop) })
	ports, err := fw.GetPorts()
	Expect(err).NotTo(HaveOccurred())
	return fmt.Sprintf("127.0.0.1:%d", ports[0].Local)
}

// installationCA returns the CA certificate the installation's NATS and MinIO serve TLS
// with (Secret sluice-tls's ca.crt, as the chart's tls.enabled makes it), nil when they
// serve plain.
func installationCA(ctx context.Context) []byte {
	GinkgoHelper()
	var sec corev1.Secret
	err := k8s.Get(ctx, client.ObjectKey{Namespace: system, Name: "sluice-tls"}, &sec)
	if apierrors.IsNotFound(err) {
		return nil
	}
	Expect(err).NotTo(HaveOccurred())
	return sec.Data["ca.crt"]
}

// dialNATS connects to the installation's NATS at addr (a port forward) with opts, as its
// clients do: over TLS verifying the installation's CA when it serves TLS.
func dialNATS(ctx context.Context, addr string, opts ...nats.Option) (*nats.Conn, error) {
	GinkgoHelper()
	url := "nats://" + addr
	if ca := installationCA(ctx); ca != nil {
		o, err := transport.TLSOption(ca)
		Expect(err).NotTo(HaveOccurred())
		url, opts = "tls://"+addr, append(opts, o)
	}
	return nats.Connect(url, opts...)
}

// minioClient returns a client of the installation's MinIO, through a port forward, with
// the keys accessKey and secretKey: over TLS verifying the installation's CA when it
// serves TLS.
func minioClient(ctx context.Context, accessKey, secretKey string) *minio.Client {
	GinkgoHelper()
	ca := installationCA(ctx)
	addr := forward(ctx, system, "app.kubernetes.io/component=minio", 9000)
	tr, err := objstore.Transport(addr, ca != nil, ca)
	Expect(err).NotTo(HaveOccurred())
	mc, err := minio.New(addr, &minio.Options{Creds: credentials.NewStaticV4(accessKey, secretKey, ""), Secure: ca != nil, Transport: tr})
	Expect(err).NotTo(HaveOccurred())
	return mc
}
