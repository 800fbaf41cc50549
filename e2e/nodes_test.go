//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"path"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sluice-io/sluice/api/v1alpha1"
)

// The node stores across nodes: what a node serves after its pods ended, what a node
// receives, and what survives the restart of Sluice's own pods mid-workflow.
var _ = Describe("Node stores across nodes", func() {
	It("serves a file from a node whose pods have all ended to a late consumer on another node, and removes the stores with the Workflow", func(ctx SpecContext) {
		nodes := needNodes(ctx, 2)
		ns := namespace(ctx, "serve")
		a, b := nodes[0], nodes[1]
		const size = 3 << 20
		// The consumer, forced to b, is held by a scheduling gate until every pod on a
		// (the producer's) has ended.
		consume := shStep("consume", b, `cat "$SLUICE_DIR/data.bin" > "$SLUICE_DIR/copy.bin"`, []string{"data.bin"}, output("copy.bin", v1alpha1.CommitOnClose, ""))
		consume.Template.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: holdGate}}
		wf := workflow(ns, "serve", []string{"copy.bin"},
			shStep("produce", a, patternScript(size, "data.bin"), nil, output("data.bin", v1alpha1.CommitOnTermination, "")),
			consume)
		probeA, probeB := storeProbe(ctx, ns, a), storeProbe(ctx, ns, b)
		Expect(k8s.Create(ctx, wf)).To(Succeed())

		By("waiting until every pod of the workflow on " + a + " has ended, data.bin committed")
		waitEnded(ctx, wf, 1, "produce")
		var pods corev1.PodList
		Expect(k8s.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{v1alpha1.LabelWorkflow: wf.Name})).To(Succeed())
		for _, p := range pods.Items {
			if p.Spec.NodeName == a {
				Expect(p.Status.Phase).To(BeElementOf(corev1.PodSucceeded, corev1.PodFailed), "pod %s on %s has not ended", p.Name, a)
			}
		}
		dir := path.Join("store", ns, wf.Name)
		Expect(storeHas(ctx, probeA, dir)).To(BeTrue(), "%s's node store has no %s after its pods ended", a, dir)

		releaseGate(ctx, stepPod(ctx, Default, ns, "consume"))
		waitSucceeded(ctx, ns, wf.Name, 5*time.Minute)
		Expect(stepPod(ctx, Default, ns, "consume").Spec.NodeName).To(Equal(b))
		checkObject(ctx, wf, "copy.bin", pattern(size))
		Eventually(nodeReceived(ctx, wf)).WithContext(ctx).WithTimeout(time.Minute).Should(HaveKeyWithValue(b, int64(size)),
			"status.nodes[].receivedBytes: %s fetched data.bin from %s", b, a)
		Expect(storeHas(ctx, probeB, dir)).To(BeTrue(), "%s's node store has no %s", b, dir)

		By("deleting the Workflow")
		Expect(k8s.Delete(ctx, wf)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(storeHas(ctx, probeA, dir)).To(BeFalse(), "%s still holds %s", a, dir)
			g.Expect(storeHas(ctx, probeB, dir)).To(BeFalse(), "%s still holds %s", b, dir)
		}).WithContext(ctx).WithTimeout(2 * time.Minute).WithPolling(2 * time.Second).Should(Succeed())
	})

	It("streams a NoUpdate file to a consumer on another node while the producer writes; a third node with no reader receives nothing", func(ctx SpecContext) {
		nodes := needNodes(ctx, 3)
		ns := namespace(ctx, "received")
		a, b, c := nodes[0], nodes[1], nodes[2]
		// The consumer, forced to b, reads numbers.txt as it comes (NoUpdate), then writes
		// an empty done.txt; the bystander on c runs from the start and reads only
		// done.txt (no bytes).
		wf := copyWorkflow(ns, "received", a, b, 20)
		consume := stepOf(wf, "consume")
		consume.Template.Spec.Containers[0] = shell("c", `cat "$SLUICE_DIR/numbers.txt" > "$SLUICE_DIR/copy.txt" && : > "$SLUICE_DIR/done.txt"`)
		consume.Outputs = append(consume.Outputs, output("done.txt", v1alpha1.CommitOnClose, ""))
		wf.Spec.Steps = append(wf.Spec.Steps, shStep("bystander", c, `cat "$SLUICE_DIR/done.txt"`, []string{"done.txt"}))
		Expect(k8s.Create(ctx, wf)).To(Succeed())

		By("waiting for the consumer on " + b + " and the bystander on " + c + " to run while the producer writes on " + a)
		waitRunning(ctx, ns, "produce", "consume", "bystander")
		checkCopy(ctx, wf, a, b)
		Expect(stepPod(ctx, Default, ns, "bystander").Spec.NodeName).To(Equal(c))
		Eventually(nodeReceived(ctx, wf)).WithContext(ctx).WithTimeout(time.Minute).Should(Equal(map[string]int64{a: 0, b: int64(len(numbers(100000))), c: 0}),
			"status.nodes[].receivedBytes: %s reads numbers.txt from %s, %s reads no bytes", b, a, c)
	})

	// A file committed after its creator's pod ended (OnTermination) must be recorded
	// (its SHA-256, outputs.Copier) where its bytes are: by the store server of the
	// producer's node, not by a pod still running elsewhere, which would fetch it all.
	It("sends a file committed after its producer ended to no node without a reader", func(ctx SpecContext) {
		nodes := needNodes(ctx, 3)
		ns := namespace(ctx, "adopt")
		a, b, c := nodes[0], nodes[1], nodes[2]
		const size = 1 << 20
		// data.bin commits OnTermination, once its producer on a has ended. The only pod
		// running then is the bystander on c (placement None: created at once), which
		// waits for done.txt and reads no bytes; the consumer on b, held by a scheduling
		// gate, reads data.bin afterwards.
		consume := shStep("consume", b, `cat "$SLUICE_DIR/data.bin" > "$SLUICE_DIR/copy.bin" && : > "$SLUICE_DIR/done.txt"`, []string{"data.bin"},
			output("copy.bin", v1alpha1.CommitOnClose, ""), output("done.txt", v1alpha1.CommitOnClose, ""))
		consume.Template.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: holdGate}}
		bystander := shStep("bystander", c, `cat "$SLUICE_DIR/done.txt"`, []string{"done.txt"})
		bystander.Placement = v1alpha1.PlacementNone
		wf := workflow(ns, "adopt", []string{"copy.bin"},
			shStep("produce", a, patternScript(size, "data.bin"), nil, output("data.bin", v1alpha1.CommitOnTermination, "")),
			consume, bystander)
		Expect(k8s.Create(ctx, wf)).To(Succeed())
		waitRunning(ctx, ns, "bystander")
		waitEnded(ctx, wf, 1, "produce")
		releaseGate(ctx, stepPod(ctx, Default, ns, "consume"))
		waitSucceeded(ctx, ns, wf.Name, 5*time.Minute)
		checkObject(ctx, wf, "copy.bin", pattern(size))
		Eventually(nodeReceived(ctx, wf)).WithContext(ctx).WithTimeout(time.Minute).Should(Equal(map[string]int64{a: 0, b: size, c: 0}),
			"status.nodes[].receivedBytes: %s reads data.bin from %s, %s reads no bytes", b, a, c)
	})

	// Sluice's own pods restarted while the producer on one node streams to the consumer
	// on another: the CSI plugin of the producer's node, the controller, NATS (its
	// streams on a PersistentVolume: the chart's nats.persistence, a local volume of
	// local.sh's StorageClass sluice-local). NATS takes longer to come back, so its
	// producer writes for 50 s instead of 20.
	for _, r := range []struct {
		what, prefix, component string
		parts                   int
	}{
		{"the CSI plugin pod of the producer's node", "csirestart", "csi", 20},
		{"the controller", "ctlrestart", "controller", 20},
		{"NATS, its streams on a PersistentVolume,", "natsrestart", "nats", 50},
	} {
		It("completes a workflow byte-exact when "+r.what+" restarts mid-stream", func(ctx SpecContext) {
			nodes := needNodes(ctx, 2)
			if r.component == "nats" {
				needPersistentNATS(ctx)
			}
			ns := namespace(ctx, r.prefix)
			wf := copyWorkflow(ns, r.prefix, nodes[0], nodes[1], r.parts)
			Expect(k8s.Create(ctx, wf)).To(Succeed())
			waitRunning(ctx, ns, "produce", "consume")
			on := nodes[0]
			if r.component != "csi" {
				on = ""
			}
			restartPod(ctx, "app.kubernetes.io/component="+r.component, on)
			Expect(containerRunning(stepPod(ctx, Default, ns, "produce"), "c")).To(BeTrue(), "the producer ended before the restart was done")
			waitWebhook(ctx)
			checkCopy(ctx, wf, nodes[0], nodes[1])
		})
	}

	// An upgrade of the release while a workflow streams: `helm upgrade` with new pod
	// annotations restarts every pod of the sluice image (controller, the CSI plugin on
	// every node, NATS), as a new image would, one DaemonSet pod after another.
	It("completes a workflow byte-exact across a helm upgrade of the release mid-stream", func(ctx SpecContext) {
		if envOr("E2E_INSTALL", "kustomize") != "helm" {
			Skip("installed with kustomize: E2E_INSTALL=helm runs this spec")
		}
		nodes := needNodes(ctx, 2)
		needPersistentNATS(ctx)
		ns := namespace(ctx, "upgrade")
		wf := copyWorkflow(ns, "upgrade", nodes[0], nodes[1], 125)
		Expect(k8s.Create(ctx, wf)).To(Succeed())
		waitRunning(ctx, ns, "produce", "consume")
		By("helm upgrade with new pod annotations")
		helmInstall(filepath.Join(repoRoot, envOr("E2E_HELM_VALUES", "charts/sluice/ci/local-values.yaml")),
			"--set-string", "podAnnotations.sluice\\.io/e2e-upgrade="+ns)
		for _, w := range []string{"deployment/sluice-controller", "daemonset/sluice-csi", "statefulset/sluice-nats"} {
			kubectl("-n", system, "rollout", "status", w, "--timeout=300s")
		}
		pods, err := clientset.CoreV1().Pods(system).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component in (controller,csi,nats)"})
		Expect(err).NotTo(HaveOccurred())
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil {
				Expect(p.Annotations).To(HaveKeyWithValue("sluice.io/e2e-upgrade", ns), "pod %s was not replaced by the upgrade", p.Name)
			}
		}
		Expect(containerRunning(stepPod(ctx, Default, ns, "produce"), "c")).To(BeTrue(), "the producer ended before the upgrade was done")
		waitWebhook(ctx)
		checkCopy(ctx, wf, nodes[0], nodes[1])
	})
})

