package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// FileType says whether an output names regular files or a directory.
// +kubebuilder:validation:Enum=File;Directory
type FileType string

const (
	// FileTypeFile is a regular file (or every regular file a glob matches).
	FileTypeFile FileType = "File"
	// FileTypeDirectory is a directory; its rule also applies to the files created in it
	// that have no rule of their own (CAPIO-CL "dirname" rules).
	FileTypeDirectory FileType = "Directory"
)

// CommitRule is the CAPIO-CL commit rule: when a file receives no more data.
// +kubebuilder:validation:Enum=OnTermination;OnClose;OnFile;OnNFiles
type CommitRule string

const (
	// CommitOnTermination commits when the producer instances have exited: all of them, or
	// commit.count of them (CAPIO-CL on_termination).
	CommitOnTermination CommitRule = "OnTermination"
	// CommitOnClose commits when producers have closed the file commit.count times in
	// total, summed over all writers (CAPIO-CL on_close[:N]); count defaults to 1.
	CommitOnClose CommitRule = "OnClose"
	// CommitOnFile commits when every file in commit.files is committed (CAPIO-CL on_file
	// with file_deps).
	CommitOnFile CommitRule = "OnFile"
	// CommitOnNFiles commits a directory once it holds commit.count committed files
	// (CAPIO-CL on_n_files with n_files). Directories only.
	CommitOnNFiles CommitRule = "OnNFiles"
)

// FireRule is the CAPIO-CL firing rule (mode): when a consumer may read.
// +kubebuilder:validation:Enum=Update;NoUpdate
type FireRule string

const (
	// FireUpdate ("fire on commit", CAPIO-CL update): nothing is visible before commit.
	FireUpdate FireRule = "Update"
	// FireNoUpdate ("fire, no update", CAPIO-CL no_update): bytes are readable as soon as
	// they are written; producers promise never to rewrite them. Directory entries appear
	// as they are created.
	FireNoUpdate FireRule = "NoUpdate"
)

// Lifetime says how long a temporary (not permanent) output's bytes are kept.
// +kubebuilder:validation:Enum=Workflow;Consumed
type Lifetime string

const (
	// LifetimeWorkflow keeps a file until the workflow ends (the default).
	LifetimeWorkflow Lifetime = "Workflow"
	// LifetimeConsumed deletes a committed file from every node store once every instance
	// of every step that declares it as an input has exited successfully, freeing its
	// space for what comes next (as TaskVine frees temporaries after their last consumer).
	LifetimeConsumed Lifetime = "Consumed"
)

// Replication says how an output's bytes reach the other nodes.
// +kubebuilder:validation:Enum=Fetch;Stream
type Replication string

const (
	// ReplicateFetch keeps the bytes on the node that wrote them until a reader on another
	// node reads them, and fetches them from there then (the default).
	ReplicateFetch Replication = "Fetch"
	// ReplicateStream also copies every byte into the workflow's JetStream stream as it is
	// written, and every node stores every file: the output survives the loss of the node
	// that wrote it, at the cost of the stream's disk, every node's memory and about half
	// the throughput between nodes.
	ReplicateStream Replication = "Stream"
)

// HomeNodePolicy says which node holds a file's bytes (CAPIO-CL home_node_policies).
// +kubebuilder:validation:Enum=Create;Hashing;Manual
type HomeNodePolicy string

const (
	// HomeNodeCreate makes the node of the instance that creates a file its home node.
	HomeNodeCreate HomeNodePolicy = "Create"
	// HomeNodeHashing spreads files over the workflow's nodes by a hash of their path.
	HomeNodeHashing HomeNodePolicy = "Hashing"
	// HomeNodeManual pins files to the node of a named step instance (homeNode.manual).
	HomeNodeManual HomeNodePolicy = "Manual"
)

