//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/controller/placement"
)

// holdGate is the scheduling gate the specs put in a step's template to hold its pod
// unscheduled until the spec releases it (releaseGate): a step that starts late.
const holdGate = "sluice.io/e2e-hold"

// The controller's placement rules (controller/placement) on several nodes: each spec
// asserts where the scheduler put the pods (spec.nodeName) and the affinity terms the
// controller gave them.
var _ = Describe("Placement across nodes", func() {
	It("places a consumer that starts late on the node holding most of its committed input bytes", func(ctx SpecContext) {
		nodes := needNodes(ctx, 2)
		ns := namespace(ctx, "bytes")
		big, small := nodes[1], nodes[0]
		const bigSize, smallSize = 8 << 20, 4 << 10
		// big and small commit their files when they close them, and their creators
		// record them; gate, held by a scheduling gate, is bound only once both have
		// ended, and consume (which reads gate's file too) is created only then: it starts
		// late, with every other input committed.
		gate := shStep("gate", "", `echo go > "$SLUICE_DIR/gate.txt"`, nil, output("gate.txt", v1alpha1.CommitOnClose, ""))
		gate.Template.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: holdGate}}
		wf := workflow(ns, "bytes", []string{"sums.txt"},
			shStep("big", big, patternScript(bigSize, "big.bin"), nil, output("big.bin", v1alpha1.CommitOnClose, "")),
			shStep("small", small, patternScript(smallSize, "small.bin"), nil, output("small.bin", v1alpha1.CommitOnClose, "")),
			gate,
			shStep("consume", "", `cd "$SLUICE_DIR" && sha256sum big.bin small.bin > sums.txt`, []string{"big.bin", "small.bin", "gate.txt"},
				output("sums.txt", v1alpha1.CommitOnClose, "")))
		Expect(k8s.Create(ctx, wf)).To(Succeed())

		By("waiting for big (on " + big + ") and small (on " + small + ") to end with their files committed")
		waitEnded(ctx, wf, 2, "big", "small")
		var consumers corev1.PodList
		Expect(k8s.List(ctx, &consumers, client.InNamespace(ns), client.MatchingLabels{v1alpha1.LabelStep: "consume"})).To(Succeed())
		Expect(consumers.Items).To(BeEmpty(), "consume was created before gate was bound")

		releaseGate(ctx, stepPod(ctx, Default, ns, "gate"))
		waitSucceeded(ctx, ns, wf.Name, 5*time.Minute)

		consumer := stepPod(ctx, Default, ns, "consume")
		Expect(stepPod(ctx, Default, ns, "big").Spec.NodeName).To(Equal(big))
		Expect(stepPod(ctx, Default, ns, "small").Spec.NodeName).To(Equal(small))
		Expect(consumer.Spec.Affinity).NotTo(BeNil(), "consume has no affinity")
		Expect(consumer.Spec.Affinity.NodeAffinity).NotTo(BeNil(), "consume has no node affinity: %+v", consumer.Spec.Affinity)
		terms := consumer.Spec.Affinity.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution
		Expect(terms).To(HaveLen(2), "one preferred term per node holding input bytes")
		Expect(terms[0].Preference.MatchExpressions[0].Values).To(Equal([]string{big}), "the heaviest term's node")
		Expect(terms[0].Weight).To(BeNumerically(">=", 99), "the weight of %s, holding %d of %d bytes", big, bigSize, bigSize+smallSize)
		Expect(terms[1].Preference.MatchExpressions[0].Values).To(Equal([]string{small}))
		Expect(terms[1].Weight).To(BeNumerically("==", 1))
		Expect(consumer.Spec.NodeName).To(Equal(big), "consume's node: the one holding %d of its %d input bytes", bigSize, bigSize+smallSize)

		Expect(string(objectAt(ctx, outputURI(ctx, wf, "sums.txt")))).To(Equal(
			sha256Line(pattern(bigSize), "big.bin")+sha256Line(pattern(smallSize), "small.bin")), "the consumer's checksums")
	})

	It("keeps a NoUpdate consumer with placement Required on its producer's node, whatever its template prefers", func(ctx SpecContext) {
		nodes := needNodes(ctx, 2)
		ns := namespace(ctx, "required")
		a, b := nodes[0], nodes[1]
		// The consumer's own template prefers b with the heaviest weight; Required makes
		// its producer's node a requirement.
		wf := sumWorkflow(ns, "required", a, v1alpha1.PlacementRequired)
		stepOf(wf, "consume").Template.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
			PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{Weight: 100, Preference: corev1.NodeSelectorTerm{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: placement.HostnameKey, Operator: corev1.NodeSelectorOpIn, Values: []string{b}}}}}}}}
		Expect(k8s.Create(ctx, wf)).To(Succeed())
		waitSucceeded(ctx, ns, wf.Name, 5*time.Minute)

		producer, consumer := stepPod(ctx, Default, ns, "produce"), stepPod(ctx, Default, ns, "consume")
		Expect(producer.Spec.NodeName).To(Equal(a))
		aff := consumer.Spec.Affinity
		Expect(aff).NotTo(BeNil())
		Expect(aff.PodAffinity).NotTo(BeNil(), "consume has no pod affinity")
		Expect(aff.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution).To(ConsistOf(corev1.PodAffinityTerm{
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{v1alpha1.LabelWorkflow: wf.Name, v1alpha1.LabelStep: "produce"}},
			TopologyKey:   placement.HostnameKey,
		}), "the required pod affinity to the producer")
		Expect(aff.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution).To(HaveLen(1), "the template's own preference is kept")
		Expect(consumer.Spec.NodeName).To(Equal(a), "the Required consumer's node (its producer ran on %s, its template preferred %s)", a, b)
		checkSum(ctx, wf)
	})

	It("adds no affinity to a NoUpdate consumer with placement None, leaving it to the scheduler", func(ctx SpecContext) {
		nodes := needNodes(ctx, 2)
		ns := namespace(ctx, "none")
		wf := sumWorkflow(ns, "none", nodes[0], v1alpha1.PlacementNone)
		Expect(k8s.Create(ctx, wf)).To(Succeed())
		waitSucceeded(ctx, ns, wf.Name, 5*time.Minute)

		producer, consumer := stepPod(ctx, Default, ns, "produce"), stepPod(ctx, Default, ns, "consume")
		Expect(producer.Spec.NodeName).To(Equal(nodes[0]))
		Expect(consumer.Spec.Affinity).To(BeNil(), "Sluice added affinity terms to a placement None consumer")
		Expect(consumer.Spec.NodeName).NotTo(BeEmpty())
		GinkgoWriter.Printf("placement None: the producer ran on %s, the consumer on %s\n", producer.Spec.NodeName, consumer.Spec.NodeName)
		checkSum(ctx, wf)
	})

	It("spreads unpaired replicas of a step over the nodes and says where each ran", func(ctx SpecContext) {
		nodes := needNodes(ctx, 3)
		ns := namespace(ctx, "spread")
		work := shStep("work", "", `echo "$SLUICE_INSTANCE" > "$SLUICE_DIR/part-$SLUICE_INSTANCE.txt"`, nil, output("part-*.txt", v1alpha1.CommitOnClose, ""))
		work.Replicas = ptrTo(int32(3))
		wf := workflow(ns, "spread", nil, work)
		Expect(k8s.Create(ctx, wf)).To(Succeed())
		waitSucceeded(ctx, ns, wf.Name, 5*time.Minute)

		var pods corev1.PodList
		Expect(k8s.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{v1alpha1.LabelStep: "work"})).To(Succeed())
		Expect(pods.Items).To(HaveLen(3))
		nodeOf := map[string]string{} // pod -> node
		used := map[string]bool{}
		for _, p := range pods.Items {
			Expect(p.Spec.Affinity).NotTo(BeNil())
			Expect(p.Spec.Affinity.PodAntiAffinity).NotTo(BeNil(), "pod %s has no anti-affinity to its siblings", p.Name)
			Expect(p.Spec.Affinity.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution).To(HaveLen(1))
			Expect(p.Spec.Affinity.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].Weight).To(BeNumerically("==", placement.WeightSpread))
			nodeOf[p.Name] = p.Spec.NodeName
			used[p.Spec.NodeName] = true
		}
		Expect(used).To(HaveLen(3), "the nodes of the 3 replicas (%v) on %d nodes %v", nodeOf, len(nodes), nodes)

		By("reading where each instance ran from kubectl get swf")
		out := kubectl("-n", ns, "get", "swf", wf.Name, "-o",
			`jsonpath={range .status.steps[?(@.name=="work")].instances[*]}{.instance} {.pod} {.node} {.phase} {.attempts}{"\n"}{end}`)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		Expect(lines).To(HaveLen(3), "status.steps[work].instances: %q", out)
		for i, l := range lines {
			pod := fmt.Sprintf("spread-work-%d", i)
			Expect(l).To(Equal(fmt.Sprintf("%d %s %s Succeeded 1", i, pod, nodeOf[pod])), "status.steps[work].instances[%d]", i)
		}
		Expect(kubectl("-n", ns, "get", "swf", wf.Name)).To(MatchRegexp(`spread\s+Succeeded\s+1/1`), "kubectl get swf")
		By("reading where each instance ran from the Workflow's Events")
		Eventually(func(g Gomega) {
			events := kubectl("-n", ns, "get", "events", "--field-selector", "involvedObject.kind=Workflow,involvedObject.name="+wf.Name,
				"-o", `jsonpath={range .items[*]}{.reason}: {.message}{"\n"}{end}`)
			for i := range 3 {
				pod := fmt.Sprintf("spread-work-%d", i)
				g.Expect(events).To(ContainSubstring("Scheduled: step work instance %d: pod %s on node %s", i, pod, nodeOf[pod]), "the Workflow's Events")
			}
		}).WithContext(ctx).WithTimeout(30 * time.Second).Should(Succeed())
	})
})

