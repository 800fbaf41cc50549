//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"sort"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sluice-io/sluice/api/v1alpha1"
)

// The specs that cross nodes; they need a cluster with at least two schedulable nodes
// (hack/cluster/local.sh up --nodes 3, or `make e2e-local NODES=3`) and are skipped on one.
var _ = Describe("Across nodes", func() {
	var nodes []string
	BeforeEach(func(ctx SpecContext) {
		nodes = schedulableNodes(ctx)
		if len(nodes) < 2 {
			Skip(fmt.Sprintf("needs at least 2 schedulable nodes, the cluster has %d", len(nodes)))
		}
	})

	It("streams an Update file byte-exact from a producer on one node to a consumer on another while the producer writes", func(ctx SpecContext) {
		ns := namespace(ctx, "crossnode")
		a, b := nodes[0], nodes[1]
		// The producer writes 20 chunks a second apart; the consumer, forced to another
		// node, opens the file at once and waits (Update: nothing is visible before the
		// producer's close commits it), then copies it.
		wf := loadWorkflowYAML(fmt.Sprintf(`
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: cross}
spec:
  permanent: [copy.txt]
  steps:
  - name: produce
    template:
      spec:
        nodeSelector: {kubernetes.io/hostname: %[3]s}
        containers:
        - name: produce
          image: %[1]s
          imagePullPolicy: %[2]s
          command: [sh, -c, 'i=0; while [ $i -lt 20 ]; do seq $((i*5000+1)) $((i*5000+5000)); sleep 1; i=$((i+1)); done > "$SLUICE_DIR/numbers.txt"']
    outputs: [{path: numbers.txt, commit: {rule: OnClose}, fire: Update}]
  - name: consume
    inputs: [numbers.txt]
    template:
      spec:
        nodeSelector: {kubernetes.io/hostname: %[4]s}
        containers:
        - name: consume
          image: %[1]s
          imagePullPolicy: %[2]s
          command: [sh, -c, 'cat "$SLUICE_DIR/numbers.txt" > "$SLUICE_DIR/copy.txt"']
    outputs: [{path: copy.txt, commit: {rule: OnClose}}]
`, image, pullPol, a, b))
		wf.Namespace = ns
		Expect(k8s.Create(ctx, wf)).To(Succeed())

		By("waiting for the consumer to run on " + b + " while the producer writes on " + a)
		Eventually(func(g Gomega) {
			producer, consumer := stepPod(ctx, g, ns, "produce"), stepPod(ctx, g, ns, "consume")
			g.Expect(containerRunning(producer, "produce")).To(BeTrue(), "producer not writing")
			g.Expect(containerRunning(consumer, "consume")).To(BeTrue(), "consumer not running yet")
		}).WithContext(ctx).WithTimeout(3*time.Minute).WithPolling(time.Second).Should(Succeed(),
			"the consumer never ran while the producer was writing")

		waitSucceeded(ctx, ns, wf.Name, 5*time.Minute)
		producer, consumer := stepPod(ctx, Default, ns, "produce"), stepPod(ctx, Default, ns, "consume")
		Expect(producer.Spec.NodeName).To(Equal(a), "the producer's node")
		Expect(consumer.Spec.NodeName).To(Equal(b), "the consumer's node")
		Expect(consumer.Status.Phase).To(Equal(corev1.PodSucceeded))

		var want bytes.Buffer
		for i := 1; i <= 100000; i++ {
			fmt.Fprintf(&want, "%d\n", i)
		}
		got := objectAt(ctx, outputURI(ctx, wf, "copy.txt"))
		Expect(len(got)).To(Equal(want.Len()), "size of the consumer's copy")
		Expect(bytes.Equal(got, want.Bytes())).To(BeTrue(), "the consumer's copy on %s differs from what the producer wrote on %s", b, a)
	})

	It("places a NoUpdate consumer on its producer's node", func(ctx SpecContext) {
		ns := namespace(ctx, "colocate")
		// Nothing pins either pod: the controller's pod affinity (placement Preferred, the
		// default) puts the streaming consumer next to the producer.
		wf := loadWorkflowYAML(fmt.Sprintf(`
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: pair}
spec:
  permanent: [sum.txt]
  steps:
  - name: produce
    template:
      spec:
        containers:
        - name: produce
          image: %[1]s
          imagePullPolicy: %[2]s
          command: [sh, -c, 'i=0; while [ $i -lt 5 ]; do seq $((i*1000+1)) $((i*1000+1000)); sleep 1; i=$((i+1)); done > "$SLUICE_DIR/numbers.txt"']
    outputs: [{path: numbers.txt, commit: {rule: OnClose}, fire: NoUpdate}]
  - name: consume
    inputs: [numbers.txt]
    template:
      spec:
        containers:
        - name: consume
          image: %[1]s
          imagePullPolicy: %[2]s
          command: [sh, -c, 'awk "{s += \$1} END {print s}" "$SLUICE_DIR/numbers.txt" > "$SLUICE_DIR/sum.txt"']
    outputs: [{path: sum.txt, commit: {rule: OnClose}}]
`, image, pullPol))
		wf.Namespace = ns
		Expect(k8s.Create(ctx, wf)).To(Succeed())
		waitSucceeded(ctx, ns, wf.Name, 5*time.Minute)
		producer, consumer := stepPod(ctx, Default, ns, "produce"), stepPod(ctx, Default, ns, "consume")
		Expect(producer.Spec.NodeName).NotTo(BeEmpty())
		Expect(consumer.Spec.NodeName).To(Equal(producer.Spec.NodeName), "the streaming consumer's node (the producer ran on %s)", producer.Spec.NodeName)
		Expect(string(objectAt(ctx, outputURI(ctx, wf, "sum.txt")))).To(Equal(fmt.Sprintf("%d\n", 5000*5001/2)), "the consumer's sum")
	})
})

// schedulableNodes returns the names of the Ready nodes that take ordinary pods (not
// cordoned, no NoSchedule or NoExecute taint), sorted by name.
func schedulableNodes(ctx context.Context) []string {
	GinkgoHelper()
	var list corev1.NodeList
	Expect(k8s.List(ctx, &list)).To(Succeed())
	var out []string
	for _, n := range list.Items {
		if n.Spec.Unschedulable {
			continue
		}
		ready, tainted := false, false
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				ready = true
			}
		}
		for _, t := range n.Spec.Taints {
			if t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute {
				tainted = true
			}
		}
		if ready && !tainted {
			out = append(out, n.Name)
		}
	}
	sort.Strings(out)
	return out
}

// stepPod returns the one pod of step in namespace ns (the latest attempt of instance 0).
func stepPod(ctx context.Context, g Gomega, ns, step string) *corev1.Pod {
	var pods corev1.PodList
	g.Expect(k8s.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{v1alpha1.LabelStep: step})).To(Succeed())
	g.Expect(pods.Items).NotTo(BeEmpty(), "no pod of step %s yet", step)
	latest := &pods.Items[0]
	for i := range pods.Items {
		if pods.Items[i].CreationTimestamp.After(latest.CreationTimestamp.Time) {
			latest = &pods.Items[i]
		}
	}
	return latest
}