// Workflow declares a graph of steps that exchange files through a streaming volume, with
// the commit and firing rule of every file they produce.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=swf,categories=sluice
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Steps",type=string,JSONPath=`.status.progress`,description="steps done/total"
// +kubebuilder:printcolumn:name="Files",type=integer,JSONPath=`.status.files.committed`,description="files committed"
// +kubebuilder:printcolumn:name="Step progress",type=string,JSONPath=`.status.stepProgress`,description="done/total instances per step"
// +kubebuilder:printcolumn:name="Waiting",type=string,JSONPath=`.status.waiting`,description="the oldest request waiting on the rules: instance, request, file and rule"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Workflow struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the desired state: steps, files and their rules.
	Spec WorkflowSpec `json:"spec,omitempty"`
	// Status is what the controller observed.
	Status WorkflowStatus `json:"status,omitempty"`
}

// WorkflowSpec is the desired state of a Workflow.
type WorkflowSpec struct {
	// Volume says where every step sees the streaming volume and how large it may grow.
	// +optional
	// +kubebuilder:default={}
	Volume VolumeSpec `json:"volume,omitempty"`

	// Aliases name groups of files; an alias name may be used wherever a file is
	// (CAPIO-CL aliases).
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=256
	Aliases []Alias `json:"aliases,omitempty"`

	// Steps are the programs of the workflow. Step names are unique.
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=128
	Steps []Step `json:"steps"`

	// Permanent lists files, globs, directories or aliases kept after the workflow ends:
	// they are uploaded to object storage when they commit.
	// +optional
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MaxLength=4096
	// +kubebuilder:validation:items:Pattern=`^[^/]{0,255}(/[^/]{0,255})*$`
	Permanent []string `json:"permanent,omitempty"`

	// Exclude lists files, globs, directories or aliases that behave as plain node-local
	// files: no rule applies to them and they are never streamed.
	// +optional
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MaxLength=4096
	// +kubebuilder:validation:items:Pattern=`^[^/]{0,255}(/[^/]{0,255})*$`
	Exclude []string `json:"exclude,omitempty"`

	// HomeNode says which node holds each file's bytes. Defaults to policy Create.
	// +optional
	HomeNode *HomeNodeSpec `json:"homeNode,omitempty"`

	// Tiers says which files are kept in node memory and which on a node's filesystem
	// (CAPIO-CL storage). Files in neither list follow the volume's default (memory).
	// +optional
	Tiers *TierSpec `json:"tiers,omitempty"`

	// Storage is the S3-compatible object storage that receives permanent files.
	// +optional
	Storage *StorageSpec `json:"storage,omitempty"`

	// Sources are files brought into the volume from object storage (stage-in) when the
	// workflow starts, each with a commit and firing rule like any output: with fire
	// NoUpdate a consumer reads the first bytes while the rest is still downloading. They
	// are produced by the reserved step "sluice-stage-in".
	// +optional
	// +kubebuilder:validation:MaxItems=256
	Sources []Source `json:"sources,omitempty"`

	// WaitTimeout bounds every wait a consumer makes (open, read, readdir) on one file; a
	// wait that runs out fails with EIO and a log line naming the file and its rule.
	// Defaults to 1h.
	// +optional
	WaitTimeout *metav1.Duration `json:"waitTimeout,omitempty"`

	// TTLSecondsAfterFinished is how long a finished Workflow keeps its temporary data
	// (node stores, streams, metadata) before the controller removes it and sets condition
	// DataRemoved (as a Job's ttlSecondsAfterFinished, except that the Workflow object
	// stays). Unset keeps the data until the Workflow is deleted.
	// +optional
	// +kubebuilder:validation:Minimum=0
	TTLSecondsAfterFinished *int32 `json:"ttlSecondsAfterFinished,omitempty"`
}

