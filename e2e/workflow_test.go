//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"crypto/md5"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/controller/inject"
	"github.com/sluice-io/sluice/internal/podconfig"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

var _ = Describe("Workflows", func() {
	It("runs examples/wordcount, stores its result byte for byte and removes everything when deleted", func(ctx SpecContext) {
		ns := namespace(ctx, "wordcount")
		wf := loadWorkflow(filepath.Join(repoRoot, "examples/wordcount/workflow.yaml"))
		wf.Namespace = ns
		corpus := corpusConfigMap(ns)
		Expect(k8s.Create(ctx, corpus)).To(Succeed())
		// The example counts the words of Go sources; on a cluster the corpus comes from a
		// ConfigMap mounted into split.
		for i := range wf.Spec.Steps {
			spec := &wf.Spec.Steps[i].Template.Spec
			for j := range spec.Containers {
				spec.Containers[j].Image, spec.Containers[j].ImagePullPolicy = image, pullPol
			}
			if wf.Spec.Steps[i].Name == "split" {
				spec.Volumes = append(spec.Volumes, corev1.Volume{Name: "corpus", VolumeSource: corev1.VolumeSource{
					ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: corpus.Name}}}})
				c := &spec.Containers[0]
				c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "corpus", MountPath: "/corpus", ReadOnly: true})
				c.Env = append(c.Env, corev1.EnvVar{Name: "CORPUS", Value: "/corpus"})
			}
		}
		Expect(k8s.Create(ctx, wf)).To(Succeed())
		waitSucceeded(ctx, ns, wf.Name, 10*time.Minute)

		var got v1alpha1.Workflow
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(wf), &got)).To(Succeed())
		Expect(got.Status.Outputs).To(HaveLen(1))
		Expect(got.Status.Outputs[0].Path).To(Equal("result/wordcount.txt"))
		Expect(objectAt(ctx, got.Status.Outputs[0].URI)).To(Equal(wordCount(corpus)),
			"result/wordcount.txt in object storage differs from the word count of the corpus")

		By("deleting the Workflow")
		var cfgSecret corev1.Secret
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: podconfig.SecretName(wf.Name)}, &cfgSecret)).To(Succeed())
		Expect(k8s.Delete(ctx, wf)).To(Succeed())
		Eventually(func() bool { return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(wf), &got)) }).
			WithContext(ctx).WithTimeout(2*time.Minute).Should(BeTrue(), "the Workflow's finalizer did not finish")
		Eventually(func(g Gomega) {
			var pods corev1.PodList
			g.Expect(k8s.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{v1alpha1.LabelWorkflow: wf.Name})).To(Succeed())
			g.Expect(pods.Items).To(BeEmpty(), "step pods left")
			err := k8s.Get(ctx, client.ObjectKeyFromObject(&cfgSecret), &corev1.Secret{})
			g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "configuration Secret left (%v)", err)
		}).WithContext(ctx).WithTimeout(2 * time.Minute).Should(Succeed())
		// The workflow's own credentials, which have not expired, are revoked: the server
		// refuses them (its stream and KV bucket went with it).
		dir, cfg := loadSecret(&cfgSecret)
		addr := forward(ctx, system, "app.kubernetes.io/component=nats", 4222)
		_, err := dialNATS(ctx, addr, nats.UserCredentials(filepath.Join(dir, v1alpha1.SecretKeyNATSCreds)),
			nats.CustomInboxPrefix(cfg.NATSInbox), nats.NoReconnect())
		Expect(err).To(MatchError(ContainSubstring("Authorization Violation")), "the deleted workflow's NATS credentials were not revoked")
	})

	It("streams between two labelled plain Jobs through the webhook", func(ctx SpecContext) {
		ns := namespace(ctx, "jobs")
		wf := loadWorkflowYAML(`
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: jobs}
spec:
  volume: {mountPath: /work}
  permanent: [numbers.txt, sum.txt]
  steps:
  - name: writer
    outputs: [{path: numbers.txt, commit: {rule: OnClose}, fire: NoUpdate}]
  - name: reader
    inputs: [numbers.txt]
    outputs: [{path: sum.txt, commit: {rule: OnClose}}]
`)
		wf.Namespace = ns
		Expect(k8s.Create(ctx, wf)).To(Succeed())
		// The reader starts first: its open() waits until the writer creates the file,
		// then it reads while the writer writes.
		runJobs(ctx,
			labelledJob(ns, "reader", `awk '{s += $1} END {print s}' /work/numbers.txt > /work/sum.txt`),
			labelledJob(ns, "writer", `seq 1 1000000 > /work/numbers.txt`))
		var want bytes.Buffer
		for i := 1; i <= 1000000; i++ {
			fmt.Fprintf(&want, "%d\n", i)
		}
		Expect(objectAt(ctx, outputURI(ctx, wf, "numbers.txt"))).To(Equal(want.Bytes()), "numbers.txt in object storage")
		Expect(string(objectAt(ctx, outputURI(ctx, wf, "sum.txt")))).To(Equal("500000500000\n"), "the reader's sum")
	})

	It("leaves a Workflow Succeeded when a labelled Job's pod fails and the Job's retry succeeds", func(ctx SpecContext) {
		ns := namespace(ctx, "jobretry")
		wf := loadWorkflowYAML(`
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: jobs}
spec:
  volume: {mountPath: /work}
  permanent: [out.txt]
  steps:
  - name: flaky
    outputs: [{path: out.txt, commit: {rule: OnClose}}]
`)
		wf.Namespace = ns
		Expect(k8s.Create(ctx, wf)).To(Succeed())
		// The first attempt leaves a marker in a path no rule governs (a plain file of the
		// node store) and fails; the Job's retry finds it and succeeds.
		j := labelledJob(ns, "flaky", `if [ -e /work/attempted ]; then echo ok > /work/out.txt; else touch /work/attempted; exit 3; fi`)
		j.Spec.BackoffLimit = ptrTo(int32(1))
		runJobs(ctx, j)
		waitSucceeded(ctx, ns, wf.Name, 3*time.Minute)
		var got v1alpha1.Workflow
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(wf), &got)).To(Succeed())
		Expect(meta.IsStatusConditionTrue(got.Status.Conditions, v1alpha1.ConditionFailed)).To(BeFalse(), "Failed=True on a Succeeded Workflow: %+v", got.Status.Conditions)
		Expect(got.Status.Steps).To(HaveLen(1))
		Expect(got.Status.Steps[0].Failed).To(BeEquivalentTo(1), "the failed first attempt is counted")
		Expect(string(objectAt(ctx, outputURI(ctx, wf, "out.txt")))).To(Equal("ok\n"))
	})

	It("streams between two labelled Jobs in direct mode, without FUSE in their pods", func(ctx SpecContext) {
		ns := namespace(ctx, "direct")
		wf := loadWorkflowYAML(`
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: direct}
spec:
  volume: {mountPath: /work}
  permanent: [sum.txt]
  steps:
  - name: writer
    outputs: [{path: numbers.txt, commit: {rule: OnClose}}]
  - name: reader
    inputs: [numbers.txt]
    outputs: [{path: sum.txt, commit: {rule: OnClose}}]
`)
		wf.Namespace = ns
		Expect(k8s.Create(ctx, wf)).To(Succeed())
		// A direct volume has no blocking open: the reader waits for the committed file
		// itself, as it would for a file on shared storage.
		runJobs(ctx,
			labelledJobFor(ns, "direct", "reader", v1alpha1.ModeDirect,
				`until [ -f /work/numbers.txt ]; do sleep 0.2; done; awk '{s += $1} END {print s}' /work/numbers.txt > /work/sum.txt`),
			labelledJobFor(ns, "direct", "writer", v1alpha1.ModeDirect, `seq 1 100000 > /work/numbers.txt`))
		Expect(string(objectAt(ctx, outputURI(ctx, wf, "sum.txt")))).To(Equal("5000050000\n"), "the reader's sum")
	})

	It("completes a workflow whose consumer's sidecar is killed mid-stream, the consumer reading on", func(ctx SpecContext) {
		ns := namespace(ctx, "kill")
		wf := loadWorkflowYAML(fmt.Sprintf(`
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: slow}
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
          command: [sh, -c, 'i=0; while [ $i -lt 30 ]; do seq $((i*10000+1)) $((i*10000+10000)); sleep 1; i=$((i+1)); done > "$SLUICE_DIR/numbers.txt"']
    outputs: [{path: numbers.txt, commit: {rule: OnClose}, fire: NoUpdate}]
  - name: consume
    backoffLimit: 3
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

		By("waiting for the consumer to read while the producer writes")
		var consumer corev1.Pod
		Eventually(func(g Gomega) {
			var pods corev1.PodList
			g.Expect(k8s.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{v1alpha1.LabelStep: "consume"})).To(Succeed())
			g.Expect(pods.Items).NotTo(BeEmpty())
			consumer = pods.Items[0]
			g.Expect(containerRunning(&consumer, "consume")).To(BeTrue(), "consumer app not running yet")
		}).WithContext(ctx).WithTimeout(3 * time.Minute).WithPolling(time.Second).Should(Succeed())
		Expect(workflowPhase(ctx, ns, wf.Name)()).To(Equal(v1alpha1.WorkflowRunning), "the producer finished before the kill")

		By("killing the consumer's sidecar")
		killSidecar(&consumer)
		Eventually(func(g Gomega) {
			var p corev1.Pod
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(&consumer), &p)).To(Succeed())
			restarted := false
			for _, s := range p.Status.InitContainerStatuses {
				if s.Name == inject.SidecarName && s.RestartCount > 0 {
					restarted = true
				}
			}
			g.Expect(restarted || p.Status.Phase == corev1.PodFailed).To(BeTrue(), "the sidecar was not killed")
		}).WithContext(ctx).WithTimeout(time.Minute).Should(Succeed())

		waitSucceeded(ctx, ns, wf.Name, 5*time.Minute)
		Expect(string(objectAt(ctx, outputURI(ctx, wf, "sum.txt")))).To(Equal(strconv.Itoa(300000*300001/2)+"\n"), "the consumer's sum")

		By("checking that the consumer read on through the restart, without a retry")
		var pods corev1.PodList
		Expect(k8s.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{v1alpha1.LabelStep: "consume"})).To(Succeed())
		Expect(pods.Items).To(HaveLen(1), "the consumer was retried")
		Expect(pods.Items[0].Name).To(Equal(consumer.Name))
		Expect(pods.Items[0].Status.Phase).To(Equal(corev1.PodSucceeded))
	})

	It("commits a retried instance's outputs from the attempt that succeeded, withdrawing what the failed one committed", func(ctx SpecContext) {
		ns := namespace(ctx, "retry")
		wf := loadWorkflowYAML(fmt.Sprintf(`
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: retry}
spec:
  permanent: [who.txt, closed.txt, seen.txt]
  steps:
  - name: write
    backoffLimit: 1
    template:
      spec:
        containers:
        - name: write
          image: %[1]s
          imagePullPolicy: %[2]s
          # The first attempt writes its outputs (closed.txt commits at its close), then
          # fails; the retry (pod -r1) writes them again and succeeds.
          command: [sh, -c, 'set -e; echo "$HOSTNAME" > "$SLUICE_DIR/closed.txt"; echo "$HOSTNAME" > "$SLUICE_DIR/who.txt"; case "$HOSTNAME" in *-r1) exit 0;; *) exit 3;; esac']
    outputs: [{path: who.txt, commit: {rule: OnTermination}}, {path: closed.txt, commit: {rule: OnClose}}]
  - name: read
    inputs: [who.txt, closed.txt]
    template:
      spec:
        containers:
        - name: read
          image: %[1]s
          imagePullPolicy: %[2]s
          # who.txt commits only from the attempt that succeeded, so closed.txt is opened
          # after the failed attempt's copy was withdrawn.
          command: [sh, -c, 'cat "$SLUICE_DIR/who.txt" "$SLUICE_DIR/closed.txt" > "$SLUICE_DIR/seen.txt"']
    outputs: [{path: seen.txt, commit: {rule: OnClose}}]
`, image, pullPol))
		wf.Namespace = ns
		Expect(k8s.Create(ctx, wf)).To(Succeed())
		waitSucceeded(ctx, ns, wf.Name, 3*time.Minute)

		var pods corev1.PodList
		Expect(k8s.List(ctx, &pods, client.InNamespace(ns), client.MatchingLabels{v1alpha1.LabelStep: "write"})).To(Succeed())
		Expect(pods.Items).To(HaveLen(2), "the failing first attempt and its retry")
		Expect(string(objectAt(ctx, outputURI(ctx, wf, "who.txt")))).To(Equal("retry-write-0-r1\n"), "the stored output")
		Expect(string(objectAt(ctx, outputURI(ctx, wf, "closed.txt")))).To(Equal("retry-write-0-r1\n"),
			"the stored OnClose output: the retry's, written again after the failed attempt's was withdrawn")
		Expect(string(objectAt(ctx, outputURI(ctx, wf, "seen.txt")))).To(Equal("retry-write-0-r1\nretry-write-0-r1\n"), "what the consumer read")
	})

	It("keeps a workflow's disk-tier files in a file system of the workflow's size on its node", func(ctx SpecContext) {
		ns := namespace(ctx, "disktier")
		wf := loadWorkflowYAML(fmt.Sprintf(`
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: disktier}
spec:
  permanent: [big.bin, sum.txt]
  tiers: {fs: [big.bin]}
  volume: {disk: {sizeLimit: 64Mi}}
  steps:
  - name: write
    template:
      spec:
        containers:
        - name: write
          image: %[1]s
          imagePullPolicy: %[2]s
          command: [sh, -c, 'head -c 20000000 /dev/urandom > "$SLUICE_DIR/big.bin"']
    outputs: [{path: big.bin, commit: {rule: OnClose}}]
  - name: read
    inputs: [big.bin]
    template:
      spec:
        containers:
        - name: read
          image: %[1]s
          imagePullPolicy: %[2]s
          command: [sh, -c, 'md5sum < "$SLUICE_DIR/big.bin" > "$SLUICE_DIR/sum.txt"']
    outputs: [{path: sum.txt, commit: {rule: OnClose}}]
`, image, pullPol))
		wf.Namespace = ns
		Expect(k8s.Create(ctx, wf)).To(Succeed())
		waitSucceeded(ctx, ns, wf.Name, 3*time.Minute)

		big := objectAt(ctx, outputURI(ctx, wf, "big.bin"))
		Expect(big).To(HaveLen(20000000), "the stored disk-tier file")
		Expect(string(objectAt(ctx, outputURI(ctx, wf, "sum.txt")))).To(HavePrefix(fmt.Sprintf("%x", md5.Sum(big))), "what the consumer read of it")
		// The CSI plugin mounted the workflow's disk tier on its node as an ext4 file
		// system sized for its sizeLimit (charts/sluice/ci/local-values.yaml sets
		// csi.diskTier: filesystem); the nodes' mount tables are their processes'.
		Expect(diskTierMounts(ns, wf.Name)).NotTo(BeEmpty(), "an ext4 mount at disk/%s/%s on a node", ns, wf.Name)
	})
})

// diskTierMounts returns the mount table lines of the ext4 file systems mounted at
// workflow ns/name's disk tier (…/disk/<ns>/<name>) in any mount namespace of this machine:
// the local cluster's nodes are its processes.
func diskTierMounts(ns, name string) []string {
	GinkgoHelper()
	tables, err := filepath.Glob("/proc/[0-9]*/mountinfo")
	Expect(err).NotTo(HaveOccurred())
	seen := map[string]bool{}
	var out []string
	for _, table := range tables {
		b, err := os.ReadFile(table)
		if err != nil {
			continue // the process ended
		}
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) > 4 && strings.HasSuffix(f[4], "/disk/"+ns+"/"+name) && strings.Contains(line, " - ext4 ") && !seen[line] {
				seen[line] = true
				out = append(out, line)
			}
		}
	}
	return out
}

func loadWorkflow(path string) *v1alpha1.Workflow {
	GinkgoHelper()
	b, err := os.ReadFile(path)
	Expect(err).NotTo(HaveOccurred())
	return loadWorkflowYAML(string(b))
}

func loadWorkflowYAML(s string) *v1alpha1.Workflow {
	GinkgoHelper()
	var wf v1alpha1.Workflow
	Expect(yaml.UnmarshalStrict([]byte(s), &wf)).To(Succeed())
	return &wf
}

// corpusConfigMap holds the Go sources of Sluice's semantics engine: a small, fixed corpus
// for the word count.
func corpusConfigMap(ns string) *corev1.ConfigMap {
	GinkgoHelper()
	dir := filepath.Join(repoRoot, "internal/semantics")
	entries, err := os.ReadDir(dir)
	Expect(err).NotTo(HaveOccurred())
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "corpus"}, Data: map[string]string{}}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".go") {
			b, err := os.ReadFile(filepath.Join(dir, e.Name()))
			Expect(err).NotTo(HaveOccurred())
			cm.Data[e.Name()] = string(b)
		}
	}
	Expect(cm.Data).NotTo(BeEmpty())
	return cm
}

// wordCount is what examples/wordcount computes: words are runs of [A-Za-z_], one line
// "count word" each, by count descending, then word in byte order.
func wordCount(cm *corev1.ConfigMap) []byte {
	counts := map[string]int{}
	for _, text := range cm.Data {
		for _, w := range regexp.MustCompile(`[A-Za-z_]+`).FindAllString(text, -1) {
			counts[w]++
		}
	}
	words := make([]string, 0, len(counts))
	for w := range counts {
		words = append(words, w)
	}
	sort.Slice(words, func(i, j int) bool {
		if counts[words[i]] != counts[words[j]] {
			return counts[words[i]] > counts[words[j]]
		}
		return words[i] < words[j]
	})
	var b bytes.Buffer
	for _, w := range words {
		fmt.Fprintf(&b, "%d %s\n", counts[w], w)
	}
	return b.Bytes()
}

// labelledJob is a plain Job whose pod asks the webhook for a streaming volume as step of
// the Workflow "jobs", and runs script in a shell.
func labelledJob(ns, step, script string) *batchv1.Job {
	return labelledJobFor(ns, "jobs", step, "", script)
}

// labelledJobFor is labelledJob for the Workflow wf, with the volume mode annotation
// sluice.io/mode set to mode unless it is empty.
func labelledJobFor(ns, wf, step, mode, script string) *batchv1.Job {
	annotations := map[string]string{v1alpha1.AnnotationWorkflow: wf, v1alpha1.AnnotationStep: step}
	if mode != "" {
		annotations[v1alpha1.AnnotationMode] = mode
	}
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: step},
		Spec: batchv1.JobSpec{
			BackoffLimit: ptrTo(int32(0)),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{
					Labels:      map[string]string{v1alpha1.LabelInject: "true"},
					Annotations: annotations,
				},
				Spec: corev1.PodSpec{
					RestartPolicy: corev1.RestartPolicyNever,
					Containers: []corev1.Container{{Name: step, Image: image, ImagePullPolicy: pullPol,
						Command: []string{"sh", "-c", "set -eu; " + script}}},
				},
			},
		},
	}
}

// runJobs creates the Jobs in order and waits up to 5 minutes for each to succeed.
func runJobs(ctx context.Context, jobs ...*batchv1.Job) {
	GinkgoHelper()
	for _, j := range jobs {
		Expect(k8s.Create(ctx, j)).To(Succeed())
	}
	for _, j := range jobs {
		Eventually(jobSucceeded(ctx, j)).WithContext(ctx).WithTimeout(5*time.Minute).WithPolling(2*time.Second).
			Should(BeTrue(), "job %s", j.Name)
	}
}

func jobSucceeded(ctx context.Context, j *batchv1.Job) func() (bool, error) {
	return func() (bool, error) {
		var got batchv1.Job
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(j), &got); err != nil {
			return false, err
		}
		for _, c := range got.Status.Conditions {
			if c.Status == corev1.ConditionTrue && c.Type == batchv1.JobFailed {
				return false, StopTrying("job " + j.Name + " failed: " + c.Message)
			}
		}
		return got.Status.Succeeded > 0, nil
	}
}

func containerRunning(p *corev1.Pod, name string) bool {
	for _, s := range p.Status.ContainerStatuses {
		if s.Name == name && s.State.Running != nil {
			return true
		}
	}
	return false
}

// killSidecar sends SIGQUIT to the sidecar of pod p, as the kernel's OOM killer or a
// crash would end it. It signals the process from this machine: the admission policy
// sluice-pods refuses an ephemeral container that targets the sidecar (it holds the
// workflow's credentials), so the kill needs the local cluster (hack/cluster/local.sh),
// whose containers are processes here; elsewhere the spec is skipped, saying so.
func killSidecar(p *corev1.Pod) {
	GinkgoHelper()
	uid := string(p.UID)
	// The kubelet names a pod's cgroup after its UID, with "_" for "-" under systemd.
	forms := []string{uid, strings.ReplaceAll(uid, "-", "_")}
	procs, err := os.ReadDir("/proc")
	Expect(err).NotTo(HaveOccurred())
	var found []int
	for _, e := range procs {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err1 := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		cg, err2 := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		if err1 != nil || err2 != nil {
			continue
		}
		args := strings.Split(string(cmd), "\x00")
		if len(args) < 2 || filepath.Base(args[0]) != "sluice" || args[1] != "sidecar" {
			continue
		}
		if strings.Contains(string(cg), forms[0]) || strings.Contains(string(cg), forms[1]) {
			found = append(found, pid)
		}
	}
	if len(found) == 0 {
		Skip("killing the sidecar of pod " + p.Name + " needs its process on this machine (the local cluster): " +
			"the sluice-pods admission policy refuses ephemeral containers that target it")
	}
	for _, pid := range found {
		Expect(syscall.Kill(pid, syscall.SIGQUIT)).To(Succeed(), "signalling sidecar process %d of pod %s", pid, p.Name)
	}
}

// outputURI waits for the Workflow's status to list permanent file path and returns its URI.
func outputURI(ctx context.Context, wf *v1alpha1.Workflow, path string) string {
	GinkgoHelper()
	var uri string
	Eventually(func(g Gomega) {
		var got v1alpha1.Workflow
		g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(wf), &got)).To(Succeed())
		for _, o := range got.Status.Outputs {
			if o.Path == path {
				uri = o.URI
			}
		}
		g.Expect(uri).NotTo(BeEmpty(), "status.outputs %+v lacks %s", got.Status.Outputs, path)
	}).WithContext(ctx).WithTimeout(time.Minute).Should(Succeed())
	return uri
}

// objectAt reads an s3://bucket/key URI from the installation's MinIO.
func objectAt(ctx context.Context, uri string) []byte {
	GinkgoHelper()
	bucket, key := splitURI(uri)
	var secret corev1.Secret
	Expect(k8s.Get(ctx, client.ObjectKey{Namespace: system, Name: "sluice-storage"}, &secret)).To(Succeed())
	mc := minioClient(ctx, string(secret.Data["accessKey"]), string(secret.Data["secretKey"]))
	obj, err := mc.GetObject(ctx, bucket, key, minio.GetObjectOptions{})
	Expect(err).NotTo(HaveOccurred())
	defer obj.Close()
	b, err := io.ReadAll(obj)
	Expect(err).NotTo(HaveOccurred(), "reading %s", uri)
	return b
}

// jetStream connects to the installation's NATS with a workflow's own credentials, as
// its sidecars do (the configuration Secret's files in a temporary directory).
func jetStream(ctx context.Context, secret *corev1.Secret) (jetstream.JetStream, wfmeta.Names) {
	GinkgoHelper()
	dir, cfg := loadSecret(secret)
	Expect(cfg.NATSCreds).NotTo(BeEmpty(), "the workflow's Secret carries no NATS credentials")
	addr := forward(ctx, system, "app.kubernetes.io/component=nats", 4222)
	nc, err := dialNATS(ctx, addr, nats.UserCredentials(filepath.Join(dir, v1alpha1.SecretKeyNATSCreds)),
		nats.CustomInboxPrefix(cfg.NATSInbox))
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(nc.Close)
	js, err := jetstream.New(nc)
	Expect(err).NotTo(HaveOccurred())
	return js, wfmeta.NamesForWorkflow(secret.Namespace, cfg.Workflow.Name, string(cfg.Workflow.UID))
}
