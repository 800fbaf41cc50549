//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/controller"
	"github.com/sluice-io/sluice/controller/placement"
	"github.com/sluice-io/sluice/internal/podconfig"
	"github.com/sluice-io/sluice/internal/transport"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

// The attacks of issue 32 that a tenant's pods and Workflows can make, each on the
// installed cluster (admission policies, webhook, controller, MinIO and NATS as deployed),
// from a namespace that enforces Pod Security "restricted": each is refused with a reason,
// while the legitimate workflows of other namespaces run to completion byte-exact. The
// attacks on the node (deposits, symlinks in the workflow directory) need a csi.sluice.io
// volume the pod chose itself, which the first spec shows no tenant pod gets; the node
// plugin's own checks are tested in csi-driver and storeserver.
var _ = Describe("A hostile tenant", func() {
	It("gets no csi.sluice.io volume, preset mark or reserved volume past admission", func(ctx SpecContext) {
		ns := restrictedNamespace(ctx, "tenant")
		csiVolume := func(name string) corev1.Volume {
			return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
				Driver:           "csi.sluice.io",
				VolumeAttributes: map[string]string{"sluice.io/workflow": "no-such-workflow", "sluice.io/role": "sidecar"},
			}}}
		}
		for _, attack := range []struct {
			what    string
			mutate  func(p *corev1.Pod)
			refusal string
		}{{
			what:    "a csi.sluice.io volume of its own name",
			mutate:  func(p *corev1.Pod) { p.Spec.Volumes = []corev1.Volume{csiVolume("state")} },
			refusal: "csi.sluice.io volumes are added by Sluice",
		}, {
			what:    "a csi.sluice.io volume named as Sluice names it, without the webhook",
			mutate:  func(p *corev1.Pod) { p.Spec.Volumes = []corev1.Volume{csiVolume("sluice")} },
			refusal: "only for pods the Sluice webhook admitted",
		}, {
			what: "the webhook's mark set by the pod itself",
			mutate: func(p *corev1.Pod) {
				p.Labels = map[string]string{v1alpha1.LabelInject: "true"}
				p.Annotations = map[string]string{v1alpha1.AnnotationWorkflow: "wf", v1alpha1.AnnotationStep: "s", v1alpha1.AnnotationInjected: "true"}
				p.Spec.Volumes = []corev1.Volume{csiVolume("sluice")}
			},
			refusal: "is set by Sluice's webhook, never by a pod",
		}, {
			what: "a Workflow of another namespace",
			mutate: func(p *corev1.Pod) {
				p.Labels = map[string]string{v1alpha1.LabelInject: "true"}
				p.Annotations = map[string]string{v1alpha1.AnnotationWorkflow: "other/wf", v1alpha1.AnnotationStep: "s"}
			},
			refusal: "names a Workflow in another namespace",
		}, {
			what: "a volume named as the sidecar's configuration, mounted by an app container",
			mutate: func(p *corev1.Pod) {
				p.Spec.Volumes = []corev1.Volume{{Name: "sluice-config", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
				p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "sluice-config", MountPath: "/config"}}
			},
			refusal: "only the Sluice sidecar mounts the volumes sluice-config and sluice-control",
		}} {
			By("creating a pod with " + attack.what)
			p := restrictedPod(ns, "attack", "true")
			attack.mutate(p)
			err := k8s.Create(ctx, p)
			Expect(err).To(HaveOccurred(), "a restricted pod with %s was admitted", attack.what)
			Expect(err.Error()).To(ContainSubstring(attack.refusal), "the refusal of %s", attack.what)
			Expect(err.Error()).NotTo(ContainSubstring("violates PodSecurity"), "the pod must be refused by Sluice, not by Pod Security")
		}
	})

	It("holds keys that reach only its own workflow's objects and stream", func(ctx SpecContext) {
		const want = "bytes of a workflow\n"
		nsA, nsB := namespace(ctx, "tenant-a"), namespace(ctx, "tenant-b")
		wfA, wfB := smallWorkflow(nsA, "a", want), smallWorkflow(nsB, "b", want)
		Expect(k8s.Create(ctx, wfA)).To(Succeed())
		Expect(k8s.Create(ctx, wfB)).To(Succeed())
		waitSucceeded(ctx, nsA, wfA.Name, 5*time.Minute)
		waitSucceeded(ctx, nsB, wfB.Name, 5*time.Minute)
		uriA, uriB := outputURI(ctx, wfA, "result.txt"), outputURI(ctx, wfB, "result.txt")
		Expect(string(objectAt(ctx, uriB))).To(Equal(want), "the legitimate workflow's result")

		By("using tenant A's object storage keys, from its configuration Secret, on tenant B's objects")
		var secret corev1.Secret
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: nsA, Name: podconfig.SecretName(wfA.Name)}, &secret)).To(Succeed())
		_, cfg := loadSecret(&secret)
		Expect(cfg.Storage).NotTo(BeNil(), "tenant A's Secret carries no object storage")
		Expect(cfg.Storage.AccessKey).NotTo(BeEmpty())
		var root corev1.Secret
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: system, Name: "sluice-storage"}, &root)).To(Succeed())
		Expect(cfg.Storage.AccessKey).NotTo(Equal(string(root.Data["accessKey"])), "tenant A holds the installation's keys")
		mc := minioClient(ctx, cfg.Storage.AccessKey, cfg.Storage.SecretKey)
		bucketA, keyA := splitURI(uriA)
		bucketB, keyB := splitURI(uriB)
		_, err := mc.StatObject(ctx, bucketA, keyA, minio.StatObjectOptions{})
		Expect(err).NotTo(HaveOccurred(), "tenant A's keys must reach its own result %s", uriA)
		_, err = mc.StatObject(ctx, bucketB, keyB, minio.StatObjectOptions{})
		Expect(minio.ToErrorResponse(err).Code).To(Equal("AccessDenied"), "reading tenant B's %s with tenant A's keys: %v", uriB, err)
		_, err = mc.PutObject(ctx, bucketB, keyB, strings.NewReader("overwritten"), 11, minio.PutObjectOptions{})
		Expect(minio.ToErrorResponse(err).Code).To(Equal("AccessDenied"), "overwriting tenant B's %s with tenant A's keys: %v", uriB, err)
		err = mc.RemoveObject(ctx, bucketB, keyB, minio.RemoveObjectOptions{})
		Expect(minio.ToErrorResponse(err).Code).To(Equal("AccessDenied"), "removing tenant B's %s with tenant A's keys: %v", uriB, err)
		Expect(string(objectAt(ctx, uriB))).To(Equal(want), "tenant B's result after tenant A's attempts")

		By("using tenant A's NATS credentials on tenant B's stream")
		js, namesA := jetStream(ctx, &secret)
		_, err = js.Stream(ctx, namesA.Stream)
		Expect(err).NotTo(HaveOccurred(), "tenant A's credentials must reach its own stream")
		namesB := wfmeta.NamesForWorkflow(nsB, wfB.Name, string(wfB.UID))
		short, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err = js.Stream(short, namesB.Stream)
		Expect(err).To(HaveOccurred(), "tenant A's credentials read tenant B's stream %s", namesB.Stream)
		_, err = js.KeyValue(short, namesB.Bucket)
		Expect(err).To(HaveOccurred(), "tenant A's credentials read tenant B's KV bucket %s", namesB.Bucket)
	})

	// Across nodes: a workflow's bytes stay on the node that wrote them and are served
	// from there over NATS (wfmeta.Names.Serve) to the workflow's other nodes only. Tenant
	// B's file is held on one node after its pod ended (its store server serves it);
	// tenant A's workflow ran on another. B's own credentials fetch the bytes, which shows
	// the request is the data plane's own; A's get nothing.
	It("cannot fetch another tenant's bytes from the node that holds them", func(ctx SpecContext) {
		nodes := needNodes(ctx, 2)
		const want = "tenant B's bytes\n"
		nsA, nsB := namespace(ctx, "tenant-a"), namespace(ctx, "tenant-b")
		wfA, wfB := smallWorkflow(nsA, "a", "a\n"), smallWorkflow(nsB, "b", want)
		wfA.Spec.Steps[0].Template.Spec.NodeSelector = map[string]string{placement.HostnameKey: nodes[1]}
		wfB.Spec.Steps[0].Template.Spec.NodeSelector = map[string]string{placement.HostnameKey: nodes[0]}
		Expect(k8s.Create(ctx, wfA)).To(Succeed())
		Expect(k8s.Create(ctx, wfB)).To(Succeed())
		waitSucceeded(ctx, nsA, wfA.Name, 5*time.Minute)
		waitSucceeded(ctx, nsB, wfB.Name, 5*time.Minute)
		Expect(stepPod(ctx, Default, nsB, "write").Spec.NodeName).To(Equal(nodes[0]))
		Expect(stepPod(ctx, Default, nsA, "write").Spec.NodeName).To(Equal(nodes[1]))
		fetch := func(secret *corev1.Secret) ([]byte, error) {
			js, _ := jetStream(ctx, secret)
			namesB := wfmeta.NamesForWorkflow(nsB, wfB.Name, string(wfB.UID))
			short, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			resp, err := js.Conn().RequestMsgWithContext(short, transport.FetchRequest(namesB, nodes[0], "result.txt", 0, int64(len(want)), 0))
			if err != nil {
				return nil, err
			}
			if e := resp.Header.Get("Sluice-Error"); e != "" {
				return nil, errors.New(e)
			}
			return resp.Data, nil
		}
		var secretA, secretB corev1.Secret
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: nsA, Name: podconfig.SecretName(wfA.Name)}, &secretA)).To(Succeed())
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: nsB, Name: podconfig.SecretName(wfB.Name)}, &secretB)).To(Succeed())
		By("fetching B's result.txt from " + nodes[0] + " with B's credentials")
		Eventually(func() (string, error) {
			b, err := fetch(&secretB)
			return string(b), err
		}).WithContext(ctx).WithTimeout(time.Minute).Should(Equal(want), "B's own credentials must fetch its bytes from %s", nodes[0])
		By("fetching them with tenant A's credentials")
		got, err := fetch(&secretA)
		Expect(err).To(HaveOccurred(), "tenant A fetched %q of tenant B's file from %s", got, nodes[0])
		Expect(got).To(BeEmpty())
		GinkgoWriter.Printf("tenant A's fetch of B's bytes: %v\n", err)
	})

	It("cannot point spec.storage at another tenant's prefix without keys of its own", func(ctx SpecContext) {
		ns := namespace(ctx, "tenant")
		wf := smallWorkflow(ns, "steal", "x\n")
		wf.Spec.Storage = &v1alpha1.StorageSpec{Bucket: "sluice", Prefix: "someone-else/their-workflow/"}
		Expect(k8s.Create(ctx, wf)).To(Succeed())
		Eventually(func(g Gomega) {
			var got v1alpha1.Workflow
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(wf), &got)).To(Succeed())
			c := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionReady)
			g.Expect(c).NotTo(BeNil(), "no Ready condition yet")
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal(controller.ReasonStorageNotPermitted))
			g.Expect(c.Message).To(ContainSubstring("someone-else/their-workflow/"))
		}).WithContext(ctx).WithTimeout(2 * time.Minute).Should(Succeed())
		var pods corev1.PodList
		Expect(k8s.List(ctx, &pods, client.InNamespace(ns))).To(Succeed())
		Expect(pods.Items).To(BeEmpty(), "a refused workflow started pods")
	})

	It("cannot read NATS's monitoring port from a pod", func(ctx SpecContext) {
		ns := restrictedNamespace(ctx, "tenant")
		var natsPods corev1.PodList
		Expect(k8s.List(ctx, &natsPods, client.InNamespace(system), client.MatchingLabels{"app.kubernetes.io/component": "nats"})).To(Succeed())
		Expect(natsPods.Items).NotTo(BeEmpty())
		ip := natsPods.Items[0].Status.PodIP
		Expect(ip).NotTo(BeEmpty())
		// From another node than NATS's, when the cluster has one.
		var elsewhere string
		for _, n := range schedulableNodes(ctx) {
			if n != natsPods.Items[0].Spec.NodeName {
				elsewhere = n
				break
			}
		}
		// The client port answers (the pod reaches NATS at all), the monitoring port does not.
		p := restrictedPod(ns, "probe", fmt.Sprintf(
			`if nc -w 5 %[1]s 4222 </dev/null | grep -q INFO; then echo client-port-open; fi; `+
				`if wget -T 5 -q -O- http://%[1]s:8222/varz; then echo monitoring-open; else echo monitoring-refused; fi`, ip))
		if elsewhere != "" {
			p.Spec.NodeSelector = map[string]string{placement.HostnameKey: elsewhere}
		}
		Expect(k8s.Create(ctx, p)).To(Succeed())
		Eventually(func() (corev1.PodPhase, error) {
			var got corev1.Pod
			err := k8s.Get(ctx, client.ObjectKeyFromObject(p), &got)
			return got.Status.Phase, err
		}).WithContext(ctx).WithTimeout(2 * time.Minute).Should(Equal(corev1.PodSucceeded))
		logs, err := clientset.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(string(logs)).To(ContainSubstring("client-port-open"), "the probe could not reach NATS at all, so it proves nothing")
		Expect(string(logs)).To(ContainSubstring("monitoring-refused"))
		Expect(string(logs)).NotTo(ContainSubstring("server_id"), "the monitoring endpoint answered")
	})

	It("cannot take the controller down with a 2,000-pattern Workflow", func(ctx SpecContext) {
		before := controllerRestarts(ctx)
		ns := namespace(ctx, "tenant")
		// Two steps of 1,000 output patterns each, every one overlapping every pattern of
		// the other step: an all-pairs compile keeping every error cost 19 s and 1.3 GB.
		var b strings.Builder
		fmt.Fprintf(&b, "apiVersion: sluice.io/v1alpha1\nkind: Workflow\nmetadata: {name: heavy}\nspec:\n  steps:\n")
		for _, step := range []string{"a", "b"} {
			fmt.Fprintf(&b, "  - name: %s\n    template: {spec: {containers: [{name: c, image: %s}]}}\n    outputs:\n", step, image)
			for i := 0; i < 1000; i++ {
				fmt.Fprintf(&b, "    - {path: \"out/%s%d*\", commit: {rule: OnClose}}\n", step, i)
			}
		}
		heavy := loadWorkflowYAML(strings.ReplaceAll(b.String(), "out/b", "out/*"))
		heavy.Namespace = ns
		start := time.Now()
		if err := k8s.Create(ctx, heavy); err == nil {
			Eventually(workflowPhase(ctx, ns, heavy.Name)).WithContext(ctx).WithTimeout(time.Minute).
				Should(Equal(v1alpha1.WorkflowFailed), "the 2,000-pattern Workflow was not refused")
		}
		GinkgoWriter.Printf("the 2,000-pattern Workflow was refused after %s\n", time.Since(start))

		By("running a legitimate workflow in another namespace")
		other := namespace(ctx, "legit")
		wf := smallWorkflow(other, "legit", "still here\n")
		Expect(k8s.Create(ctx, wf)).To(Succeed())
		waitSucceeded(ctx, other, wf.Name, 5*time.Minute)
		Expect(string(objectAt(ctx, outputURI(ctx, wf, "result.txt")))).To(Equal("still here\n"))
		Expect(controllerRestarts(ctx)).To(Equal(before), "the controller restarted")
	})
})

