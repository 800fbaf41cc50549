package v1alpha1

import "time"

// This file is Sluice's wire contract with the rest of a cluster, in one place (as
// k8s.io/api's well_known_labels.go): every label, annotation, CSI volume attribute,
// finalizer and Secret key another component, a user or a manifest may read or write, and
// the defaults more than one component relies on. Every package imports these; none
// defines its own.

// Labels on pods. LabelInject is the user's request; the others are set on every step pod
// (by the controller on the pods it creates, by the webhook on the pods it injects).
const (
	// LabelInject on a pod ("true") sends it through the mutating webhook (its
	// objectSelector), which adds the streaming volume and the sidecar.
	LabelInject = "sluice.io/inject"
	// LabelWorkflow names the pod's Workflow, in the pod's namespace. A pod labelled
	// LabelInject may set it itself to name the Workflow it joins (as AnnotationWorkflow,
	// the same key); on any other pod admission refuses it.
	LabelWorkflow = "sluice.io/workflow"
	// LabelStep names the step the pod runs; a pod labelled LabelInject may set it itself
	// (as AnnotationStep).
	LabelStep = "sluice.io/step"
	// LabelInstance is the pod's 0-based step instance; a pod labelled LabelInject may set
	// it itself (as AnnotationInstance).
	LabelInstance = "sluice.io/instance"
)

// Annotations on pods.
const (
	// AnnotationWorkflow names the Workflow of a pod labelled LabelInject, in the pod's
	// namespace. Required, as this annotation or as the label LabelWorkflow.
	AnnotationWorkflow = "sluice.io/workflow"
	// AnnotationStep names the step a pod labelled LabelInject runs. Required, as this
	// annotation or as the label LabelStep.
	AnnotationStep = "sluice.io/step"
	// AnnotationInstance is the 0-based instance of a pod labelled LabelInject (or the
	// label LabelInstance); it defaults to the number the pod's engine gives it (an
	// Indexed Job's completion index, ...: controller/inject.InstanceFromPod), else 0.
	AnnotationInstance = "sluice.io/instance"
	// AnnotationMountPath is where the app containers see the volume; it defaults to
	// the Workflow's spec.volume.mountPath.
	AnnotationMountPath = "sluice.io/mount-path"
	// AnnotationMode is the volume's mode: ModeFUSE (default) or ModeDirect.
	AnnotationMode = "sluice.io/mode"
	// AnnotationInjected is set on a pod once the webhook injected it, so injection is
	// never repeated.
	AnnotationInjected = "sluice.io/injected"
	// AnnotationAttempt numbers the pods of one step instance the controller creates: 0
	// first, then one more for each retry.
	AnnotationAttempt = "sluice.io/attempt"
)

// Annotations a Workflow imported from CAPIO-CL carries (sluice capio import).
const (
	// AnnotationCAPIOName keeps the CAPIO-CL name when it is not a valid Kubernetes name.
	AnnotationCAPIOName = "capio-cl.sluice.io/name"
	// AnnotationCAPIOVersion keeps the version of the imported document.
	AnnotationCAPIOVersion = "capio-cl.sluice.io/version"
	// AnnotationCAPIOConfiguration keeps the CAPIO-CL "configuration" (a TOML path,
	// CAPIO-CL 1.1), so that an export gives it back.
	AnnotationCAPIOConfiguration = "capio-cl.sluice.io/configuration"
)

// The CSI driver (CSI spec: the driver name of GetPluginInfo, NodeGetInfo's topology).
const (
	// DriverName is the CSI driver's name, of its CSIDriver object and of every inline
	// volume's driver field.
	DriverName = "csi.sluice.io"
	// TopologyKey is the topology segment NodeGetInfo reports: the node's name.
	TopologyKey = "topology.sluice.io/node"
)

// Volume attributes of the driver's CSI ephemeral inline volumes (volumeAttributes).
const (
	// VolumeAttrWorkflow names the Workflow, in the pod's namespace. Required.
	VolumeAttrWorkflow = "sluice.io/workflow"
	// VolumeAttrStep names the step the pod runs. Required for RoleApp.
	VolumeAttrStep = "sluice.io/step"
	// VolumeAttrInstance is the 0-based instance of the step; it defaults to 0.
	VolumeAttrInstance = "sluice.io/instance"
	// VolumeAttrRole is RoleApp (default) or RoleSidecar.
	VolumeAttrRole = "sluice.io/role"
	// VolumeAttrMode is ModeFUSE (default) or ModeDirect.
	VolumeAttrMode = "sluice.io/mode"
	// VolumeAttrWorkflowUID is the Workflow's metadata.uid when the volume was injected.
	VolumeAttrWorkflowUID = "sluice.io/workflow-uid"
	// VolumeAttrMark is the injector's mark over the other attributes and the pod's
	// namespace (internal/volumemark); a node plugin given the mark key publishes no
	// volume without a valid one.
	VolumeAttrMark = "sluice.io/mark"
)

