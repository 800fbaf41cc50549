package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/controller/inject"
	"github.com/sluice-io/sluice/internal/podconfig"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

const pipeline = `
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: pipe}
spec:
  ttlSecondsAfterFinished: 0
  permanent: [result.txt]
  storage: {bucket: results, endpoint: "http://minio.example:9000", secretRef: {name: s3}}
  steps:
  - name: produce
    template:
      spec:
        containers: [{name: main, image: busybox, command: [sh, -c, "seq 100 > /data/numbers"]}]
    outputs: [{path: numbers, commit: {rule: OnClose}, fire: NoUpdate}]
  - name: consume
    replicas: 2
    backoffLimit: 1
    template:
      spec:
        restartPolicy: OnFailure
        terminationGracePeriodSeconds: 45
        containers: [{name: main, image: busybox}]
    inputs: [numbers]
    outputs: [{path: result.txt, commit: {rule: OnTermination}}]
`

func workflowFrom(t *testing.T, ns, doc string) *v1alpha1.Workflow {
	t.Helper()
	var wf v1alpha1.Workflow
	if err := yaml.UnmarshalStrict([]byte(doc), &wf); err != nil {
		t.Fatal(err)
	}
	wf.Namespace = ns
	return &wf
}

func (e *env) pod(t *testing.T, ns, name string) (*corev1.Pod, error) {
	var p corev1.Pod
	err := e.k8s.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &p)
	return &p, err
}

// bind assigns a pod to a node, as the scheduler would (envtest runs none).
func (e *env) bind(t *testing.T, p *corev1.Pod, node string) {
	t.Helper()
	b := &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace}, Target: corev1.ObjectReference{Kind: "Node", Name: node}}
	if err := e.k8s.SubResource("binding").Create(context.Background(), p, b); err != nil {
		t.Fatalf("binding %s to %s: %v", p.Name, node, err)
	}
}

// finish sets a pod's phase as the kubelet would.
func (e *env) finish(t *testing.T, p *corev1.Pod, phase corev1.PodPhase, exit int32) {
	t.Helper()
	e.setPodStatus(t, p, "setting "+string(phase), func(st *corev1.PodStatus) {
		st.Phase = phase
		st.ContainerStatuses = []corev1.ContainerStatus{{Name: "main", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: exit, Reason: "Completed"}}}}
	})
}

// setPodStatus changes a pod's status with set, as its kubelet would, failing t with
// what it was doing if it cannot.
func (e *env) setPodStatus(t *testing.T, p *corev1.Pod, what string, set func(*corev1.PodStatus)) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := e.pod(t, p.Namespace, p.Name)
		if err != nil {
			return err
		}
		set(&cur.Status)
		return e.k8s.Status().Update(context.Background(), cur)
	})
	if err != nil {
		t.Fatalf("%s of pod %s: %v", what, p.Name, err)
	}
}

func (e *env) workflow(ns, name string) (*v1alpha1.Workflow, error) {
	var wf v1alpha1.Workflow
	err := e.k8s.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, &wf)
	return &wf, err
}

func (e *env) waitPod(t *testing.T, ns, name string) *corev1.Pod {
	t.Helper()
	var p *corev1.Pod
	eventually(t, 20*time.Second, "pod "+name+" created", func() (err error) {
		p, err = e.pod(t, ns, name)
		return err
	})
	return p
}

func (e *env) events(ns, reason string) []string {
	var evs corev1.EventList
	_ = e.k8s.List(context.Background(), &evs, client.InNamespace(ns))
	var out []string
	for _, ev := range evs.Items {
		if ev.Reason == reason {
			out = append(out, ev.Message)
		}
	}
	return out
}

