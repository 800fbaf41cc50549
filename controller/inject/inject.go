// Package inject turns a pod into a Sluice step instance: it adds the native sidecar
// (`sluice sidecar`, an init container with restartPolicy Always), the two CSI ephemeral
// inline volumes of the csi.sluice.io driver (the streaming volume the app containers
// mount, and the control volume through which the sidecar receives the FUSE descriptor),
// the workflow's configuration Secret, and the SLUICE_* environment. The admission
// webhook applies it to labelled pods, the controller to the pods it creates, so both
// kinds of pods are the same.
package inject

import (
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/sluice-io/sluice/api/v1alpha1"
	csidriver "github.com/sluice-io/sluice/csi-driver"
	"github.com/sluice-io/sluice/internal/podconfig"
)

// Labels and annotations that ask for, and describe, injection.
const (
	// LabelInject on a pod ("true") sends it through the webhook (its objectSelector).
	LabelInject = "sluice.io/inject"
	// AnnotationWorkflow names the Workflow, in the pod's namespace. Required.
	AnnotationWorkflow = "sluice.io/workflow"
	// AnnotationStep names the step the pod runs. Required.
	AnnotationStep = "sluice.io/step"
	// AnnotationInstance is the 0-based instance; defaults to the pod's
	// batch.kubernetes.io/job-completion-index, else 0.
	AnnotationInstance = "sluice.io/instance"
	// AnnotationMountPath is where the app containers see the volume; defaults to the
	// Workflow's spec.volume.mountPath.
	AnnotationMountPath = "sluice.io/mount-path"
	// AnnotationMode is "fuse" (default) or "direct".
	AnnotationMode = "sluice.io/mode"
	// AnnotationInjected is set on a pod once injected, so injection is never repeated.
	AnnotationInjected = "sluice.io/injected"

	// LabelWorkflow, LabelStep and LabelInstance are set on every step pod.
	LabelWorkflow = "sluice.io/workflow"
	LabelStep     = "sluice.io/step"
	LabelInstance = "sluice.io/instance"

	// jobCompletionIndex is the annotation Indexed Jobs put on their pods.
	jobCompletionIndex = "batch.kubernetes.io/job-completion-index"
)

// Names of what is added to the pod.
const (
	SidecarName      = "sluice-sidecar"
	VolumeName       = "sluice"
	ControlVolume    = "sluice-control"
	ConfigVolume     = "sluice-config"
	ControlMountPath = "/sluice"
	ConfigMountPath  = "/etc/sluice"
	// MetricsPort serves the sidecar's /metrics, /readyz and /healthz.
	MetricsPort = 9090
	// SidecarUID is the sidecar's user and group: non-root, as in distroless's nonroot.
	SidecarUID = 65532
)

// Options are the installation's settings.
type Options struct {
	// Image is the sluice image the sidecar runs.
	Image string
	// ImagePullPolicy of the sidecar (default IfNotPresent).
	ImagePullPolicy corev1.PullPolicy
	// Driver is the CSI driver name (default csidriver.DefaultName).
	Driver string
	// Resources of the sidecar; zero means small requests and no limits.
	Resources corev1.ResourceRequirements
}

// Instance says which step instance a pod runs.
type Instance struct {
	// Step is the declared step's name.
	Step string
	// Instance is the 0-based instance, below the step's replicas.
	Instance int
	// MountPath is where app containers see the volume; empty: spec.volume.mountPath.
	MountPath string
	// Mode is "fuse" or "direct"; empty: fuse.
	Mode string
}