// VolumeSpec describes the streaming volume every step mounts.
type VolumeSpec struct {
	// MountPath is where the volume appears in every step's containers. Defaults to /data.
	// +optional
	// +kubebuilder:default="/data"
	// +kubebuilder:validation:Pattern=`^/`
	// +kubebuilder:validation:MaxLength=4096
	MountPath string `json:"mountPath,omitempty"`

	// SizeLimit bounds the bytes the workflow may hold in one node store's memory tier. A
	// write beyond it waits for space for a bounded time, then fails with ENOSPC. On a
	// cluster the memory tier is a tmpfs of this size on each node (a Workflow asking for
	// more than the installation's maximum is refused); unset, the installation's default
	// size.
	// +optional
	SizeLimit *resource.Quantity `json:"sizeLimit,omitempty"`

	// Disk is the node store's disk tier, on each node's disk: the files spec.tiers.fs
	// lists are kept there instead of in memory, and committed files not pinned by
	// spec.tiers.memory move there when the memory tier is full (spill). Set (even empty)
	// without tiers.fs, it is the spill target only.
	// +optional
	Disk *DiskSpec `json:"disk,omitempty"`
}

// DiskSpec is a node store's disk tier.
type DiskSpec struct {
	// SizeLimit bounds the bytes the workflow may hold in one node's disk tier. A write
	// beyond it waits for space for a bounded time, then fails with ENOSPC naming the disk
	// tier. Unset: only the size of the file system holding it, or the installation's
	// maximum (a Workflow asking for more is refused).
	// +optional
	SizeLimit *resource.Quantity `json:"sizeLimit,omitempty"`
}

// Alias is a named group of files (CAPIO-CL aliases: group_name and files).
type Alias struct {
	// Name is the alias, usable wherever a file name is.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// Files are the files, globs or directories the alias stands for.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=1024
	// +kubebuilder:validation:items:MaxLength=4096
	// +kubebuilder:validation:items:Pattern=`^[^/]{0,255}(/[^/]{0,255})*$`
	Files []string `json:"files"`
}

// Step is one program of the workflow, run as Replicas instances numbered 0..Replicas-1.
type Step struct {
	// Name identifies the step in the workflow.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9]([-_.A-Za-z0-9]*[A-Za-z0-9])?$`
	Name string `json:"name"`

	// Replicas is the number of instances. Defaults to 1.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100000
	Replicas *int32 `json:"replicas,omitempty"`

	// Template is the pod template of each instance. Without a template the step's pods are
	// created by something else (Argo, Nextflow, a Job) and join by label.
	// +optional
	// +kubebuilder:pruning:PreserveUnknownFields
	// +kubebuilder:validation:Schemaless
	// +kubebuilder:validation:Type=object
	Template *corev1.PodTemplateSpec `json:"template,omitempty"`

	// Inputs are the files, globs, directories or aliases the step reads.
	// +optional
	// +kubebuilder:validation:MaxItems=1024
	// +kubebuilder:validation:items:MaxLength=4096
	// +kubebuilder:validation:items:Pattern=`^[^/]{0,255}(/[^/]{0,255})*$`
	Inputs []string `json:"inputs,omitempty"`

	// Outputs are the files the step writes, each with its commit and firing rule. A step
	// may write, truncate, rename or unlink only paths its outputs declare.
	// +optional
	// +kubebuilder:validation:MaxItems=1024
	Outputs []Output `json:"outputs,omitempty"`

	// Placement says how the controller places the step's pods near their input data:
	// None leaves it to the scheduler, Preferred (default) asks for it, Required insists.
	// +optional
	// +kubebuilder:default=Preferred
	Placement PlacementPolicy `json:"placement,omitempty"`

	// BackoffLimit is how many times a failed instance is run again before the step fails
	// (as in a Job's spec.backoffLimit). Defaults to 0. A failed attempt's outputs are
	// withdrawn and the rerun writes them again from the start (docs/semantics.md, "A
	// failed attempt withdraws its outputs").
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	BackoffLimit *int32 `json:"backoffLimit,omitempty"`
}