// The controller runs a workflow end to end on a real API server: finalizer, streams,
// configuration Secret, pods created in placement order with their affinities, a failed
// instance retried, status counted from pods and the NATS metadata, the TTL removing the
// data, and deletion removing the rest.
func TestWorkflowLifecycle(t *testing.T) {
	e := startEnv(t)
	ctx := context.Background()
	ns := e.namespace(t, "lifecycle")
	if err := e.k8s.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s3", Namespace: ns},
		Data: map[string][]byte{"accessKey": []byte("AK"), "secretKey": []byte("SK")}}); err != nil {
		t.Fatal(err)
	}
	wf := workflowFrom(t, ns, pipeline)
	if err := e.k8s.Create(ctx, wf); err != nil {
		t.Fatal(err)
	}
	names := wfmeta.NamesForWorkflow(ns, wf.Name, string(wf.UID))

	// Provisioning: finalizer, stream, bucket, Secret with limited credentials.
	eventually(t, 20*time.Second, "workflow Ready", func() error {
		got, err := e.workflow(ns, "pipe")
		if err != nil {
			return err
		}
		if !meta.IsStatusConditionTrue(got.Status.Conditions, v1alpha1.ConditionReady) {
			return fmt.Errorf("conditions %+v", got.Status.Conditions)
		}
		if len(got.Finalizers) != 1 || got.Finalizers[0] != v1alpha1.Finalizer {
			return fmt.Errorf("finalizers %v", got.Finalizers)
		}
		if got.Status.ObservedGeneration != got.Generation {
			return fmt.Errorf("observedGeneration %d, generation %d", got.Status.ObservedGeneration, got.Generation)
		}
		return nil
	})
	if _, err := e.js.Stream(ctx, names.Stream); err != nil {
		t.Fatalf("stream %s: %v", names.Stream, err)
	}
	var sec corev1.Secret
	if err := e.k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: podconfig.SecretName("pipe")}, &sec); err != nil {
		t.Fatal(err)
	}
	if !metav1.IsControlledBy(&sec, wf) {
		t.Error("the configuration Secret is not owned by the Workflow (it would outlive it)")
	}
	var storage podconfig.Storage
	if err := json.Unmarshal(sec.Data[v1alpha1.SecretKeyStorage], &storage); err != nil {
		t.Fatal(err)
	}
	if storage.Endpoint != "minio.example:9000" || storage.Bucket != "results" || storage.AccessKey != "AK" {
		t.Errorf("storage in the Secret: %+v", storage)
	}
	if !strings.Contains(string(sec.Data[v1alpha1.SecretKeyNATSCreds]), "BEGIN NATS USER JWT") || string(sec.Data[v1alpha1.SecretKeyNATSInbox]) != names.Inbox {
		t.Errorf("NATS credentials or inbox missing from the Secret")
	}

	// The producer comes first; the consumer waits until it is bound to a node.
	prod := e.waitPod(t, ns, "pipe-produce-0")
	if !metav1.IsControlledBy(prod, wf) || prod.Labels[v1alpha1.LabelStep] != "produce" || prod.Spec.InitContainers[0].Name != inject.SidecarName {
		t.Fatalf("producer pod not owned, labelled and injected: %+v", prod.ObjectMeta)
	}
	if _, err := e.pod(t, ns, "pipe-consume-0"); !apierrors.IsNotFound(err) {
		t.Fatalf("consumer created before its streaming producer was placed (%v)", err)
	}
	e.bind(t, prod, "node-a")
	c0 := e.waitPod(t, ns, "pipe-consume-0")
	c1 := e.waitPod(t, ns, "pipe-consume-1")
	if c0.Spec.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("consumer restartPolicy %s; retries are the controller's", c0.Spec.RestartPolicy)
	}
	// The sidecar's drain gets the grace period it needs, unless the template says.
	if g := prod.Spec.TerminationGracePeriodSeconds; g == nil || *g != v1alpha1.DrainGracePeriodSeconds {
		t.Errorf("producer terminationGracePeriodSeconds %v, want %d", g, v1alpha1.DrainGracePeriodSeconds)
	}
	if g := c0.Spec.TerminationGracePeriodSeconds; g == nil || *g != 45 {
		t.Errorf("consumer terminationGracePeriodSeconds %v, want the template's 45", g)
	}
	aff := c0.Spec.Affinity
	if aff == nil || aff.PodAffinity == nil || len(aff.PodAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 1 {
		t.Fatalf("consumer has no preferred affinity to its NoUpdate producer: %+v", aff)
	}
	term := aff.PodAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0]
	if term.Weight != 100 || term.PodAffinityTerm.LabelSelector.MatchLabels[v1alpha1.LabelStep] != "produce" || term.PodAffinityTerm.TopologyKey != "kubernetes.io/hostname" {
		t.Errorf("consumer affinity term %+v", term)
	}

	// Files and counters recorded by the sidecars show in status.
	kv, err := e.js.KeyValue(ctx, names.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []wfmeta.FileMeta{
		{Path: "numbers", Size: 292, Home: "pipe-produce-0"},
		{Path: "result.txt", Size: 10, Home: "pipe-consume-0", URI: "s3://results/result.txt", SHA256: "ab"},
	} {
		b, _ := json.Marshal(m)
		if _, err := kv.Put(ctx, wfmeta.FileKey(m.Path), b); err != nil {
			t.Fatal(err)
		}
	}
	for uid, st := range map[string]wfmeta.PodStats{
		"uid-c0": {Pod: "pipe-consume-0", Host: "node-b", BytesReceived: 292, MemoryBytes: 300, DiskBytes: 4096, SpilledBytes: 1024},
		"uid-c1": {Pod: "pipe-consume-1", Host: "node-c", BytesReceived: 250, MemoryBytes: 250, ReleasedBytes: 250},
	} {
		b, _ := json.Marshal(st)
		if _, err := kv.Put(ctx, wfmeta.StatsKey(uid), b); err != nil {
			t.Fatal(err)
		}
	}

	e.finish(t, prod, corev1.PodSucceeded, 0)
	e.finish(t, c0, corev1.PodSucceeded, 0)
	e.finish(t, c1, corev1.PodFailed, 3)
	retry := e.waitPod(t, ns, "pipe-consume-1-r1")
	if retry.Annotations[v1alpha1.AnnotationAttempt] != "1" {
		t.Errorf("retry pod attempt %q", retry.Annotations[v1alpha1.AnnotationAttempt])
	}
	// The retry prefers the node holding its committed input bytes.
	if na := retry.Spec.Affinity; na == nil || na.NodeAffinity == nil && na.PodAffinity == nil {
		t.Errorf("retry pod has no placement: %+v", na)
	}
	e.bind(t, retry, "node-b")
	e.finish(t, retry, corev1.PodSucceeded, 0)

	eventually(t, 20*time.Second, "workflow Succeeded, data removed after ttl 0", func() error {
		got, err := e.workflow(ns, "pipe")
		if err != nil {
			return err
		}
		st := got.Status
		if st.Phase != v1alpha1.WorkflowSucceeded || st.Progress != "2/2" {
			return fmt.Errorf("phase %s progress %s", st.Phase, st.Progress)
		}
		if !meta.IsStatusConditionTrue(st.Conditions, v1alpha1.ConditionDataRemoved) {
			return fmt.Errorf("DataRemoved not True: %+v", st.Conditions)
		}
		if st.Files.Committed != 2 || st.Files.BytesWritten != 302 || st.Files.BytesStreamed != 542 || st.Files.BytesStored != 10 ||
			len(st.Outputs) != 1 || st.Outputs[0].URI != "s3://results/result.txt" {
			return fmt.Errorf("files %+v outputs %+v", st.Files, st.Outputs)
		}
		if wantNodes := []v1alpha1.NodeStoreStatus{
			{Name: "node-b", MemoryBytes: 300, DiskBytes: 4096, SpilledBytes: 1024, ReceivedBytes: 292},
			{Name: "node-c", MemoryBytes: 250, ReleasedBytes: 250, ReceivedBytes: 250},
		}; !slices.Equal(st.Nodes, wantNodes) {
			return fmt.Errorf("nodes %+v, want %+v", st.Nodes, wantNodes)
		}
		want := map[string]v1alpha1.StepStatus{
			"produce": {Name: "produce", Phase: v1alpha1.StepSucceeded, Succeeded: 1,
				Instances: []v1alpha1.InstanceStatus{{Instance: 0, Pod: "pipe-produce-0", Node: "node-a", Phase: corev1.PodSucceeded, Attempts: 1}}},
			"consume": {Name: "consume", Phase: v1alpha1.StepSucceeded, Succeeded: 2, Failed: 1,
				Instances: []v1alpha1.InstanceStatus{
					{Instance: 0, Pod: "pipe-consume-0", Phase: corev1.PodSucceeded, Attempts: 1},
					{Instance: 1, Pod: "pipe-consume-1-r1", Node: "node-b", Phase: corev1.PodSucceeded, Attempts: 2},
				}},
		}
		for _, s := range st.Steps {
			// Where each instance ran: the latest attempt's pod and node.
			if !equality.Semantic.DeepEqual(s, want[s.Name]) {
				return fmt.Errorf("step %+v, want %+v", s, want[s.Name])
			}
		}
		return nil
	})
	if _, err := e.js.Stream(ctx, names.Stream); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("stream after the TTL: %v, want not found", err)
	}
	if ev := e.events(ns, ReasonRetrying); len(ev) != 1 || !strings.Contains(ev[0], "consume instance 1") {
		t.Errorf("Retrying events %q", ev)
	}
	if ev := e.events(ns, ReasonSucceeded); len(ev) != 1 {
		t.Errorf("Succeeded events %q", ev)
	}
	// Where each instance ran, once it was bound (consume instance 0 never was).
	ev := e.events(ns, ReasonScheduled)
	for _, want := range []string{"step produce instance 0: pod pipe-produce-0 on node node-a", "step consume instance 1: pod pipe-consume-1-r1 on node node-b"} {
		if !slices.ContainsFunc(ev, func(m string) bool { return strings.Contains(m, want) }) {
			t.Errorf("Scheduled events %q lack %q", ev, want)
		}
	}
	if slices.ContainsFunc(ev, func(m string) bool { return strings.Contains(m, "pipe-consume-0") }) {
		t.Errorf("Scheduled events %q name pipe-consume-0, never bound", ev)
	}

	// Deletion: the finalizer goes, the Workflow goes.
	if err := e.k8s.Delete(ctx, wf); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "workflow deleted", func() error {
		if _, err := e.workflow(ns, "pipe"); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there (%w)", err)
		}
		return nil
	})
}

