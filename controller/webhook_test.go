package controller

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/controller/certs"
	"github.com/sluice-io/sluice/controller/inject"
	"github.com/sluice-io/sluice/internal/podconfig"
)

const joinable = `
apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: jobs}
spec:
  volume: {mountPath: /work}
  steps:
  - name: writer
    outputs: [{path: out, fire: NoUpdate, commit: {rule: OnClose}}]
  - name: reader
    replicas: 2
    inputs: [out]
`

func labelledPod(name string, annotations map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{v1alpha1.LabelInject: "true"}, Annotations: annotations},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "app", Image: "busybox", Env: []corev1.EnvVar{{Name: "SLUICE_STEP", Value: "stale"}}}}},
	}
}

// The webhook injects a labelled pod of a plain Job-like producer: sidecar first, as a
// native sidecar, unprivileged and read-only; the two CSI volumes and the Secret; the
// volume in every app container; the SLUICE_* environment. It refuses, naming the
// annotation, a missing or foreign Workflow, an undeclared step and an instance beyond the
// step's replicas, and leaves unlabelled pods alone.
func TestWebhookInjectsAndRefuses(t *testing.T) {
	e := startEnv(t)
	ctx := context.Background()
	ns := e.namespace(t, "inject")
	other := e.namespace(t, "other")
	if err := e.k8s.Create(ctx, workflowFrom(t, ns, joinable)); err != nil {
		t.Fatal(err)
	}

	p := labelledPod("writer", map[string]string{v1alpha1.AnnotationWorkflow: "jobs", v1alpha1.AnnotationStep: "writer"})
	p.Namespace = ns
	if err := e.k8s.Create(ctx, p); err != nil {
		t.Fatalf("creating a labelled pod: %v", err)
	}
	got, _ := e.pod(t, ns, "writer")
	if len(got.Spec.InitContainers) != 1 || got.Spec.InitContainers[0].Name != inject.SidecarName {
		t.Fatalf("no sidecar injected: %+v", got.Spec.InitContainers)
	}
	sc := got.Spec.InitContainers[0]
	sctx := sc.SecurityContext
	switch {
	case sc.RestartPolicy == nil || *sc.RestartPolicy != corev1.ContainerRestartPolicyAlways:
		t.Error("the sidecar is not a native sidecar (restartPolicy Always)")
	case sctx == nil || !ptr.Deref(sctx.RunAsNonRoot, false) || ptr.Deref(sctx.RunAsUser, 0) == 0:
		t.Error("the sidecar may run as root")
	case !ptr.Deref(sctx.ReadOnlyRootFilesystem, false) || ptr.Deref(sctx.AllowPrivilegeEscalation, true) || ptr.Deref(sctx.Privileged, true):
		t.Error("the sidecar has a writable root filesystem or may escalate")
	case sctx.Capabilities == nil || len(sctx.Capabilities.Add) != 0 || len(sctx.Capabilities.Drop) != 1 || sctx.Capabilities.Drop[0] != "ALL":
		t.Errorf("the sidecar's capabilities: %+v", sctx.Capabilities)
	case sc.StartupProbe == nil || sc.StartupProbe.HTTPGet == nil || sc.StartupProbe.HTTPGet.Path != "/readyz":
		t.Error("the sidecar has no readiness startup probe: the app could start before its volume is served")
	}
	vols := map[string]corev1.Volume{}
	for _, v := range got.Spec.Volumes {
		vols[v.Name] = v
	}
	app, ctl, cfg := vols[inject.VolumeName], vols[inject.ControlVolume], vols[inject.ConfigVolume]
	if app.CSI == nil || app.CSI.Driver != v1alpha1.DriverName || app.CSI.VolumeAttributes[v1alpha1.VolumeAttrRole] != v1alpha1.RoleApp ||
		app.CSI.VolumeAttributes[v1alpha1.VolumeAttrStep] != "writer" || app.CSI.VolumeAttributes[v1alpha1.VolumeAttrInstance] != "0" {
		t.Errorf("streaming volume %+v", app)
	}
	if ctl.CSI == nil || ctl.CSI.VolumeAttributes[v1alpha1.VolumeAttrRole] != v1alpha1.RoleSidecar {
		t.Errorf("control volume %+v", ctl)
	}
	if cfg.Secret == nil || cfg.Secret.SecretName != podconfig.SecretName("jobs") {
		t.Errorf("configuration volume %+v", cfg)
	}
	c := got.Spec.Containers[0]
	if len(c.VolumeMounts) != 1 || c.VolumeMounts[0].MountPath != "/work" {
		t.Errorf("app mounts %+v, want the volume at the Workflow's /work", c.VolumeMounts)
	}
	env := map[string]string{}
	for _, v := range c.Env {
		if _, dup := env[v.Name]; dup {
			t.Errorf("env %s set twice", v.Name)
		}
		env[v.Name] = v.Value
	}
	if env["SLUICE_STEP"] != "writer" || env["SLUICE_INSTANCE"] != "0" || env["SLUICE_WORKFLOW"] != "jobs" || env["SLUICE_DIR"] != "/work" || env["SLUICE_REPLICAS"] != "1" {
		t.Errorf("app env %v", env)
	}

	// An Indexed Job's completion index is the instance.
	r := labelledPod("reader-1", map[string]string{v1alpha1.AnnotationWorkflow: "jobs", v1alpha1.AnnotationStep: "reader",
		"batch.kubernetes.io/job-completion-index": "1", v1alpha1.AnnotationMountPath: "/in"})
	r.Namespace = ns
	if err := e.k8s.Create(ctx, r); err != nil {
		t.Fatal(err)
	}
	got, _ = e.pod(t, ns, "reader-1")
	if got.Labels[v1alpha1.LabelInstance] != "1" || got.Spec.Containers[0].VolumeMounts[0].MountPath != "/in" {
		t.Errorf("reader: instance label %q, mount %+v", got.Labels[v1alpha1.LabelInstance], got.Spec.Containers[0].VolumeMounts)
	}

	refusals := []struct {
		ns, name   string
		ann        map[string]string
		annotation string
	}{
		{ns, "no-workflow", map[string]string{v1alpha1.AnnotationStep: "writer"}, v1alpha1.AnnotationWorkflow},
		{ns, "missing", map[string]string{v1alpha1.AnnotationWorkflow: "nope", v1alpha1.AnnotationStep: "writer"}, v1alpha1.AnnotationWorkflow},
		{ns, "foreign", map[string]string{v1alpha1.AnnotationWorkflow: other + "/jobs", v1alpha1.AnnotationStep: "writer"}, v1alpha1.AnnotationWorkflow},
		{other, "other-ns", map[string]string{v1alpha1.AnnotationWorkflow: "jobs", v1alpha1.AnnotationStep: "writer"}, v1alpha1.AnnotationWorkflow},
		{ns, "undeclared", map[string]string{v1alpha1.AnnotationWorkflow: "jobs", v1alpha1.AnnotationStep: "mystery"}, v1alpha1.AnnotationStep},
		{ns, "beyond", map[string]string{v1alpha1.AnnotationWorkflow: "jobs", v1alpha1.AnnotationStep: "reader", v1alpha1.AnnotationInstance: "2"}, v1alpha1.AnnotationInstance},
		{ns, "relative", map[string]string{v1alpha1.AnnotationWorkflow: "jobs", v1alpha1.AnnotationStep: "writer", v1alpha1.AnnotationMountPath: "data"}, v1alpha1.AnnotationMountPath},
	}
	for _, tc := range refusals {
		p := labelledPod(tc.name, tc.ann)
		p.Namespace = tc.ns
		err := e.k8s.Create(ctx, p)
		if err == nil || !strings.Contains(err.Error(), "denied") || !strings.Contains(err.Error(), tc.annotation) {
			t.Errorf("pod %s/%s: %v; want a denial naming %s", tc.ns, tc.name, err, tc.annotation)
		}
	}

	plain := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "plain", Namespace: ns, Annotations: map[string]string{v1alpha1.AnnotationWorkflow: "jobs", v1alpha1.AnnotationStep: "writer"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "busybox"}}}}
	if err := e.k8s.Create(ctx, plain); err != nil {
		t.Fatal(err)
	}
	if got, _ := e.pod(t, ns, "plain"); len(got.Spec.InitContainers) != 0 || len(got.Spec.Volumes) != 0 {
		t.Error("an unlabelled pod was changed")
	}
}