// needPersistentNATS skips the spec unless the installation keeps NATS's streams on a
// PersistentVolumeClaim (the chart's nats.persistence): on an emptyDir a restarted NATS
// loses the running workflows' streams, by design.
func needPersistentNATS(ctx context.Context) {
	GinkgoHelper()
	var sts appsv1.StatefulSet
	Expect(k8s.Get(ctx, client.ObjectKey{Namespace: system, Name: "sluice-nats"}, &sts)).To(Succeed())
	if len(sts.Spec.VolumeClaimTemplates) == 0 {
		Skip("NATS keeps its streams on an emptyDir (nats.persistence.enabled: false)")
	}
}

// copyWorkflow returns Workflow ns/name: produce, pinned to node a, writes numbers.txt
// (1..100000 in parts, which must divide 100000, a second apart, NoUpdate); consume,
// pinned to b, copies it as it comes to the permanent copy.txt (checkCopy).
func copyWorkflow(ns, name, a, b string, parts int) *v1alpha1.Workflow {
	return workflow(ns, name, []string{"copy.txt"},
		shStep("produce", a, numbersScript(parts, 100000/parts), nil, output("numbers.txt", v1alpha1.CommitOnClose, v1alpha1.FireNoUpdate)),
		shStep("consume", b, `cat "$SLUICE_DIR/numbers.txt" > "$SLUICE_DIR/copy.txt"`, []string{"numbers.txt"}, output("copy.txt", v1alpha1.CommitOnClose, "")))
}

