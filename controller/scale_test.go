package controller

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/controller/placement"
)

// The placement scale test: the controller, the real kube-scheduler and kwok (simulated
// kubelets) against one envtest API server. A 1,000-pod workflow on 100 nodes:
//
//	sim     300 instances, writes sim/* (NoUpdate: read while written)
//	filter  300 instances, streams sim/* -> paired with sim's instance of the same index
//	stats   300 instances, reads filt/* once committed (Update) -> prefers filter's node
//	merge    99 instances, reads stats/* (Update)
//	report    1 instance
//
// Every filter must run on its sim's node (node memory, no network), sims must spread
// over the nodes, every pod must be bound and run, and the workflow must succeed when
// the pods exit. Then, on a node that is full, a Preferred consumer must fall back to
// another node and a Required one must stay Pending, unschedulable.
const scaleWorkflow = `
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: scale}
spec:
  steps:
  - name: sim
    replicas: 300
    template: &pod
      spec:
        containers: [{name: main, image: busybox, resources: {requests: {cpu: 100m, memory: 64Mi}}}]
    outputs: [{path: "sim/*", commit: {rule: OnClose}, fire: NoUpdate}]
  - name: filter
    replicas: 300
    template: *pod
    inputs: ["sim/*"]
    outputs: [{path: "filt/*", commit: {rule: OnClose}}]
  - name: stats
    replicas: 300
    template: *pod
    inputs: ["filt/*"]
    outputs: [{path: "stats/*", commit: {rule: OnClose}}]
  - name: merge
    replicas: 99
    template: *pod
    inputs: ["stats/*"]
    outputs: [{path: "merged/*", commit: {rule: OnClose}}]
  - name: report
    template: *pod
    inputs: ["merged/*"]
    outputs: [{path: report.txt, commit: {rule: OnTermination}}]
`

const (
	scaleNodes = 100
	scalePods  = 1000
	// kwokManaged is the annotation kwok selects the nodes it simulates by.
	kwokManaged = "kwok.x-k8s.io/node"
	// testExit asks the pod-succeeded stage (testdata/kwok-stages.yaml) to end a pod.
	testExit = "sluice.io/test-exit"
)