// needNodes returns the cluster's schedulable nodes, skipping the spec when there are
// fewer than n.
func needNodes(ctx context.Context, n int) []string {
	GinkgoHelper()
	nodes := schedulableNodes(ctx)
	if len(nodes) < n {
		Skip(fmt.Sprintf("needs at least %d schedulable nodes, the cluster has %d", n, len(nodes)))
	}
	return nodes
}

// workflow returns Workflow ns/name of steps, keeping the files permanent.
func workflow(ns, name string, permanent []string, steps ...v1alpha1.Step) *v1alpha1.Workflow {
	return &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.WorkflowSpec{Permanent: permanent, Steps: steps}}
}

// shStep returns a step whose one container ("c") runs script in the e2e image, pinned to
// node (nodeSelector kubernetes.io/hostname) unless node is empty.
func shStep(name, node, script string, inputs []string, outputs ...v1alpha1.Output) v1alpha1.Step {
	s := v1alpha1.Step{Name: name, Inputs: inputs, Outputs: outputs,
		Template: &corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{shell("c", script)}}}}
	if node != "" {
		s.Template.Spec.NodeSelector = map[string]string{placement.HostnameKey: node}
	}
	return s
}

// output declares path, committed by rule and fired by fire (empty: the default).
func output(path string, rule v1alpha1.CommitRule, fire v1alpha1.FireRule) v1alpha1.Output {
	return v1alpha1.Output{Path: path, Commit: v1alpha1.CommitSpec{Rule: rule}, Fire: fire}
}

