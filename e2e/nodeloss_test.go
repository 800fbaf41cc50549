//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sluice-io/sluice/api/v1alpha1"
)

// Losing a node mid-workflow (docs/kubernetes.md, "Losing a node"): hack/cluster/local.sh
// node-stop kills a node's kubelet, kube-proxy, containerd and its pods' processes, as a
// crash would; node-start brings it back when the spec ends. It needs the local cluster
// with at least two nodes (`make e2e-local NODES=3`), one of which runs nothing but
// DaemonSet pods and MinIO (Sluice's controller, NATS and CoreDNS must survive; the spec
// moves the Deployments' pods off a node to free it), and is skipped elsewhere. Serial: no other spec may run while a node is gone.
var _ = Describe("Losing a node", Serial, Ordered, func() {
	It("fails the readers of the files held only there, keeps the replicated ones, and retries elsewhere", func(ctx SpecContext) {
		a, b, k := nodesToLose(ctx)
		ns := namespace(ctx, "nodeloss")
		// produce, on b, writes only-b.txt (its bytes stay on b) and streamed.txt
		// (replicate: Stream: every node's store gets them) and ends. keep and lose, on a,
		// read one each once the spec opens their gate (/tmp/go), after b is lost. again
		// prefers b (so does the controller: its producer ran there) and waits there
		// forever; its retry elsewhere reads streamed.txt and ends.
		wf := loadWorkflowYAML(fmt.Sprintf(`
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: lose}
spec:
  steps:
  - name: produce
    template:
      spec:
        nodeSelector: {kubernetes.io/hostname: %[3]s}
        containers:
        - name: produce
          image: %[1]s
          imagePullPolicy: %[2]s
          command: [sh, -c, 'seq 1 100000 > "$SLUICE_DIR/only-b.txt" && seq 1 100000 > "$SLUICE_DIR/streamed.txt"']
    outputs:
    - {path: only-b.txt, commit: {rule: OnClose}}
    - {path: streamed.txt, commit: {rule: OnClose}, replicate: Stream}
  - name: keep
    inputs: [streamed.txt]
    template:
      spec:
        nodeSelector: {kubernetes.io/hostname: %[4]s}
        containers:
        - name: keep
          image: %[1]s
          imagePullPolicy: %[2]s
          command: [sh, -c, 'while [ ! -e /tmp/go ]; do sleep 1; done; test "$(wc -l < "$SLUICE_DIR/streamed.txt")" -eq 100000']
  - name: lose
    inputs: [only-b.txt]
    backoffLimit: 1
    template:
      spec:
        nodeSelector: {kubernetes.io/hostname: %[4]s}
        containers:
        - name: lose
          image: %[1]s
          imagePullPolicy: %[2]s
          command: [sh, -c, 'while [ ! -e /tmp/go ]; do sleep 1; done; cat "$SLUICE_DIR/only-b.txt" > /dev/null']
  - name: again
    inputs: [streamed.txt]
    backoffLimit: 1
    template:
      spec:
        affinity:
          nodeAffinity:
            preferredDuringSchedulingIgnoredDuringExecution:
            - weight: 100
              preference: {matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [%[3]s]}]}
        containers:
        - name: again
          image: %[1]s
          imagePullPolicy: %[2]s
          env: [{name: NODE, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}]
          command: [sh, -c, 'if [ "$NODE" = %[3]s ]; then sleep 100000; fi; test "$(wc -l < "$SLUICE_DIR/streamed.txt")" -eq 100000']
`, image, pullPol, b, a))
		wf.Namespace = ns
		Expect(k8s.Create(ctx, wf)).To(Succeed())

		By("waiting for produce to end on " + b + ", keep and lose to wait on " + a + " and again to run on " + b)
		var again *corev1.Pod
		Eventually(func(g Gomega) {
			produce := stepPod(ctx, g, ns, "produce")
			g.Expect(produce.Status.Phase).To(Equal(corev1.PodSucceeded), "produce not done")
			g.Expect(containerRunning(stepPod(ctx, g, ns, "keep"), "keep")).To(BeTrue(), "keep not running")
			g.Expect(containerRunning(stepPod(ctx, g, ns, "lose"), "lose")).To(BeTrue(), "lose not running")
			again = stepPod(ctx, g, ns, "again")
			g.Expect(containerRunning(again, "again")).To(BeTrue(), "again not running")
		}).WithContext(ctx).WithTimeout(4 * time.Minute).WithPolling(time.Second).Should(Succeed())
		Expect(again.Spec.NodeName).To(Equal(b), "again's first attempt should prefer %s", b)

		By("losing " + b)
		DeferCleanup(func() {
			localCluster("node-start", k)
			// The specs after this one need b's CSI plugin, and MinIO if it ran there.
			for _, w := range []string{"daemonset/sluice-csi", "deployment/sluice-minio"} {
				kubectl("-n", system, "rollout", "status", w, "--timeout=300s")
			}
		})
		localCluster("node-stop", k)
		lostAt := time.Now()

		By("waiting for the controller to report " + b + " lost, with only-b.txt, and to retry again elsewhere")
		Eventually(func(g Gomega) {
			files := eventsOf(ctx, g, ns, "FilesLost")
			g.Expect(files).To(ConsistOf(And(ContainSubstring("node "+b+" was lost with 1 file(s)"), ContainSubstring("only-b.txt"))))
			lost := eventsOf(ctx, g, ns, "NodeLost")
			g.Expect(lost).To(ContainElement(And(ContainSubstring("step again instance 0"), ContainSubstring("node "+b+" was lost"),
				ContainSubstring("retried as pod"))))
		}).WithContext(ctx).WithTimeout(4 * time.Minute).WithPolling(2 * time.Second).Should(Succeed())
		GinkgoWriter.Printf("%s reported lost %s after it stopped\n", b, time.Since(lostAt).Round(time.Second))

		By("opening keep's gate: streamed.txt survived on " + a)
		openGate(ctx, ns, "keep")
		Eventually(func(g Gomega) corev1.PodPhase { return stepPod(ctx, g, ns, "keep").Status.Phase }).
			WithContext(ctx).WithTimeout(2 * time.Minute).WithPolling(time.Second).Should(Equal(corev1.PodSucceeded))

		By("waiting for again's retry to succeed away from " + b)
		Eventually(func(g Gomega) {
			p := stepPod(ctx, g, ns, "again")
			g.Expect(p.Name).NotTo(Equal(again.Name), "not retried yet")
			g.Expect(p.Spec.NodeName).NotTo(BeEmpty(), "retry not scheduled yet")
			g.Expect(p.Spec.NodeName).NotTo(Equal(b), "the retry went back to the lost node")
			g.Expect(p.Status.Phase).To(Equal(corev1.PodSucceeded))
		}).WithContext(ctx).WithTimeout(3 * time.Minute).WithPolling(time.Second).Should(Succeed())

		By("opening lose's gate: its read of only-b.txt fails, naming " + b + " and the file, and the Workflow fails")
		reader := stepPod(ctx, Default, ns, "lose")
		openGate(ctx, ns, "lose")
		// The fetch gives up once b's peers have not answered for 60 s.
		Eventually(func(g Gomega) *metav1.Condition {
			var got v1alpha1.Workflow
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(wf), &got)).To(Succeed())
			g.Expect(got.Status.Phase).To(Equal(v1alpha1.WorkflowFailed))
			return meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionFailed)
		}).WithContext(ctx).WithTimeout(4 * time.Minute).WithPolling(2 * time.Second).Should(And(
			HaveField("Reason", "InputLost"),
			HaveField("Message", And(ContainSubstring("step lose instance 0 needs only-b.txt"), ContainSubstring("lost with node "+b))),
		))
		Expect(eventsOf(ctx, Default, ns, "InputLost")).To(ContainElement(ContainSubstring("only-b.txt")))
		logs, err := clientset.CoreV1().Pods(ns).GetLogs(reader.Name, &corev1.PodLogOptions{Container: "sluice-sidecar"}).DoRaw(ctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(string(logs)).To(And(ContainSubstring("could not be fetched"), ContainSubstring(`only-b.txt`), ContainSubstring(b)),
			"the reader's sidecar should say which file and which node")
	})
})

