// Package inject turns a pod into a Sluice step instance: it adds the native sidecar
// (`sluice sidecar`, an init container with restartPolicy Always), the two CSI ephemeral
// inline volumes of the csi.sluice.io driver (the streaming volume the app containers
// mount, and the control volume through which the sidecar receives the FUSE descriptor),
// the workflow's configuration Secret, and the SLUICE_* environment. The admission
// webhook applies it to labelled pods, the controller to the pods it creates, so both
// kinds of pods are the same.
package inject

import (
	"errors"
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/podconfig"
	"github.com/sluice-io/sluice/internal/volumemark"
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
	// SidecarUID is the sidecar's user and group of a Workflow without status.agentUser:
	// non-root, as in distroless's nonroot (v1alpha1.DefaultAgentUser).
	SidecarUID = v1alpha1.DefaultAgentUser
)

// Options are the installation's settings.
type Options struct {
	// Image is the sluice image the sidecar runs.
	Image string
	// ImagePullPolicy of the sidecar (default IfNotPresent).
	ImagePullPolicy corev1.PullPolicy
	// Driver is the CSI driver name (default v1alpha1.DriverName).
	Driver string
	// Resources of the sidecar; zero means small requests and no limits.
	Resources corev1.ResourceRequirements
	// MarkKey signs the volumes' attributes (internal/volumemark), so that the node
	// plugins, which hold the same key, publish them; nil adds no mark.
	MarkKey []byte
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
	if pod.Annotations[v1alpha1.AnnotationInjected] == "true" {
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
		mode = v1alpha1.ModeFUSE
	}
	if mode != v1alpha1.ModeFUSE && mode != v1alpha1.ModeDirect {
		return fmt.Errorf("mode %q: want %s or %s", mode, v1alpha1.ModeFUSE, v1alpha1.ModeDirect)
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
	if pod.Spec.ShareProcessNamespace != nil && *pod.Spec.ShareProcessNamespace {
		// Every container would see the sidecar's process, and one of its user could
		// signal it; its /proc entries are closed to them (the sidecar is not dumpable),
		// the namespace is refused as well.
		return errors.New("spec.shareProcessNamespace: a pod with Sluice's sidecar does not share its process namespace (the sidecar holds the workflow's credentials); remove it")
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
		driver = v1alpha1.DriverName
	}
	pull := opts.ImagePullPolicy
	if pull == "" {
		pull = corev1.PullIfNotPresent
	}

	attrs := func(role string) map[string]string {
		a := map[string]string{
			v1alpha1.VolumeAttrWorkflow: wf.Name,
			v1alpha1.VolumeAttrStep:     in.Step,
			v1alpha1.VolumeAttrInstance: strconv.Itoa(in.Instance),
			v1alpha1.VolumeAttrRole:     role,
			v1alpha1.VolumeAttrMode:     mode,
		}
		if opts.MarkKey != nil {
			a[v1alpha1.VolumeAttrWorkflowUID] = string(wf.UID)
			a[v1alpha1.VolumeAttrMark] = volumemark.Sign(opts.MarkKey, volumemark.Mark{Namespace: wf.Namespace, Workflow: wf.Name,
				WorkflowUID: string(wf.UID), Step: in.Step, Instance: in.Instance, Role: role, Mode: mode})
		}
		return a
	}
	pod.Spec.Volumes = append(pod.Spec.Volumes,
		corev1.Volume{Name: VolumeName, VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
			Driver: driver, VolumeAttributes: attrs(v1alpha1.RoleApp)}}},
		corev1.Volume{Name: ControlVolume, VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
			Driver: driver, VolumeAttributes: attrs(v1alpha1.RoleSidecar)}}},
		// World-readable inside the volume because the kubelet writes Secret files as root
		// and the sidecar runs as its workflow's user without a pod-wide fsGroup; only the sidecar
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
			RunAsUser:                ptr.To(agentUser(wf)),
			RunAsGroup:               ptr.To(agentUser(wf)),
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
	pod.Labels[v1alpha1.LabelWorkflow] = wf.Name
	pod.Labels[v1alpha1.LabelStep] = in.Step
	pod.Labels[v1alpha1.LabelInstance] = strconv.Itoa(in.Instance)
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[v1alpha1.AnnotationInjected] = "true"
	return nil
}

// agentUser is the user and group ID wf's sidecars run as: status.agentUser, which the
// controller chose for the workflow alone, or SidecarUID without one.
func agentUser(wf *v1alpha1.Workflow) int64 {
	if wf.Status.AgentUser != nil {
		return *wf.Status.AgentUser
	}
	return SidecarUID
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