// PlacementPolicy says how strongly a step's pods are placed next to their input data.
// +kubebuilder:validation:Enum=None;Preferred;Required
type PlacementPolicy string

const (
	// PlacementNone leaves placement to the scheduler.
	PlacementNone PlacementPolicy = "None"
	// PlacementPreferred asks the scheduler (preferred affinities) to put an instance on
	// the node of the producers of its NoUpdate inputs, else on the node holding most of
	// its committed input bytes; it falls back to any node with room.
	PlacementPreferred PlacementPolicy = "Preferred"
	// PlacementRequired makes the producer's node a requirement for NoUpdate inputs: the
	// pod waits (Pending) rather than stream its inputs across nodes.
	PlacementRequired PlacementPolicy = "Required"
)

// Output declares files a step produces and their CAPIO-CL rules.
// +kubebuilder:validation:XValidation:rule="!has(self.commit) || !has(self.commit.rule) || self.commit.rule != 'OnNFiles' || (has(self.type) && self.type == 'Directory')",message="commit.rule OnNFiles applies only to type Directory",fieldPath=".commit.rule"
// +kubebuilder:validation:XValidation:rule="!has(self.lifetime) || self.lifetime != 'Consumed' || !has(self.type) || self.type != 'Directory'",message="lifetime Consumed applies to files, not to type Directory",fieldPath=".lifetime"
type Output struct {
	// Path is a file, a glob (*, ?, [...]), a directory or an alias, relative to the volume
	// root (a leading "/" also means the volume root). Like every file list's entries it
	// is at most 4,096 characters, each "/"-separated segment at most 255 (the compiler
	// counts bytes of UTF-8; docs/workflow-reference.md, "Limits").
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=4096
	// +kubebuilder:validation:Pattern=`^[^/]{0,255}(/[^/]{0,255})*$`
	Path string `json:"path"`

	// Type says whether Path names files or a directory. Defaults to File.
	// +optional
	// +kubebuilder:default=File
	Type FileType `json:"type,omitempty"`

	// Commit is the commit rule. Defaults to OnTermination of all producer instances.
	// +optional
	// +kubebuilder:default={}
	Commit CommitSpec `json:"commit,omitempty"`

	// Fire is the firing rule. Defaults to Update.
	// +optional
	// +kubebuilder:default=Update
	Fire FireRule `json:"fire,omitempty"`

	// Lifetime is how long the files' bytes are kept: Workflow (default) until the
	// workflow ends, Consumed until every instance of every step that declares them as
	// inputs has exited successfully. Consumed is for temporary files only (not permanent,
	// not directories) that some step declares as an input.
	// +optional
	// +kubebuilder:default=Workflow
	Lifetime Lifetime `json:"lifetime,omitempty"`

	// Replicate is how the files' bytes reach the other nodes: Fetch (default) from the
	// node that wrote them when a reader there reads them, or Stream, copied through the
	// workflow's stream to every node as they are written, for outputs that must survive
	// the loss of that node.
	// +optional
	// +kubebuilder:default=Fetch
	Replicate Replication `json:"replicate,omitempty"`
}