// An instance failing beyond its backoffLimit fails the workflow, stops its other pods,
// and deleting a running workflow removes its stream.
func TestStepFailureFailsWorkflow(t *testing.T) {
	e := startEnv(t)
	ctx := context.Background()
	ns := e.namespace(t, "failure")
	wf := workflowFrom(t, ns, `
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: fails}
spec:
  steps:
  - name: a
    placement: None
    template: {spec: {containers: [{name: main, image: busybox}]}}
    outputs: [{path: x, fire: NoUpdate, commit: {rule: OnClose}}]
  - name: b
    placement: None
    template: {spec: {containers: [{name: main, image: busybox}]}}
    inputs: [x]
`)
	if err := e.k8s.Create(ctx, wf); err != nil {
		t.Fatal(err)
	}
	a := e.waitPod(t, ns, "fails-a-0")
	e.waitPod(t, ns, "fails-b-0") // placement None: created together
	e.finish(t, a, corev1.PodFailed, 1)
	eventually(t, 20*time.Second, "workflow Failed", func() error {
		got, err := e.workflow(ns, "fails")
		if err != nil {
			return err
		}
		c := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionFailed)
		if got.Status.Phase != v1alpha1.WorkflowFailed || c == nil || !strings.Contains(c.Message, "step a instance 0 failed") || !strings.Contains(c.Message, "exited 1") {
			return fmt.Errorf("phase %s, Failed condition %+v", got.Status.Phase, c)
		}
		return nil
	})
	eventually(t, 20*time.Second, "the waiting consumer stopped", func() error {
		p, err := e.pod(t, ns, "fails-b-0")
		if apierrors.IsNotFound(err) || (err == nil && !p.DeletionTimestamp.IsZero()) {
			return nil
		}
		return fmt.Errorf("consumer pod still running (%w)", err)
	})
	if _, err := e.pod(t, ns, "fails-a-0-r1"); !apierrors.IsNotFound(err) {
		t.Errorf("a step with backoffLimit 0 was retried (%v)", err)
	}
	names := wfmeta.NamesForWorkflow(ns, wf.Name, string(wf.UID))
	if err := e.k8s.Delete(ctx, wf); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "stream removed on deletion", func() error {
		if _, err := e.js.Stream(ctx, names.Stream); !errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("stream: %w", err)
		}
		return nil
	})
}