// The webhook's certificate is issued once, stored, written for the server, patched into
// the caBundle (also after the configuration is re-applied without one), and renewed
// when a third of its validity remains.
func TestWebhookCertificates(t *testing.T) {
	e := startEnv(t)
	ctx := context.Background()
	ns := e.namespace(t, "sluice-system")
	now := time.Now()
	dir := t.TempDir()
	c := &certs.Certs{Client: e.k8s, Namespace: ns, SecretName: "sluice-webhook-cert", Services: []string{"sluice-webhook"},
		WebhookConfig: "sluice", CertDir: dir, Validity: 30 * 24 * time.Hour, Now: func() time.Time { return now }}
	renew, err := c.Ensure(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := now.Add(20 * 24 * time.Hour); renew.Before(want.Add(-2*time.Minute)) || renew.After(want.Add(2*time.Minute)) {
		t.Errorf("renewal at %v, want two thirds into the validity (%v)", renew, want)
	}
	var sec corev1.Secret
	if err := e.k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "sluice-webhook-cert"}, &sec); err != nil {
		t.Fatal(err)
	}
	served, err := os.ReadFile(filepath.Join(dir, "tls.crt"))
	if err != nil || string(served) != string(sec.Data["tls.crt"]) {
		t.Fatalf("the served certificate is not the stored one (%v)", err)
	}
	block, _ := pem.Decode(served)
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(sec.Data["ca.crt"])
	if _, err := leaf.Verify(x509.VerifyOptions{DNSName: "sluice-webhook." + ns + ".svc", Roots: pool}); err != nil {
		t.Errorf("certificate does not verify for the Service: %v", err)
	}
	caBundle := func() []byte {
		var cfg admissionregistrationv1.MutatingWebhookConfiguration
		if err := e.k8s.Get(ctx, types.NamespacedName{Name: "sluice"}, &cfg); err != nil {
			t.Fatal(err)
		}
		return cfg.Webhooks[0].ClientConfig.CABundle
	}
	if string(caBundle()) != string(sec.Data["ca.crt"]) {
		t.Error("caBundle not patched")
	}

	// A second start reuses the stored certificate.
	if _, err := c.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.ReadFile(filepath.Join(dir, "tls.crt")); string(again) != string(served) {
		t.Error("a restart issued a new certificate although the stored one is valid")
	}

	// Re-applied configuration without caBundle: patched back.
	var cfg admissionregistrationv1.MutatingWebhookConfiguration
	if err := e.k8s.Get(ctx, types.NamespacedName{Name: "sluice"}, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg.Webhooks[0].ClientConfig.CABundle = nil
	if err := e.k8s.Update(ctx, &cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if string(caBundle()) != string(sec.Data["ca.crt"]) {
		t.Error("caBundle not restored after the configuration was re-applied")
	}

	// Past the renewal time: a new certificate and CA, stored, served and patched.
	now = renew.Add(time.Minute)
	if _, err := c.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	renewed, _ := os.ReadFile(filepath.Join(dir, "tls.crt"))
	if string(renewed) == string(served) {
		t.Fatal("certificate not renewed")
	}
	if err := e.k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "sluice-webhook-cert"}, &sec); err != nil {
		t.Fatal(err)
	}
	if string(sec.Data["tls.crt"]) != string(renewed) || string(caBundle()) != string(sec.Data["ca.crt"]) {
		t.Error("the renewed certificate is not the stored one, or its CA is not in the caBundle")
	}
}