// stepOf returns wf's step name.
func stepOf(wf *v1alpha1.Workflow, name string) *v1alpha1.Step {
	GinkgoHelper()
	for i := range wf.Spec.Steps {
		if wf.Spec.Steps[i].Name == name {
			return &wf.Spec.Steps[i]
		}
	}
	Fail("no step " + name)
	return nil
}

// numbersScript writes numbers.txt: 1..parts*per, in parts of per lines a second apart.
func numbersScript(parts, per int) string {
	return fmt.Sprintf(`i=0; while [ $i -lt %[1]d ]; do seq $((i*%[2]d+1)) $((i*%[2]d+%[2]d)); sleep 1; i=$((i+1)); done > "$SLUICE_DIR/numbers.txt"`, parts, per)
}

// numbers is what numbersScript writes for n numbers.
func numbers(n int) []byte {
	var b bytes.Buffer
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "%d\n", i)
	}
	return b.Bytes()
}

// sumWorkflow returns Workflow ns/name: produce, pinned to node, writes numbers.txt
// (1..5000 in five parts a second apart, fire NoUpdate); consume, with placement policy,
// sums them into the permanent sum.txt (checkSum).
func sumWorkflow(ns, name, node string, policy v1alpha1.PlacementPolicy) *v1alpha1.Workflow {
	consume := shStep("consume", "", `awk '{s += $1} END {print s}' "$SLUICE_DIR/numbers.txt" > "$SLUICE_DIR/sum.txt"`,
		[]string{"numbers.txt"}, output("sum.txt", v1alpha1.CommitOnClose, ""))
	consume.Placement = policy
	return workflow(ns, name, []string{"sum.txt"},
		shStep("produce", node, numbersScript(5, 1000), nil, output("numbers.txt", v1alpha1.CommitOnClose, v1alpha1.FireNoUpdate)),
		consume)
}