// CommitSpec is a commit rule with its parameter.
// +kubebuilder:validation:XValidation:rule="!has(self.rule) || self.rule != 'OnNFiles' || has(self.count)",message="commit.count is required with rule OnNFiles",fieldPath=".count"
// +kubebuilder:validation:XValidation:rule="!has(self.rule) || self.rule != 'OnFile' || (has(self.files) && size(self.files) > 0)",message="commit.files must name at least one file with rule OnFile",fieldPath=".files"
// +kubebuilder:validation:XValidation:rule="!has(self.files) || (has(self.rule) && self.rule == 'OnFile')",message="commit.files is allowed only with rule OnFile",fieldPath=".files"
// +kubebuilder:validation:XValidation:rule="!has(self.count) || !has(self.rule) || self.rule != 'OnFile'",message="commit.count is not allowed with rule OnFile",fieldPath=".count"
type CommitSpec struct {
	// Rule is the commit rule. Defaults to OnTermination.
	// +optional
	// +kubebuilder:default=OnTermination
	Rule CommitRule `json:"rule,omitempty"`

	// Count is the rule's number: closes for OnClose (default 1), producer instances for
	// OnTermination (default all), committed files for OnNFiles (required).
	// +optional
	// +kubebuilder:validation:Minimum=1
	Count *int32 `json:"count,omitempty"`

	// Files are the files (or aliases, or directories) whose commit commits this one, for
	// rule OnFile.
	// +optional
	// +kubebuilder:validation:MaxItems=1024
	// +kubebuilder:validation:items:MaxLength=4096
	// +kubebuilder:validation:items:Pattern=`^[^/]{0,255}(/[^/]{0,255})*$`
	Files []string `json:"files,omitempty"`
}

// StageInStep is the reserved name of the step that produces spec.sources.
const StageInStep = "sluice-stage-in"

// Source is a file, or a tree of files, staged into the volume from object storage.
// +kubebuilder:validation:XValidation:rule="self.from.startsWith('s3://') || self.from.startsWith('file:///')",message="from must be an s3://bucket/key URL or, for sluice run, a file:/// path",fieldPath=".from"
type Source struct {
	// Path is where the file appears in the volume; for a prefix or a directory (type
	// Directory), the directory that receives the files under it.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=4096
	// +kubebuilder:validation:Pattern=`^[^/]{0,255}(/[^/]{0,255})*$`
	Path string `json:"path"`

	// From is s3://bucket/key (or s3://bucket/prefix/ for every object under a prefix,
	// with type Directory), or file:///path for sluice run.
	// +kubebuilder:validation:MinLength=6
	// +kubebuilder:validation:MaxLength=4096
	From string `json:"from"`

	// Type is File (default) or Directory (a prefix or a local directory).
	// +optional
	// +kubebuilder:default=File
	Type FileType `json:"type,omitempty"`

	// Commit is the commit rule of the staged files. Defaults to OnClose: a file commits
	// when its download completes.
	// +optional
	// +kubebuilder:default={rule: OnClose}
	Commit CommitSpec `json:"commit,omitempty"`

	// Fire is the firing rule. Defaults to NoUpdate: bytes are readable as they arrive.
	// +optional
	// +kubebuilder:default=NoUpdate
	Fire FireRule `json:"fire,omitempty"`
}

// HomeNodeSpec says which node holds each file's bytes (CAPIO-CL home_node_policies).
// +kubebuilder:validation:XValidation:rule="!has(self.policy) || self.policy != 'Manual' || (has(self.manual) && size(self.manual) > 0)",message="homeNode.manual must pin at least one group of files with policy Manual",fieldPath=".manual"
type HomeNodeSpec struct {
	// Policy applies to files not listed in Create, Hashing or Manual. Defaults to Create.
	// +optional
	// +kubebuilder:default=Create
	Policy HomeNodePolicy `json:"policy,omitempty"`

	// Create lists files whose home is the node that creates them.
	// +optional
	// +kubebuilder:validation:MaxItems=1024
	// +kubebuilder:validation:items:MaxLength=4096
	// +kubebuilder:validation:items:Pattern=`^[^/]{0,255}(/[^/]{0,255})*$`
	Create []string `json:"create,omitempty"`

	// Hashing lists files spread over the workflow's nodes by a hash of their path.
	// +optional
	// +kubebuilder:validation:MaxItems=1024
	// +kubebuilder:validation:items:MaxLength=4096
	// +kubebuilder:validation:items:Pattern=`^[^/]{0,255}(/[^/]{0,255})*$`
	Hashing []string `json:"hashing,omitempty"`

	// Manual pins groups of files to the node of a step instance.
	// +optional
	// +kubebuilder:validation:MaxItems=256
	Manual []ManualHomeNode `json:"manual,omitempty"`
}