// Pod injects pod (in place) as instance in of workflow wf. It fails, naming the field,
// when the step is not declared or the pod already holds a Sluice sidecar or volume;
// injecting a pod that carries AnnotationInjected does nothing.
func Pod(pod *corev1.Pod, wf *v1alpha1.Workflow, in Instance, opts Options) error {
	if pod.Annotations[AnnotationInjected] == "true" {
		return nil
	}
	found := false
	for _, s := range wf.Spec.Steps {
		found = found || s.Name == in.Step
	}
	if !found {
		return fmt.Errorf("step %q is not declared by Workflow %s/%s", in.Step, wf.Namespace, wf.Name)
	}
	if in.Instance < 0 {
		return fmt.Errorf("instance %d is negative", in.Instance)
	}
	mode := in.Mode
	if mode == "" {
		mode = csidriver.ModeFUSE
	}
	if mode != csidriver.ModeFUSE && mode != csidriver.ModeDirect {
		return fmt.Errorf("mode %q: want %s or %s", mode, csidriver.ModeFUSE, csidriver.ModeDirect)
	}
	mountPath := in.MountPath
	if mountPath == "" {
		mountPath = wf.Spec.Volume.MountPath
	}
	if mountPath == "" {
		mountPath = "/data"
	}
	if mountPath[0] != '/' {
		return fmt.Errorf("mount path %q is not absolute", mountPath)
	}
	for _, v := range pod.Spec.Volumes {
		if v.Name == VolumeName || v.Name == ControlVolume || v.Name == ConfigVolume {
			return fmt.Errorf("spec.volumes: the pod already has a volume named %q", v.Name)
		}
	}
	for _, c := range pod.Spec.InitContainers {
		if c.Name == SidecarName {
			return fmt.Errorf("spec.initContainers: the pod already has a container named %q", SidecarName)
		}
	}
	driver := opts.Driver
	if driver == "" {
		driver = csidriver.DefaultName
	}
	pull := opts.ImagePullPolicy
	if pull == "" {
		pull = corev1.PullIfNotPresent
	}

	attrs := func(role string) map[string]string {
		return map[string]string{
			csidriver.AttrWorkflow: wf.Name,
			csidriver.AttrStep:     in.Step,
			csidriver.AttrInstance: strconv.Itoa(in.Instance),
			csidriver.AttrRole:     role,
			csidriver.AttrMode:     mode,
		}
	}
	pod.Spec.Volumes = append(pod.Spec.Volumes,
		corev1.Volume{Name: VolumeName, VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
			Driver: driver, VolumeAttributes: attrs(csidriver.RoleApp)}}},
		corev1.Volume{Name: ControlVolume, VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
			Driver: driver, VolumeAttributes: attrs(csidriver.RoleSidecar)}}},
		// World-readable inside the volume because the kubelet writes Secret files as root
		// and the sidecar runs as SidecarUID without a pod-wide fsGroup; only the sidecar
		// mounts this volume, so no app container can read the credentials.
		corev1.Volume{Name: ConfigVolume, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName: podconfig.SecretName(wf.Name), DefaultMode: ptr.To[int32](0o444)}}},
	)

	env := []corev1.EnvVar{
		{Name: "SLUICE_DIR", Value: mountPath},
		{Name: "SLUICE_WORKFLOW", Value: wf.Name},
		{Name: "SLUICE_STEP", Value: in.Step},
		{Name: "SLUICE_INSTANCE", Value: strconv.Itoa(in.Instance)},
		{Name: "SLUICE_REPLICAS", Value: strconv.Itoa(int(replicas(wf, in.Step)))},
	}
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		for _, m := range c.VolumeMounts {
			if m.MountPath == mountPath {
				return fmt.Errorf("spec.containers[%d].volumeMounts: %q already has a volume at %s", i, c.Name, mountPath)
			}
		}
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: VolumeName, MountPath: mountPath})
		c.Env = append(withoutSluiceEnv(c.Env), env...)
	}

	resources := opts.Resources
	if resources.Requests == nil && resources.Limits == nil {
		resources.Requests = corev1.ResourceList{
			corev1.ResourceCPU:    resource.MustParse("50m"),
			corev1.ResourceMemory: resource.MustParse("64Mi"),
		}
	}
	sidecar := corev1.Container{
		Name:            SidecarName,
		Image:           opts.Image,
		ImagePullPolicy: pull,
		Args: []string{"sidecar", "--control-dir=" + ControlMountPath, "--config-dir=" + ConfigMountPath,
			"--metrics-addr=:" + strconv.Itoa(MetricsPort)},
		RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways),
		Ports:         []corev1.ContainerPort{{Name: "sluice-metrics", ContainerPort: MetricsPort, Protocol: corev1.ProtocolTCP}},
		Env: []corev1.EnvVar{
			{Name: "GOMEMLIMIT", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{
				ContainerName: SidecarName, Resource: "limits.memory"}}},
		},
		VolumeMounts: []corev1.VolumeMount{
			{Name: ControlVolume, MountPath: ControlMountPath},
			{Name: ConfigVolume, MountPath: ConfigMountPath, ReadOnly: true},
		},
		Resources: resources,
		StartupProbe: &corev1.Probe{
			ProbeHandler:     corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromInt32(MetricsPort)}},
			PeriodSeconds:    1,
			FailureThreshold: 300,
		},
		LivenessProbe: &corev1.Probe{
			ProbeHandler:     corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(MetricsPort)}},
			PeriodSeconds:    10,
			FailureThreshold: 6,
		},
		SecurityContext: &corev1.SecurityContext{
			RunAsNonRoot:             ptr.To(true),
			RunAsUser:                ptr.To[int64](SidecarUID),
			RunAsGroup:               ptr.To[int64](SidecarUID),
			ReadOnlyRootFilesystem:   ptr.To(true),
			AllowPrivilegeEscalation: ptr.To(false),
			Privileged:               ptr.To(false),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	}
	// The sidecar goes first: init containers before it would find the volume unserved.
	pod.Spec.InitContainers = append([]corev1.Container{sidecar}, pod.Spec.InitContainers...)

	if pod.Labels == nil {
		pod.Labels = map[string]string{}
	}
	pod.Labels[LabelWorkflow] = wf.Name
	pod.Labels[LabelStep] = in.Step
	pod.Labels[LabelInstance] = strconv.Itoa(in.Instance)
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[AnnotationInjected] = "true"
	return nil
}

