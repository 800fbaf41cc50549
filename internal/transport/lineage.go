package transport

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
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

// RecordReads writes r as the reads of pod podUID into the KV bucket, with Inputs
// replaced by AllInputs when there are more than MaxRecordedInputs. Errors are the
// bucket's, wrapped.
func (n *Node) RecordReads(ctx context.Context, podUID string, r Reads) error {
	if len(r.Inputs) > MaxRecordedInputs {
		r.Inputs, r.AllInputs = nil, true
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if _, err := n.kv.Put(ctx, ReadsKey(podUID), b); err != nil {
		return fmt.Errorf("recording the reads of pod %s in %s: %w", r.Pod, n.cfg.Names.Bucket, err)
	}
	return nil
}

// recordWithdrawal writes the withdrawal of p for reason into the KV bucket; a failure
// is logged (the withdrawal itself stands).
func (n *Node) recordWithdrawal(p, reason string) {
	if n.kv == nil {
		return
	}
	b, _ := json.Marshal(Withdrawal{Path: p, Reason: reason, At: time.Now().UTC()})
	ctx, cancel := context.WithTimeout(n.ctx, 30*time.Second)
	defer cancel()
	if _, err := n.kv.Put(ctx, WithdrawalKey(p), b); err != nil {
		n.cfg.Log.Error(err, "recording a withdrawal", "path", p)
	}
}