// waitRunning waits until the containers of steps' pods run together (their pods' "c").
func waitRunning(ctx context.Context, ns string, steps ...string) {
	GinkgoHelper()
	Eventually(func(g Gomega) {
		for _, s := range steps {
			g.Expect(containerRunning(stepPod(ctx, g, ns, s), "c")).To(BeTrue(), "step %s not running", s)
		}
	}).WithContext(ctx).WithTimeout(3*time.Minute).WithPolling(time.Second).Should(Succeed(),
		"steps %v never ran together", steps)
}

// checkCopy waits for copyWorkflow's Workflow to succeed and checks its pods ran on nodes
// a and b and its copy equals what the producer wrote.
func checkCopy(ctx context.Context, wf *v1alpha1.Workflow, a, b string) {
	GinkgoHelper()
	waitSucceeded(ctx, wf.Namespace, wf.Name, 5*time.Minute)
	Expect(stepPod(ctx, Default, wf.Namespace, "produce").Spec.NodeName).To(Equal(a))
	Expect(stepPod(ctx, Default, wf.Namespace, "consume").Spec.NodeName).To(Equal(b))
	checkObject(ctx, wf, "copy.txt", numbers(100000))
}

// checkObject checks that the permanent output file of wf holds want.
func checkObject(ctx context.Context, wf *v1alpha1.Workflow, file string, want []byte) {
	GinkgoHelper()
	got := objectAt(ctx, outputURI(ctx, wf, file))
	Expect(len(got)).To(Equal(len(want)), "size of %s", file)
	Expect(bytes.Equal(got, want)).To(BeTrue(), "%s differs from what was written", file)
}