// nodesToLose picks, on the local cluster, a node b to lose that runs only DaemonSet pods
// and MinIO (which no spec needs meanwhile, and which comes back with the node, its
// emptyDir kept, unless the node stays away past its pods' 300 s toleration), and another
// node a; k is b's number for local.sh (sluice-node-k). When every node runs something
// that must survive, a node whose such pods all belong to Deployments (Sluice's
// controller, CoreDNS; not NATS, whose volume is the node's) is freed: cordoned, those
// pods deleted and their Deployments available again elsewhere, uncordoned. It skips the
// spec elsewhere, and when no node can be freed.
func nodesToLose(ctx context.Context) (a, b, k string) {
	GinkgoHelper()
	nodes := schedulableNodes(ctx)
	if len(nodes) < 2 {
		Skip(fmt.Sprintf("needs at least 2 schedulable nodes, the cluster has %d", len(nodes)))
	}
	for _, n := range nodes {
		if !strings.HasPrefix(n, "sluice-node-") {
			Skip("losing a node needs hack/cluster/local.sh's nodes (sluice-node-K), not " + n)
		}
	}
	busy := mustSurvive(ctx)
	for _, n := range nodes {
		if len(busy[n]) == 0 {
			b = n
			break
		}
	}
	if b == "" {
		b = freeANode(ctx, nodes, busy)
	}
	for _, n := range nodes {
		if n != b {
			a = n
			break
		}
	}
	return a, b, strings.TrimPrefix(b, "sluice-node-")
}

