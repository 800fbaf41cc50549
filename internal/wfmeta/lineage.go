package wfmeta

import (
	"encoding/hex"
	"time"
)

// What a cluster needs to find results built from withdrawn bytes (docs/kubernetes.md,
// "Only whole results succeed"): every pod's sidecar records which governed inputs its
// app opened, and every withdrawal is recorded where it outlives the pods. The controller
// compares the two by KV revision: a withdrawal recorded after a pod's reads names a file
// that pod read in the version taken back.

// MaxRecordedInputs bounds Reads.Inputs: a pod that opened more inputs records
// AllInputs instead, and every withdrawal of an input of its step counts against it.
const MaxRecordedInputs = 10000

// Reads is what one pod's app read, in the workflow's KV bucket (key
// "reads.<pod UID>"), written by its sidecar when it drains, before the pod ends.
type Reads struct {
	// Pod is the pod's name.
	Pod string `json:"pod"`
	// Inputs are the volume paths of the governed files its app opened as a consumer,
	// sorted.
	Inputs []string `json:"inputs,omitempty"`
	// AllInputs says it opened more than MaxRecordedInputs files: Inputs is empty, and
	// any of its step's inputs may have been read.
	AllInputs bool `json:"allInputs,omitempty"`
	// Withdrawn are the inputs taken back while it ran, after it had opened them: the
	// attempt counted as failed and its outputs were withdrawn in turn.
	Withdrawn []WithdrawnInput `json:"withdrawn,omitempty"`
	// Revision is the record's KV revision (filled in by Metadata).
	Revision uint64 `json:"-"`
}

// WithdrawnInput is an input withdrawn after a pod opened it.
type WithdrawnInput struct {
	Path   string `json:"path"`   // volume path
	Reason string `json:"reason"` // why it was withdrawn
}

// Withdrawal records that a file was taken back (semantics.Engine.Withdraw), in the
// workflow's KV bucket (key "withdrawn.<hex of the path>"), written by the peer that
// withdrew it. A later withdrawal of the same path replaces it, with a higher revision.
type Withdrawal struct {
	Path   string    `json:"path"`   // volume path
	Reason string    `json:"reason"` // why: the failed attempt
	At     time.Time `json:"at"`     // when
	// Revision is the record's KV revision (filled in by Metadata).
	Revision uint64 `json:"-"`
}

// ReadsKey is the KV key of the reads of the pod whose metadata.uid is podUID.
func ReadsKey(podUID string) string { return "reads." + podUID }

// WithdrawalKey is the KV key of the last withdrawal of path p.
func WithdrawalKey(p string) string { return "withdrawn." + hex.EncodeToString([]byte(p)) }