// restartPod deletes the pods of Sluice's namespace matching selector (on node, unless
// empty) and waits until a new one is Ready in their place.
func restartPod(ctx context.Context, selector, node string) {
	GinkgoHelper()
	opts := metav1.ListOptions{LabelSelector: selector}
	if node != "" {
		opts.FieldSelector = "spec.nodeName=" + node
	}
	pods, err := clientset.CoreV1().Pods(system).List(ctx, opts)
	Expect(err).NotTo(HaveOccurred())
	Expect(pods.Items).NotTo(BeEmpty(), "no pod %s on %q", selector, node)
	old := map[types.UID]bool{}
	for _, p := range pods.Items {
		By(fmt.Sprintf("deleting pod %s/%s on %s", system, p.Name, p.Spec.NodeName))
		old[p.UID] = true
		Expect(client.IgnoreNotFound(k8s.Delete(ctx, &p))).To(Succeed())
	}
	Eventually(func(g Gomega) {
		pods, err := clientset.CoreV1().Pods(system).List(ctx, opts)
		g.Expect(err).NotTo(HaveOccurred())
		ready := 0
		for _, p := range pods.Items {
			g.Expect(old[p.UID]).To(BeFalse(), "old pod %s still there", p.Name)
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		g.Expect(ready).To(BeNumerically(">=", 1), "no new Ready pod %s on %q", selector, node)
	}).WithContext(ctx).WithTimeout(3 * time.Minute).WithPolling(time.Second).Should(Succeed())
}

// nodeReceived returns the Workflow's status.nodes[].receivedBytes by node (polled by
// Eventually).
func nodeReceived(ctx context.Context, wf *v1alpha1.Workflow) func() (map[string]int64, error) {
	return func() (map[string]int64, error) {
		var got v1alpha1.Workflow
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(wf), &got); err != nil {
			return nil, err
		}
		out := map[string]int64{}
		for _, n := range got.Status.Nodes {
			out[n.Name] = n.ReceivedBytes
		}
		return out, nil
	}
}

// storeProbe starts a pod on node that sees the node's Sluice state directory
// (/var/lib/sluice, the CSI plugin's --state-dir, with the node store's tmpfs) read-only
// at /sluice, for storeHas.
func storeProbe(ctx context.Context, ns, node string) *corev1.Pod {
	GinkgoHelper()
	hostToContainer := corev1.MountPropagationHostToContainer
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "store-probe-" + strings.ToLower(strings.ReplaceAll(node, ".", "-"))},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: ptrTo(int64(0)),
			Containers: []corev1.Container{{
				Name: "probe", Image: image, ImagePullPolicy: pullPol, Command: []string{"sleep", "3600"},
				VolumeMounts: []corev1.VolumeMount{{Name: "state", MountPath: "/sluice", ReadOnly: true, MountPropagation: &hostToContainer}},
			}},
			Volumes: []corev1.Volume{{Name: "state", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib/sluice"}}}},
		},
	}
	Expect(k8s.Create(ctx, p)).To(Succeed())
	Eventually(func() (corev1.PodPhase, error) {
		var cur corev1.Pod
		err := k8s.Get(ctx, client.ObjectKeyFromObject(p), &cur)
		return cur.Status.Phase, err
	}).WithContext(ctx).WithTimeout(2*time.Minute).Should(Equal(corev1.PodRunning), "store probe on %s", node)
	return p
}

// storeHas reports whether the directory dir (relative to /var/lib/sluice) exists on the
// probe's node.
func storeHas(ctx context.Context, probe *corev1.Pod, dir string) bool {
	GinkgoHelper()
	out := kubectl("-n", probe.Namespace, "exec", probe.Name, "--", "sh", "-c",
		fmt.Sprintf(`if [ -d /sluice/%s ]; then echo present; else echo absent; fi`, dir))
	return strings.TrimSpace(out) == "present"
}