// A step's template that shares its pod's process namespace fails the Workflow with
// reason InvalidSpec naming the field, and no pod is made (issue 43, finding 5: every
// container would see the sidecar's process, which holds the workflow's credentials).
func TestTemplateSharingItsProcessNamespaceIsAnInvalidSpec(t *testing.T) {
	e := startEnv(t)
	ctx := context.Background()
	ns := e.namespace(t, "sharepid")
	wf := workflowFrom(t, ns, `
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: share}
spec:
  steps:
  - name: a
    template: {spec: {shareProcessNamespace: true, containers: [{name: main, image: busybox, command: [pwd]}]}}
    outputs: [{path: x, commit: {rule: OnClose}}]
`)
	if err := e.k8s.Create(ctx, wf); err != nil {
		t.Fatal(err)
	}
	e.waitInvalidSpec(t, ns, "share", "spec.steps[0].template.spec.shareProcessNamespace: Forbidden")
}

// A pod template field the API server keeps (templates are schemaless in the CRD) but a
// Pod would refuse, a mis-cased `workingdir` and `Command`, fails the Workflow with reason
// InvalidSpec naming the field at its full path and the spelling meant, instead of
// making pods without it; a permanent entry that no output declares is refused as well.
func TestMisspeltTemplateFieldIsAnInvalidSpec(t *testing.T) {
	e := startEnv(t)
	ctx := context.Background()
	ns := e.namespace(t, "misspelt")
	var obj map[string]any
	if err := yaml.Unmarshal([]byte(`
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: keys}
spec:
  steps:
  - name: a
    template: {spec: {containers: [{name: main, image: busybox, workingdir: /tmp, Command: [pwd]}]}}
    outputs: [{path: x, commit: {rule: OnClose}}]
`), &obj); err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: obj}
	u.SetNamespace(ns)
	if err := e.k8s.Create(ctx, u); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "InvalidSpec", func() error {
		got, err := e.workflow(ns, "keys")
		if err != nil {
			return err
		}
		c := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionFailed)
		if c == nil || c.Reason != ReasonInvalidSpec ||
			!strings.Contains(c.Message, `spec.steps[0].template.spec.containers[0].workingdir: Invalid value: unknown field (field names are case-sensitive: did you mean "workingDir"?)`) ||
			!strings.Contains(c.Message, `spec.steps[0].template.spec.containers[0].Command`) {
			return fmt.Errorf("Failed condition %+v", c)
		}
		return nil
	})
	var pods corev1.PodList
	if err := e.k8s.List(ctx, &pods, client.InNamespace(ns)); err != nil || len(pods.Items) != 0 {
		t.Errorf("%d pods created for a workflow with a misspelt template field (%v)", len(pods.Items), err)
	}
	perm := workflowFrom(t, ns, `
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: perm}
spec:
  permanent: [results]
  steps:
  - name: a
    template: {spec: {containers: [{name: main, image: busybox}]}}
`)
	if err := e.k8s.Create(ctx, perm); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "InvalidSpec", func() error {
		got, err := e.workflow(ns, "perm")
		if err != nil {
			return err
		}
		c := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionFailed)
		if c == nil || c.Reason != ReasonInvalidSpec || !strings.Contains(c.Message, `spec.permanent[0]: Invalid value: "results": no step's outputs declare`) {
			return fmt.Errorf("Failed condition %+v", c)
		}
		return nil
	})
}