// restrictedNamespace creates a namespace for one spec that enforces Pod Security
// "restricted", as a cluster shared by teams would.
func restrictedNamespace(ctx context.Context, prefix string) string {
	GinkgoHelper()
	ns := namespace(ctx, prefix)
	kubectl("label", "namespace", ns, "--overwrite", "pod-security.kubernetes.io/enforce=restricted")
	return ns
}

// restrictedPod returns a pod that Pod Security "restricted" admits, running script in
// the e2e image once.
func restrictedPod(ns, prefix, script string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: prefix + "-"},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot: ptrTo(true), RunAsUser: ptrTo(int64(65534)),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name: "c", Image: image, ImagePullPolicy: pullPol, Command: []string{"sh", "-c", script},
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptrTo(false),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
		},
	}
}

// smallWorkflow returns a one-step Workflow in ns that writes content to the permanent
// result.txt.
func smallWorkflow(ns, name, content string) *v1alpha1.Workflow {
	GinkgoHelper()
	wf := loadWorkflowYAML(fmt.Sprintf(`
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: %[3]s}
spec:
  permanent: [result.txt]
  steps:
  - name: write
    template:
      spec:
        containers:
        - name: write
          image: %[1]s
          imagePullPolicy: %[2]s
          command: [sh, -c, 'printf %%s "$CONTENT" > "$SLUICE_DIR/result.txt"']
          env: [{name: CONTENT, value: %[4]q}]
    outputs: [{path: result.txt, commit: {rule: OnClose}}]
`, image, pullPol, name, content))
	wf.Namespace = ns
	return wf
}