// ManualHomeNode pins files to the node where an instance of a step runs.
type ManualHomeNode struct {
	// Files are the files, globs, directories or aliases pinned.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=1024
	// +kubebuilder:validation:items:MaxLength=4096
	// +kubebuilder:validation:items:Pattern=`^[^/]{0,255}(/[^/]{0,255})*$`
	Files []string `json:"files"`

	// Step names the step whose node holds the files.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Step string `json:"step"`

	// Instance is the step instance (0-based). Defaults to 0.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Instance *int32 `json:"instance,omitempty"`
}

// TierSpec assigns files to storage tiers of the node store (CAPIO-CL storage).
type TierSpec struct {
	// Memory lists files kept in node memory.
	// +optional
	// +kubebuilder:validation:MaxItems=1024
	// +kubebuilder:validation:items:MaxLength=4096
	// +kubebuilder:validation:items:Pattern=`^[^/]{0,255}(/[^/]{0,255})*$`
	Memory []string `json:"memory,omitempty"`

	// FS lists files kept on the node's filesystem. Not enforced yet: node stores have
	// only a memory tier, and validation warns that the list has no effect.
	// +optional
	// +kubebuilder:validation:MaxItems=1024
	// +kubebuilder:validation:items:MaxLength=4096
	// +kubebuilder:validation:items:Pattern=`^[^/]{0,255}(/[^/]{0,255})*$`
	FS []string `json:"fs,omitempty"`
}

// StorageSpec is the S3-compatible object storage that receives permanent files.
type StorageSpec struct {
	// Bucket receives the permanent files.
	// +kubebuilder:validation:MinLength=3
	// +kubebuilder:validation:MaxLength=63
	Bucket string `json:"bucket"`

	// Prefix is prepended to every object key (e.g. "wordcount/").
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Prefix string `json:"prefix,omitempty"`

	// Endpoint is the S3 endpoint as host:port, or an http(s) URL. Empty means the
	// object storage Sluice was deployed with.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Endpoint string `json:"endpoint,omitempty"`

	// SecretRef names a Secret in the Workflow's namespace holding the keys accessKey and
	// secretKey.
	// +optional
	SecretRef *corev1.LocalObjectReference `json:"secretRef,omitempty"`
}

// WorkflowPhase summarises where a Workflow is in its life.
// +kubebuilder:validation:Enum=Pending;Running;Succeeded;Failed
type WorkflowPhase string

const (
	// WorkflowPending means no step instance has started yet.
	WorkflowPending WorkflowPhase = "Pending"
	// WorkflowRunning means at least one step instance is running.
	WorkflowRunning WorkflowPhase = "Running"
	// WorkflowSucceeded means every instance exited 0 and permanent outputs are stored.
	WorkflowSucceeded WorkflowPhase = "Succeeded"
	// WorkflowFailed means an instance failed beyond its retries, or a wait timed out.
	WorkflowFailed WorkflowPhase = "Failed"
)

// Condition types of a Workflow (Kubernetes API conventions: positive polarity,
// metav1.Condition).
const (
	// ConditionReady is True when the workflow's volume, streams and storage are set up.
	ConditionReady = "Ready"
	// ConditionProgressing is True while step instances run or outputs are uploaded.
	ConditionProgressing = "Progressing"
	// ConditionSucceeded is True when the workflow finished and its outputs are stored.
	ConditionSucceeded = "Succeeded"
	// ConditionFailed is True when the workflow cannot finish.
	ConditionFailed = "Failed"
	// ConditionDataRemoved is True once the workflow's temporary data (node stores,
	// streams, metadata) is removed: spec.ttlSecondsAfterFinished after it finished, or when it
	// is deleted. Its permanent outputs stay in object storage.
	ConditionDataRemoved = "DataRemoved"
)