// checkSum checks sumWorkflow's result.
func checkSum(ctx context.Context, wf *v1alpha1.Workflow) {
	GinkgoHelper()
	Expect(string(objectAt(ctx, outputURI(ctx, wf, "sum.txt")))).To(Equal(fmt.Sprintf("%d\n", 5000*5001/2)), "the consumer's sum")
}

// waitEnded waits until the pods of steps have succeeded and the Workflow's status counts
// at least committed files.
func waitEnded(ctx context.Context, wf *v1alpha1.Workflow, committed int64, steps ...string) {
	GinkgoHelper()
	Eventually(func(g Gomega) {
		for _, s := range steps {
			g.Expect(stepPod(ctx, g, wf.Namespace, s).Status.Phase).To(Equal(corev1.PodSucceeded), "step %s", s)
		}
		var got v1alpha1.Workflow
		g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(wf), &got)).To(Succeed())
		g.Expect(got.Status.Files.Committed).To(BeNumerically(">=", committed), "files committed")
	}).WithContext(ctx).WithTimeout(3 * time.Minute).WithPolling(time.Second).Should(Succeed())
}

// releaseGate removes the spec's scheduling gate from pod p: the scheduler places it now.
func releaseGate(ctx context.Context, p *corev1.Pod) {
	GinkgoHelper()
	By("releasing " + p.Name + " to the scheduler")
	Eventually(func() error {
		var cur corev1.Pod
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(p), &cur); err != nil {
			return err
		}
		var keep []corev1.PodSchedulingGate
		for _, g := range cur.Spec.SchedulingGates {
			if g.Name != holdGate {
				keep = append(keep, g)
			}
		}
		cur.Spec.SchedulingGates = keep
		return k8s.Update(ctx, &cur)
	}).WithContext(ctx).WithTimeout(30 * time.Second).Should(Succeed())
}

// patternScript writes n bytes of pattern to file.
func patternScript(n int, file string) string {
	return fmt.Sprintf(`yes 0123456789abcdef | head -c %d > "$SLUICE_DIR/%s"`, n, file)
}

// pattern returns n bytes of the lines "0123456789abcdef", what patternScript writes.
func pattern(n int) []byte {
	return bytes.Repeat([]byte("0123456789abcdef\n"), n/17+1)[:n]
}

// sha256Line is sha256sum's line for a file named name holding b.
func sha256Line(b []byte, name string) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]) + "  " + name + "\n"
}