// loadSecret decodes a workflow's configuration Secret as its sidecar reads it, from the
// files of a temporary directory (returned too, for the credentials file).
func loadSecret(s *corev1.Secret) (string, *podconfig.Config) {
	GinkgoHelper()
	dir := GinkgoT().TempDir()
	for k, v := range s.Data {
		Expect(os.WriteFile(filepath.Join(dir, k), v, 0o600)).To(Succeed())
	}
	cfg, err := podconfig.Load(dir)
	Expect(err).NotTo(HaveOccurred())
	return dir, cfg
}

// splitURI splits s3://bucket/key.
func splitURI(uri string) (bucket, key string) {
	GinkgoHelper()
	rest, ok := strings.CutPrefix(uri, "s3://")
	Expect(ok).To(BeTrue(), "output URI %q", uri)
	bucket, key, _ = strings.Cut(rest, "/")
	return bucket, key
}

// controllerRestarts returns the restart count of the controller's containers.
func controllerRestarts(ctx context.Context) int32 {
	GinkgoHelper()
	var pods corev1.PodList
	Expect(k8s.List(ctx, &pods, client.InNamespace(system), client.MatchingLabels{"app.kubernetes.io/component": "controller"})).To(Succeed())
	Expect(pods.Items).NotTo(BeEmpty(), "no controller pod")
	var n int32
	for _, p := range pods.Items {
		for _, c := range p.Status.ContainerStatuses {
			n += c.RestartCount
		}
	}
	return n
}