// replicas is the declared number of instances of step (1 if unset or undeclared).
func replicas(wf *v1alpha1.Workflow, step string) int32 {
	for _, s := range wf.Spec.Steps {
		if s.Name == step && s.Replicas != nil {
			return *s.Replicas
		}
	}
	return 1
}

func withoutSluiceEnv(env []corev1.EnvVar) []corev1.EnvVar {
	out := env[:0:0]
	for _, e := range env {
		if len(e.Name) < 7 || e.Name[:7] != "SLUICE_" {
			out = append(out, e)
		}
	}
	return out
}

// InstanceFromAnnotations reads the step instance a labelled pod asks for. The errors
// name the annotation.
func InstanceFromAnnotations(pod *corev1.Pod) (wf string, in Instance, err error) {
	a := pod.Annotations
	wf = a[AnnotationWorkflow]
	if wf == "" {
		return "", in, fmt.Errorf("annotation %s is required on a pod labelled %s=true", AnnotationWorkflow, LabelInject)
	}
	in.Step = a[AnnotationStep]
	if in.Step == "" {
		return "", in, fmt.Errorf("annotation %s is required on a pod labelled %s=true", AnnotationStep, LabelInject)
	}
	idx := a[AnnotationInstance]
	if idx == "" {
		idx = a[jobCompletionIndex]
	}
	if idx != "" {
		n, err := strconv.Atoi(idx)
		if err != nil || n < 0 {
			return "", in, fmt.Errorf("annotation %s: %q is not a non-negative integer", AnnotationInstance, idx)
		}
		in.Instance = n
	}
	in.MountPath = a[AnnotationMountPath]
	if in.MountPath != "" && in.MountPath[0] != '/' {
		return "", in, fmt.Errorf("annotation %s: %q is not an absolute path", AnnotationMountPath, in.MountPath)
	}
	in.Mode = a[AnnotationMode]
	return wf, in, nil
}