// WorkflowStatus is the observed state of a Workflow.
type WorkflowStatus struct {
	// ObservedGeneration is the metadata.generation this status was computed from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Phase summarises the conditions.
	// +optional
	Phase WorkflowPhase `json:"phase,omitempty"`

	// Progress is "done/total" steps, for kubectl get.
	// +optional
	Progress string `json:"progress,omitempty"`

	// StepProgress is every step's done/total instances and state, for kubectl get, e.g.
	// "split 1/1, count 2/4 waiting, merge 0/1".
	// +optional
	StepProgress string `json:"stepProgress,omitempty"`

	// Waiting is the workflow's oldest request waiting on the rules now (see
	// StepStatus.Waiting), for kubectl get.
	// +optional
	Waiting string `json:"waiting,omitempty"`

	// AgentUser is the Linux user and group ID the workflow's sidecars and its node
	// plugins' store servers run as, on every node: chosen by the controller when it
	// first provisions the workflow, from its --agent-users range, and never the same
	// as another workflow's the controller holds, so that no two workflows' processes
	// share the kernel's per-user limits (inotify, processes) or each other's files.
	// Workflows provisioned before Sluice chose one keep DefaultAgentUser.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=2147483647
	AgentUser *int64 `json:"agentUser,omitempty"`

	// Conditions are Ready, Progressing, Succeeded and Failed.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// Steps is the phase and instance counts of every step.
	// +optional
	// +listType=map
	// +listMapKey=name
	Steps []StepStatus `json:"steps,omitempty"`

	// Files counts files and bytes across the workflow.
	// +optional
	Files FileCounters `json:"files,omitempty"`

	// Nodes are the node stores of the workflow, by node: what its pods' sidecars last
	// recorded.
	// +optional
	// +listType=map
	// +listMapKey=name
	Nodes []NodeStoreStatus `json:"nodes,omitempty"`

	// Outputs are the object URIs of the permanent files stored so far.
	// +optional
	Outputs []PermanentOutput `json:"outputs,omitempty"`

	// RemovedOutputs are the permanent outputs a failed workflow had stored and the
	// controller removed from object storage again, because the step that made them
	// failed, did not deliver, or reads what such a step makes (docs/kubernetes.md,
	// "Only whole results succeed"). They are not in Outputs.
	// +optional
	RemovedOutputs []RemovedOutput `json:"removedOutputs,omitempty"`
}

// StepPhase summarises the instances of one step.
// +kubebuilder:validation:Enum=Pending;Running;Succeeded;Failed
type StepPhase string

const (
	// StepPending means no instance of the step has started.
	StepPending StepPhase = "Pending"
	// StepRunning means at least one instance runs.
	StepRunning StepPhase = "Running"
	// StepSucceeded means every instance exited 0.
	StepSucceeded StepPhase = "Succeeded"
	// StepFailed means an instance failed beyond its retries.
	StepFailed StepPhase = "Failed"
)

// StepStatus is the observed state of one step.
type StepStatus struct {
	// Name is the step's name.
	Name string `json:"name"`
	// Phase summarises the step's instances.
	// +optional
	Phase StepPhase `json:"phase,omitempty"`
	// Running counts instances running now.
	// +optional
	Running int32 `json:"running,omitempty"`
	// Succeeded counts instances that exited 0.
	// +optional
	Succeeded int32 `json:"succeeded,omitempty"`
	// Failed counts instance runs that failed (retries included).
	// +optional
	Failed int32 `json:"failed,omitempty"`
	// Waiting names the step's oldest request waiting on the rules, as its pod's sidecar
	// last recorded it: the instance, the request, the file and its rule, e.g.
	// `c[0]: open of "late.txt" (OnClose:1, Update)`.
	// +optional
	Waiting string `json:"waiting,omitempty"`
	// WaitingSince is when that request started waiting.
	// +optional
	WaitingSince *metav1.Time `json:"waitingSince,omitempty"`
	// Instances are the step's instances that have a pod, by index: where the latest
	// attempt of each runs or ran.
	// +optional
	// +listType=map
	// +listMapKey=instance
	Instances []InstanceStatus `json:"instances,omitempty"`
}