func TestPlacementAtScaleOnKwokNodes(t *testing.T) {
	bins := assets(t)
	for _, b := range []string{"kube-scheduler", "kube-controller-manager", "kwok"} {
		if _, err := os.Stat(filepath.Join(bins, b)); err != nil {
			t.Fatalf("the scale test needs %s in %s: run `make envtest-assets` (hack/cluster/build.sh envtest)", b, bins)
		}
	}
	// Its own envtest: the nodes, the scheduler and the garbage collector it adds would
	// act on the other tests' objects in the package's one.
	e := startEnvOn(t, ownCluster(t))
	ctx := context.Background()
	kubeconfig := e.adminKubeconfig(t)
	dir := t.TempDir()
	schedConfig := filepath.Join(dir, "scheduler.yaml")
	writeFile(t, schedConfig, fmt.Sprintf(`apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection: {kubeconfig: %q, qps: 1000, burst: 2000}
leaderElection: {leaderElect: false}
`, kubeconfig))
	stages, err := filepath.Abs(filepath.Join("testdata", "kwok-stages.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	startProcess(t, filepath.Join(bins, "kube-scheduler"), "--config="+schedConfig, "--secure-port=0", "-v=2")
	// The node lifecycle controller lifts the not-ready taint the API server gives every
	// new node once the node reports Ready, and the garbage collector deletes a deleted
	// Workflow's pods, as on a real cluster.
	startProcess(t, filepath.Join(bins, "kube-controller-manager"), "--kubeconfig="+kubeconfig,
		"--controllers=node-lifecycle-controller,garbage-collector-controller", "--leader-elect=false", "--secure-port=0", "-v=1")
	startProcess(t, filepath.Join(bins, "kwok"), "--kubeconfig="+kubeconfig, "--config="+stages,
		"--manage-all-nodes=false", "--manage-nodes-with-annotation-selector="+kwokManaged+"=fake",
		"--node-lease-duration-seconds=40", "--cidr=10.128.0.0/10", "--node-ip=10.0.0.1")

	for i := 0; i < scaleNodes; i++ {
		e.kwokNode(t, fmt.Sprintf("kwok-%03d", i), "8", "110")
	}
	// The node lifecycle controller untaints nodes as they report Ready; a workflow
	// created before that would be placed on the first nodes only.
	poll(t, 2*time.Minute, time.Second, "nodes ready and untainted", func() error {
		var list corev1.NodeList
		if err := e.k8s.List(ctx, &list); err != nil {
			return err
		}
		ready := 0
		for _, n := range list.Items {
			if len(n.Spec.Taints) == 0 && nodeReady(&n) {
				ready++
			}
		}
		if ready != scaleNodes {
			return fmt.Errorf("%d of %d nodes ready without taints", ready, scaleNodes)
		}
		return nil
	})
	ns := e.namespace(t, "scale")
	start := time.Now()
	if err := e.k8s.Create(ctx, workflowFrom(t, ns, scaleWorkflow)); err != nil {
		t.Fatal(err)
	}

	// Every pod bound and running on a simulated node.
	var pods []corev1.Pod
	poll(t, 3*time.Minute, time.Second, "1,000 pods running", func() error {
		var list corev1.PodList
		if err := e.k8s.List(ctx, &list, client.InNamespace(ns)); err != nil {
			return err
		}
		running := 0
		for _, p := range list.Items {
			if p.Status.Phase == corev1.PodRunning {
				running++
			}
		}
		if len(list.Items) != scalePods || running != scalePods {
			return fmt.Errorf("%d pods, %d running", len(list.Items), running)
		}
		pods = list.Items
		return nil
	})
	placed := time.Since(start)
	at := map[string]string{} // step/instance -> node
	perNode := map[string]map[string]int{}
	for _, p := range pods {
		step, inst := p.Labels[v1alpha1.LabelStep], p.Labels[v1alpha1.LabelInstance]
		at[step+"/"+inst] = p.Spec.NodeName
		if perNode[step] == nil {
			perNode[step] = map[string]int{}
		}
		perNode[step][p.Spec.NodeName]++
	}

	// NoUpdate: each filter instance runs on its sim instance's node.
	apart := 0
	for i := 0; i < 300; i++ {
		if at["filter/"+strconv.Itoa(i)] != at["sim/"+strconv.Itoa(i)] {
			apart++
			if apart <= 5 {
				t.Errorf("filter %d on %s, its producer sim %d on %s", i, at["filter/"+strconv.Itoa(i)], i, at["sim/"+strconv.Itoa(i)])
			}
		}
	}
	if apart > 0 {
		t.Errorf("%d of 300 streaming consumers are not on their producer's node", apart)
	}
	// Update inputs of a paired step: stats prefers its filter's node (weight 50), and
	// every node has room.
	together := 0
	for i := 0; i < 300; i++ {
		if at["stats/"+strconv.Itoa(i)] == at["filter/"+strconv.Itoa(i)] {
			together++
		}
	}
	if together < 300 {
		t.Errorf("%d of 300 stats instances on their filter's node, with room everywhere", together)
	}
	// Spread: 300 sims over 100 nodes (the anti-affinity of unpaired replicas).
	simNodes, maxSims := len(perNode["sim"]), 0
	for _, n := range perNode["sim"] {
		maxSims = max(maxSims, n)
	}
	if simNodes < scaleNodes*95/100 || maxSims > 4 {
		t.Errorf("300 sim instances on %d of %d nodes, at most %d on one: not spread", simNodes, scaleNodes, maxSims)
	}
	t.Logf("%d pods placed and running in %v; sims on %d nodes (max %d per node); %d/300 stats with their filter; merge on %d nodes",
		scalePods, placed.Round(time.Millisecond), simNodes, maxSims, together, len(perNode["merge"]))

	// The pods exit 0, the report committed: the workflow succeeds, with every step's count.
	e.recordCommit(t, ns, "scale", "report.txt", "")
	for i := range pods {
		p := &pods[i]
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			patch := client.MergeFrom(p.DeepCopy())
			if p.Annotations == nil {
				p.Annotations = map[string]string{}
			}
			p.Annotations[testExit] = "0"
			return e.k8s.Patch(ctx, p, patch)
		})
		if err != nil {
			t.Fatalf("annotating %s: %v", p.Name, err)
		}
	}
	poll(t, 5*time.Minute, time.Second, "workflow Succeeded", func() error {
		wf, err := e.workflow(ns, "scale")
		if err != nil {
			return err
		}
		if wf.Status.Phase != v1alpha1.WorkflowSucceeded {
			return fmt.Errorf("phase %s, progress %s, steps %+v", wf.Status.Phase, wf.Status.Progress, wf.Status.Steps)
		}
		for _, s := range wf.Status.Steps {
			want := map[string]int32{"sim": 300, "filter": 300, "stats": 300, "merge": 99, "report": 1}[s.Name]
			if s.Succeeded != want {
				return fmt.Errorf("step %s: %d succeeded, want %d", s.Name, s.Succeeded, want)
			}
		}
		return nil
	})
	t.Logf("workflow of %d pods succeeded %v after creation", scalePods, time.Since(start).Round(time.Millisecond))

	// A node without room: Preferred falls back to another node, Required waits.
	e.kwokNode(t, "kwok-full", "8", "1")
	for _, policy := range []v1alpha1.PlacementPolicy{v1alpha1.PlacementPreferred, v1alpha1.PlacementRequired} {
		name := "full-" + strings.ToLower(string(policy))
		if err := e.k8s.Create(ctx, workflowFrom(t, ns, fmt.Sprintf(`
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: %s}
spec:
  steps:
  - name: produce
    template:
      spec:
        nodeSelector: {%s: kwok-full}
        containers: [{name: main, image: busybox}]
    outputs: [{path: data, commit: {rule: OnClose}, fire: NoUpdate}]
  - name: consume
    placement: %s
    template:
      spec:
        containers: [{name: main, image: busybox}]
    inputs: [data]
`, name, placement.HostnameKey, policy))); err != nil {
			t.Fatal(err)
		}
		producer, consumer := PodName(name, "produce", 0, 0), PodName(name, "consume", 0, 0)
		poll(t, time.Minute, 200*time.Millisecond, name+": consumer scheduled or refused", func() error {
			p, err := e.pod(t, ns, consumer)
			if err != nil {
				return err
			}
			prod, err := e.pod(t, ns, producer)
			if err != nil {
				return err
			}
			if prod.Spec.NodeName != "kwok-full" {
				return fmt.Errorf("producer on %q", prod.Spec.NodeName)
			}
			switch policy {
			case v1alpha1.PlacementPreferred:
				if p.Status.Phase != corev1.PodRunning {
					return fmt.Errorf("consumer %s, node %q", p.Status.Phase, p.Spec.NodeName)
				}
				if p.Spec.NodeName == "kwok-full" {
					t.Fatalf("consumer on the full node %s", p.Spec.NodeName)
				}
			case v1alpha1.PlacementRequired:
				for _, c := range p.Status.Conditions {
					if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
						if p.Spec.NodeName != "" {
							t.Fatalf("unschedulable consumer bound to %s", p.Spec.NodeName)
						}
						return nil
					}
				}
				return fmt.Errorf("consumer conditions %+v, node %q", p.Status.Conditions, p.Spec.NodeName)
			}
			return nil
		})
		// Free the node for the next policy.
		if err := e.k8s.Delete(ctx, &v1alpha1.Workflow{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}); err != nil {
			t.Fatal(err)
		}
		poll(t, time.Minute, 200*time.Millisecond, name+": pods gone", func() error {
			if _, err := e.pod(t, ns, producer); err == nil {
				return fmt.Errorf("producer %s still exists", producer)
			}
			return nil
		})
	}
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// adminKubeconfig writes a kubeconfig of a system:masters user of the envtest API server
// and returns its path, for the processes the test starts.
func (e *env) adminKubeconfig(t *testing.T) string {
	t.Helper()
	u, err := e.cfg.AddUser(envtest.User{Name: "scale-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := u.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "kubeconfig")
	writeFile(t, p, string(kc))
	return p
}

// kwokNode creates a node kwok simulates, with cpu cores and room for pods pods.
func (e *env) kwokNode(t *testing.T, name, cpu, pods string) {
	t.Helper()
	ctx := context.Background()
	room := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse(cpu),
		corev1.ResourceMemory: resource.MustParse("32Gi"),
		corev1.ResourcePods:   resource.MustParse(pods),
	}
	// A kubelet registers its node with its capacity in the status, as here.
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Labels:      map[string]string{placement.HostnameKey: name, "type": "kwok"},
			Annotations: map[string]string{kwokManaged: "fake"},
		},
		Status: corev1.NodeStatus{Capacity: room, Allocatable: room},
	}
	if err := e.k8s.Create(ctx, n); err != nil {
		t.Fatalf("creating node %s: %v", name, err)
	}
	if n.Status.Allocatable.Pods().String() != pods {
		t.Fatalf("node %s created with allocatable %v, want %s pods", name, n.Status.Allocatable, pods)
	}
}

// startProcess runs a binary for the rest of the test; its output goes to a log file,
// whose end is printed if the test fails.
func startProcess(t *testing.T, bin string, args ...string) {
	t.Helper()
	log := filepath.Join(t.TempDir(), filepath.Base(bin)+".log")
	f, err := os.Create(log)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", bin, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		f.Close()
		if t.Failed() {
			t.Logf("last lines of %s:\n%s", log, tail(log, 30))
		}
	})
}

// tail returns the last n lines of a file.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// poll calls cond every interval until it returns nil, failing with its last error after
// d (apimachinery's wait.PollUntilContextTimeout does the waiting).
func poll(t *testing.T, d, interval time.Duration, what string, cond func() error) {
	t.Helper()
	var last error
	err := wait.PollUntilContextTimeout(context.Background(), interval, d, true, func(context.Context) (bool, error) {
		last = cond()
		return last == nil, nil
	})
	if err != nil {
		t.Fatalf("%s after %v: %v", what, d, last)
	}
}