// A spec the CRD accepts but the semantics reject (two steps writing one file under
// different rules) fails with reason InvalidSpec and creates nothing.
func TestInvalidSpecIsReported(t *testing.T) {
	e := startEnv(t)
	ctx := context.Background()
	ns := e.namespace(t, "invalid")
	wf := workflowFrom(t, ns, `
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: bad}
spec:
  steps:
  - name: a
    template: {spec: {containers: [{name: main, image: busybox}]}}
    outputs: [{path: x, commit: {rule: OnClose}}]
  - name: b
    template: {spec: {containers: [{name: main, image: busybox}]}}
    outputs: [{path: x, commit: {rule: OnTermination}}]
`)
	if err := e.k8s.Create(ctx, wf); err != nil {
		t.Fatal(err)
	}
	e.waitInvalidSpec(t, ns, "bad", "spec.steps")
}

// waitInvalidSpec waits until Workflow ns/name has failed with reason InvalidSpec and a
// message holding want, and checks that no pod was made in ns.
func (e *env) waitInvalidSpec(t *testing.T, ns, name, want string) {
	t.Helper()
	eventually(t, 20*time.Second, "InvalidSpec", func() error {
		got, err := e.workflow(ns, name)
		if err != nil {
			return err
		}
		c := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionFailed)
		if c == nil || c.Reason != ReasonInvalidSpec || !strings.Contains(c.Message, want) {
			return fmt.Errorf("Failed condition %+v", c)
		}
		return nil
	})
	var pods corev1.PodList
	if err := e.k8s.List(context.Background(), &pods, client.InNamespace(ns)); err != nil || len(pods.Items) != 0 {
		t.Errorf("%d pods created for the invalid workflow %s (%v)", len(pods.Items), name, err)
	}
}