// InstanceStatus is where one instance of a step runs or ran: its latest attempt's pod.
type InstanceStatus struct {
	// Instance is the 0-based instance.
	Instance int32 `json:"instance"`
	// Pod is the name of the latest attempt's pod.
	Pod string `json:"pod"`
	// Node is the node the pod was scheduled to; empty while it is not.
	// +optional
	Node string `json:"node,omitempty"`
	// Phase is the pod's phase.
	// +optional
	Phase corev1.PodPhase `json:"phase,omitempty"`
	// Attempts counts the instance's pods, retries included.
	// +optional
	Attempts int32 `json:"attempts,omitempty"`
}

// FileCounters counts files and bytes across the workflow.
type FileCounters struct {
	// Committed counts committed files.
	// +optional
	Committed int64 `json:"committed,omitempty"`
	// BytesWritten counts bytes written by producers.
	// +optional
	BytesWritten int64 `json:"bytesWritten,omitempty"`
	// BytesStreamed counts data bytes moved between nodes over NATS, once per receiving
	// node (from the counters each pod's sidecar records).
	// +optional
	BytesStreamed int64 `json:"bytesStreamed,omitempty"`
	// BytesStored counts the bytes of permanent outputs stored in object storage.
	// +optional
	BytesStored int64 `json:"bytesStored,omitempty"`
}

// NodeStoreStatus is a workflow's node store on one node, summed over the pods of the
// workflow there (each sidecar accounts its own writes and what it fetched).
type NodeStoreStatus struct {
	// Name is the node's name.
	Name string `json:"name"`
	// MemoryBytes and DiskBytes are the bytes held in the memory tier and in the disk tier
	// (spec.tiers.fs, spilled files).
	// +optional
	MemoryBytes int64 `json:"memoryBytes,omitempty"`
	// +optional
	DiskBytes int64 `json:"diskBytes,omitempty"`
	// SpilledBytes are the bytes of committed files moved from the full memory tier to
	// the disk tier, and ReleasedBytes those of Consumed files deleted, so far.
	// +optional
	SpilledBytes int64 `json:"spilledBytes,omitempty"`
	// +optional
	ReleasedBytes int64 `json:"releasedBytes,omitempty"`
	// ReceivedBytes are the bytes fetched (or replicated) from other nodes.
	// +optional
	ReceivedBytes int64 `json:"receivedBytes,omitempty"`
}

// PermanentOutput is a permanent file stored in object storage.
type PermanentOutput struct {
	// Path is the file's path in the volume.
	Path string `json:"path"`
	// URI is the object's location, s3://bucket/key or file:///path.
	URI string `json:"uri"`
	// Size is the object's size in bytes.
	// +optional
	Size int64 `json:"size,omitempty"`
	// SHA256 is the hex SHA-256 of the object's bytes, equal to the committed file's.
	// +optional
	SHA256 string `json:"sha256,omitempty"`
}

// RemovedOutput is a permanent output removed from object storage because it may rest on
// what failed.
type RemovedOutput struct {
	// Path is the file's path in the volume.
	Path string `json:"path"`
	// URI is where it had been stored.
	URI string `json:"uri"`
	// Reason names the step that made it and the failure it may rest on.
	Reason string `json:"reason"`
}

// WorkflowList is a list of Workflows.
//
// +kubebuilder:object:root=true
type WorkflowList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	// Items are the Workflows.
	Items []Workflow `json:"items"`
}

func init() {
	SchemeBuilder.Register(&Workflow{}, &WorkflowList{})
}