// Values of VolumeAttrRole and of VolumeAttrMode (and AnnotationMode).
const (
	// RoleApp is the streaming volume the app containers mount.
	RoleApp = "app"
	// RoleSidecar is the sidecar's control volume (the FUSE device, the node store).
	RoleSidecar = "sidecar"
	// ModeFUSE serves the volume through the sidecar's FUSE view, which waits as the
	// rules say.
	ModeFUSE = "fuse"
	// ModeDirect bind-mounts the node store itself: no FUSE, no waiting (for steps that
	// only read committed inputs or only write).
	ModeDirect = "direct"
)

// Finalizer holds a Workflow until its stream, metadata and node stores are removed.
const Finalizer = "sluice.io/cleanup"

// LabelManagedBy and ManagedBy mark the Secrets Sluice creates (Kubernetes recommended
// labels); the controller's cache holds only those.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedBy      = "sluice"
)

// Keys of a workflow's sidecar configuration Secret (file names where it is mounted).
const (
	// SecretKeyWorkflow is the Workflow (YAML) as the controller saw it.
	SecretKeyWorkflow = "workflow.yaml"
	// SecretKeyNATSURL is the NATS URL the sidecars connect to.
	SecretKeyNATSURL = "nats.url"
	// SecretKeyNATSCreds is a NATS credentials file (user JWT and seed) allowed only
	// the workflow's subjects.
	SecretKeyNATSCreds = "nats.creds"
	// SecretKeyNATSInbox is the inbox prefix the credentials allow (replies to this
	// workflow's sidecars only).
	SecretKeyNATSInbox = "nats.inbox"
	// SecretKeyStorage is the object storage of permanent outputs (JSON), if any.
	SecretKeyStorage = "storage.json"
	// SecretKeyInstallationCA is the installation's CA certificate (PEM), when its
	// bundled NATS and MinIO serve TLS: the sidecars and store servers trust it, besides
	// the system's roots, for NATS and for the installation's object storage. It is the
	// CA's certificate only, never its key.
	SecretKeyInstallationCA = "ca.crt"
)

// DefaultAgentUser is the user and group ID of the sidecars and store servers of a
// Workflow without status.agentUser (one provisioned before the controller chose one
// per workflow), and of every workflow when the controller has no --agent-users range:
// distroless's nonroot.
const DefaultAgentUser = 65532

// The node agents' configuration. For every provisioned Workflow the controller keeps a
// Secret in the agent namespace (a namespace of the installation holding nothing else,
// DefaultAgentNamespace), named AgentSecretPrefix and the Workflow's UID: the NATS
// connection of the workflow's serving peer on each node (SecretKeyNATSURL,
// SecretKeyNATSCreds, SecretKeyNATSInbox, and SecretKeyInstallationCA when NATS serves
// TLS), labelled LabelManagedBy, LabelAgentNamespace and LabelWorkflow. The CSI node
// plugins read it from the API (get on Secrets of that namespace only) and hand it to the
// workflow's store server on the node: nothing of it comes from a pod.
const (
	// AgentSecretPrefix starts the name of a workflow's agent Secret.
	AgentSecretPrefix = "sluice-agent-"
	// DefaultAgentNamespace is the agent namespace of deploy/base and of the Helm
	// chart's default values.
	DefaultAgentNamespace = "sluice-agents"
	// LabelAgentNamespace on an agent Secret names its Workflow's namespace.
	LabelAgentNamespace = "sluice.io/workflow-namespace"
)

// Keys of the installation's NATS Secret, which the controller bootstraps.
const (
	// SecretKeyNATSOperator, SecretKeyNATSSystem and SecretKeyNATSAccount are the
	// operator's, the system account's and the workflows' account's NKey seeds.
	SecretKeyNATSOperator = "operator.nk"
	SecretKeyNATSSystem   = "system.nk"
	SecretKeyNATSAccount  = "account.nk"
	// SecretKeyNATSConfig is nats-server's configuration file; the NATS pod mounts
	// this key only.
	SecretKeyNATSConfig = "nats.conf"
)

// Keys of the webhook's certificate Secret, and of the TLS Secret of the bundled NATS and
// MinIO (the serving pair as corev1.TLSCertKey and corev1.TLSPrivateKeyKey, "tls.crt" and
// "tls.key"; cert-manager's Certificate writes the same keys but ca.key).
const (
	// SecretKeyCA is the CA certificate: the one the webhook configuration trusts, or
	// the one every client of the bundled NATS and MinIO trusts.
	SecretKeyCA = "ca.crt"
	// SecretKeyCAKey is the CA's private key, which signs a renewed serving pair.
	SecretKeyCAKey = "ca.key"
)

// Defaults more than one component relies on.
const (
	// DefaultDrainTimeout bounds a sidecar's work after SIGTERM: waiting for the app's
	// write handles, recording the outcome, publishing and uploading permanent outputs
	// (sluice sidecar --drain-timeout).
	DefaultDrainTimeout = 10 * time.Minute
	// DrainGracePeriodSeconds is the terminationGracePeriodSeconds the controller gives
	// step pods whose template sets none (the API's default is 30 s): DefaultDrainTimeout,
	// so that permanent outputs still uploading when the app exits are stored.
	DrainGracePeriodSeconds = int64(DefaultDrainTimeout / time.Second)
)
