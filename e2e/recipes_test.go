//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sluice-io/sluice/api/v1alpha1"
)

// The engines users run cannot run here (their modules or images are not reachable), so
// these specs create pods of the shape each engine creates, as its documentation shows —
// container names, init and wait containers, volumes, restart policy, labels — with a
// shell in place of the engine's own binaries, and check that streaming works through the
// webhook in each shape. docs/recipes.md has each engine's real configuration.

// recipeWorkflow is the Workflow every recipe runs: a producer streams numbers.txt
// (NoUpdate) to a consumer, whose instances each write their sum.
const recipeWorkflow = `
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: recipe}
spec:
  volume: {mountPath: /data}
  permanent: ["sum-*.txt"]
  steps:
  - name: produce
    outputs: [{path: numbers.txt, commit: {rule: OnClose}, fire: NoUpdate}]
  - name: consume
    replicas: REPLICAS
    inputs: [numbers.txt]
    outputs: [{path: "sum-*.txt", commit: {rule: OnClose}}]
`

const (
	produceScript = `seq 1 200000 > /data/numbers.txt`
	consumeScript = `awk '{s += $1} END {print s}' /data/numbers.txt > /data/sum-${SLUICE_INSTANCE:-0}.txt`
	wantSum       = "20000100000\n"
)

// sluiceMeta is the label and annotations that put a pod into step of the Workflow
// "recipe", merged with the engine's own.
func sluiceMeta(step string, labels, annotations map[string]string) metav1.ObjectMeta {
	m := metav1.ObjectMeta{Labels: map[string]string{v1alpha1.LabelInject: "true"},
		Annotations: map[string]string{v1alpha1.AnnotationWorkflow: "recipe", v1alpha1.AnnotationStep: step}}
	for k, v := range labels {
		m.Labels[k] = v
	}
	for k, v := range annotations {
		m.Annotations[k] = v
	}
	return m
}

func shell(name, script string, mounts ...corev1.VolumeMount) corev1.Container {
	return corev1.Container{Name: name, Image: image, ImagePullPolicy: pullPol,
		Command: []string{"sh", "-c", "set -eu; " + script}, VolumeMounts: mounts}
}