// mustSurvive returns, by node, the running pods that must survive a node's loss: all
// but DaemonSet pods, MinIO's and finished ones.
func mustSurvive(ctx context.Context) map[string][]corev1.Pod {
	GinkgoHelper()
	var pods corev1.PodList
	Expect(k8s.List(ctx, &pods)).To(Succeed())
	busy := map[string][]corev1.Pod{}
	for _, p := range pods.Items {
		if done := p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed; done || p.Spec.NodeName == "" || !p.DeletionTimestamp.IsZero() {
			continue
		}
		if ref := metav1.GetControllerOf(&p); ref != nil && ref.Kind == "DaemonSet" || p.Namespace == system && p.Labels["app.kubernetes.io/component"] == "minio" {
			continue
		}
		busy[p.Spec.NodeName] = append(busy[p.Spec.NodeName], p)
	}
	return busy
}

// freeANode frees one of nodes (the last that can be) of the pods of busy that must
// survive, when they all belong to ReplicaSets, and returns it; it skips the spec when
// none can be.
func freeANode(ctx context.Context, nodes []string, busy map[string][]corev1.Pod) string {
	GinkgoHelper()
	movable := func(p corev1.Pod) bool {
		ref := metav1.GetControllerOf(&p)
		return ref != nil && ref.Kind == "ReplicaSet"
	}
	for i := len(nodes) - 1; i >= 0; i-- {
		n := nodes[i]
		ok := true
		for _, p := range busy[n] {
			ok = ok && movable(p)
		}
		if !ok {
			continue
		}
		By("freeing " + n + " of its Deployments' pods, to lose it")
		kubectl("cordon", n)
		for _, p := range busy[n] {
			kubectl("delete", "pod", "-n", p.Namespace, p.Name, "--wait=true")
		}
		// Each ReplicaSet has its replicas ready again, none of them the deleted pods.
		for _, p := range busy[n] {
			rs := metav1.GetControllerOf(&p)
			Eventually(func(g Gomega) {
				var pods corev1.PodList
				g.Expect(k8s.List(ctx, &pods, client.InNamespace(p.Namespace))).To(Succeed())
				ready := 0
				for _, q := range pods.Items {
					if ref := metav1.GetControllerOf(&q); ref == nil || ref.UID != rs.UID || q.UID == p.UID || !q.DeletionTimestamp.IsZero() {
						continue
					}
					for _, c := range q.Status.Conditions {
						if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
							ready++
						}
					}
				}
				g.Expect(ready).To(BeNumerically(">=", 1), "ready pods of ReplicaSet %s/%s", p.Namespace, rs.Name)
			}).WithContext(ctx).WithTimeout(3 * time.Minute).WithPolling(time.Second).Should(Succeed())
		}
		kubectl("uncordon", n)
		Expect(mustSurvive(ctx)[n]).To(BeEmpty(), "pods that must survive on %s after freeing it", n)
		return n
	}
	Skip(fmt.Sprintf("needs a node that runs only DaemonSet pods (and MinIO), or only Deployments' pods besides, and another; busy: %v", busy))
	return ""
}

// localCluster runs hack/cluster/local.sh with args (node-stop K, node-start K).
func localCluster(args ...string) {
	GinkgoHelper()
	out, err := exec.Command(filepath.Join(repoRoot, "hack", "cluster", "local.sh"), args...).CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "local.sh %s: %s", strings.Join(args, " "), out)
}

// openGate creates /tmp/go in the app container of step's pod, which its command waits for.
func openGate(ctx context.Context, ns, step string) {
	GinkgoHelper()
	p := stepPod(ctx, Default, ns, step)
	kubectl("-n", ns, "exec", p.Name, "-c", step, "--", "touch", "/tmp/go")
}

// eventsOf returns the messages of the Events with reason in namespace ns.
func eventsOf(ctx context.Context, g Gomega, ns, reason string) []string {
	var evs corev1.EventList
	g.Expect(k8s.List(ctx, &evs, client.InNamespace(ns))).To(Succeed())
	var out []string
	for _, e := range evs.Items {
		if e.Reason == reason {
			out = append(out, e.Message)
		}
	}
	return out
}