// argoPod is the pod Argo Workflows' emissary executor runs for a DAG task: the init
// container (argoexec init), the main container wrapped by argoexec emissary and the wait
// container (argoexec wait) sharing the var-run-argo emptyDir, restartPolicy Never, the
// template's metadata (labels, annotations) on the pod. Here the wait container waits for
// main's exit marker, as argoexec wait waits for main's exit code file.
func argoPod(ns, step, script string) client.Object {
	runArgo := corev1.VolumeMount{Name: "var-run-argo", MountPath: "/var/run/argo"}
	meta := sluiceMeta(step, map[string]string{"workflows.argoproj.io/workflow": "recipe", "workflows.argoproj.io/completed": "false"},
		map[string]string{"workflows.argoproj.io/node-name": "recipe." + step, "workflows.argoproj.io/node-id": "recipe-" + step})
	meta.Namespace, meta.Name = ns, "recipe-"+step
	return &corev1.Pod{ObjectMeta: meta, Spec: corev1.PodSpec{
		RestartPolicy:  corev1.RestartPolicyNever,
		InitContainers: []corev1.Container{shell("init", "mkdir -p /var/run/argo/ctr/main", runArgo)},
		Containers: []corev1.Container{
			shell("wait", "while [ ! -e /var/run/argo/ctr/main/exitcode ]; do sleep 0.2; done", runArgo),
			shell("main", script+"; echo 0 > /var/run/argo/ctr/main/exitcode", runArgo),
		},
		Volumes: []corev1.Volume{{Name: "var-run-argo", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
	}}
}

// nextflowPod is the pod Nextflow's k8s executor runs for a task: one container named
// after the task, the task's work directory (on the shared work volume) as workingDir,
// running .command.run, restartPolicy Never, the nextflow.io labels, and the labels and
// annotations of the process's pod directive.
func nextflowPod(ns, step, script string) client.Object {
	work := corev1.VolumeMount{Name: "vol-1", MountPath: "/workspace"}
	meta := sluiceMeta(step, map[string]string{"nextflow.io/app": "nextflow", "nextflow.io/runName": "happy-turing",
		"nextflow.io/taskName": step + "_1", "nextflow.io/processName": step, "nextflow.io/sessionId": "uuid-0ab1"}, nil)
	meta.Namespace, meta.Name = ns, "nf-"+step
	c := shell("nf-"+step, "mkdir -p /workspace/work/ab/cdef && printf '%s\\n' '"+strings.ReplaceAll(script, "'", `'\''`)+"' > /workspace/work/ab/cdef/.command.run && cd /workspace/work/ab/cdef && sh -ue .command.run", work)
	return &corev1.Pod{ObjectMeta: meta, Spec: corev1.PodSpec{
		RestartPolicy: corev1.RestartPolicyNever,
		Containers:    []corev1.Container{c},
		Volumes:       []corev1.Volume{{Name: "vol-1", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
	}}
}

// snakemakeJob is the Job Snakemake's Kubernetes executor plugin submits per rule: one
// container "snakemake" running the job's command through a shell in the workdir volume,
// restartPolicy Never, backoffLimit 0, the app: snakemake label.
func snakemakeJob(ns, step, script string) client.Object {
	workdir := corev1.VolumeMount{Name: "workdir", MountPath: "/workdir"}
	meta := sluiceMeta(step, map[string]string{"app": "snakemake"}, nil)
	c := shell("snakemake", "cd /workdir && "+script, workdir)
	c.WorkingDir = "/workdir"
	return &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "snakejob-" + step, Labels: map[string]string{"app": "snakemake"}},
		Spec: batchv1.JobSpec{BackoffLimit: ptrTo(int32(0)), Template: corev1.PodTemplateSpec{ObjectMeta: meta, Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{c},
			Volumes:       []corev1.Volume{{Name: "workdir", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
		}}}}
}

// airflowPod is the pod Airflow's KubernetesPodOperator runs with do_xcom_push: the
// container "base" and the "airflow-xcom-sidecar" sharing the xcom emptyDir at
// /airflow/xcom, restartPolicy Never, the operator's labels. Airflow stops the sidecar
// once it has read /airflow/xcom/return.json; here it stops itself then.
func airflowPod(ns, step, script string) client.Object {
	xcom := corev1.VolumeMount{Name: "xcom", MountPath: "/airflow/xcom"}
	meta := sluiceMeta(step, map[string]string{"dag_id": "recipe", "task_id": step, "run_id": "manual__2026-01-01",
		"kubernetes_pod_operator": "True", "try_number": "1"}, nil)
	meta.Namespace, meta.Name = ns, "recipe-"+step+"-af"
	return &corev1.Pod{ObjectMeta: meta, Spec: corev1.PodSpec{
		RestartPolicy: corev1.RestartPolicyNever,
		Containers: []corev1.Container{
			shell("base", script+`; echo '{"ok": true}' > /airflow/xcom/return.json`, xcom),
			shell("airflow-xcom-sidecar", `trap "exit 0" INT; while [ ! -e /airflow/xcom/return.json ]; do sleep 0.2; done`, xcom),
		},
		Volumes: []corev1.Volume{{Name: "xcom", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
	}}
}

// trainerJob is the Indexed Job a Job-based trainer runs (a Kubeflow TrainJob's or
// PyTorchJob's workers; JobSet creates one per replicated job): one container "pytorch"
// per worker with the rendezvous environment, completion index = worker rank = Sluice
// instance (the webhook reads the Job's completion index), restartPolicy Never.
func trainerJob(ns, step, script string, workers int32) client.Object {
	meta := sluiceMeta(step, map[string]string{"training.kubeflow.org/job-name": "recipe", "training.kubeflow.org/replica-type": "worker"}, nil)
	c := shell("pytorch", script)
	c.Env = []corev1.EnvVar{{Name: "MASTER_ADDR", Value: "recipe-master-0"}, {Name: "MASTER_PORT", Value: "23456"},
		{Name: "WORLD_SIZE", Value: fmt.Sprint(workers)}, {Name: "PET_NPROC_PER_NODE", Value: "1"}}
	return &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "recipe-" + step + "-worker"},
		Spec: batchv1.JobSpec{CompletionMode: ptrTo(batchv1.IndexedCompletion), Completions: ptrTo(workers), Parallelism: ptrTo(workers),
			BackoffLimit: ptrTo(int32(0)), Template: corev1.PodTemplateSpec{ObjectMeta: meta, Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers:    []corev1.Container{c},
			}}}}
}

// plainPod is a bare pod with one container, as a data-preparation step before a trainer.
func plainPod(ns, step, script string) client.Object {
	meta := sluiceMeta(step, nil, nil)
	meta.Namespace, meta.Name = ns, "prep-"+step
	return &corev1.Pod{ObjectMeta: meta, Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{shell("prep", script)}}}
}

// waitDone waits for a pod to succeed or a Job to complete.
func waitDone(ctx context.Context, o client.Object) {
	GinkgoHelper()
	switch obj := o.(type) {
	case *batchv1.Job:
		Eventually(jobSucceeded(ctx, obj)).WithContext(ctx).WithTimeout(5*time.Minute).WithPolling(2*time.Second).Should(BeTrue(), "job %s", obj.Name)
	case *corev1.Pod:
		Eventually(func() (corev1.PodPhase, error) {
			var p corev1.Pod
			err := k8s.Get(ctx, client.ObjectKeyFromObject(obj), &p)
			if p.Status.Phase == corev1.PodFailed {
				return p.Status.Phase, StopTrying("pod " + obj.Name + " failed")
			}
			return p.Status.Phase, err
		}).WithContext(ctx).WithTimeout(5*time.Minute).WithPolling(2*time.Second).Should(Equal(corev1.PodSucceeded), "pod %s", obj.Name)
	}
}

var _ = Describe("Recipes: pods of the shape other engines create", func() {
	shapes := []struct {
		engine   string
		replicas int32
		pod      func(ns, step, script string) client.Object
		consumer func(ns, step, script string) client.Object
	}{
		{engine: "argo", replicas: 1, pod: argoPod},
		{engine: "nextflow", replicas: 1, pod: nextflowPod},
		{engine: "snakemake", replicas: 1, pod: snakemakeJob},
		{engine: "airflow", replicas: 1, pod: airflowPod},
		{engine: "kubeflow", replicas: 2, pod: plainPod, consumer: func(ns, step, script string) client.Object { return trainerJob(ns, step, script, 2) }},
	}
	for _, s := range shapes {
		It("streams between two "+s.engine+"-shaped pods through the webhook", func(ctx SpecContext) {
			ns := namespace(ctx, "recipe-"+s.engine)
			wf := loadWorkflowYAML(strings.Replace(recipeWorkflow, "REPLICAS", fmt.Sprint(s.replicas), 1))
			wf.Namespace = ns
			Expect(k8s.Create(ctx, wf)).To(Succeed())
			consumer := s.pod
			if s.consumer != nil {
				consumer = s.consumer
			}
			// The consumer first: its open waits for the producer's file, then streams.
			c, p := consumer(ns, "consume", consumeScript), s.pod(ns, "produce", produceScript)
			Expect(k8s.Create(ctx, c)).To(Succeed())
			Expect(k8s.Create(ctx, p)).To(Succeed())
			waitDone(ctx, p)
			waitDone(ctx, c)
			waitSucceeded(ctx, ns, wf.Name, 3*time.Minute)
			for i := range s.replicas {
				Expect(string(objectAt(ctx, outputURI(ctx, wf, fmt.Sprintf("sum-%d.txt", i))))).To(Equal(wantSum), "instance %d's sum", i)
			}
		})
	}
})
