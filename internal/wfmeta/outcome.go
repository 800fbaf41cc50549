package wfmeta

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Outcome is how a pod's app containers ended, in the workflow's KV bucket (key
// "outcome.<pod UID>", OutcomeKey). The controller writes it from the pod's status; the
// pod's sidecar reads it when it drains, to record the step instance's termination (the
// event OnTermination commits wait for, CAPIO-CL commit rules) only for an attempt that
// succeeded: a failed attempt is retried, and its OnTermination files must wait for the
// retry.
type Outcome struct {
	// Succeeded is true when every app container exited with code 0.
	Succeeded bool `json:"succeeded"`
	// Reason says why the attempt failed, naming the container and its exit code; empty
	// for a success.
	Reason string `json:"reason,omitempty"`
	// The rest is set for a pod the Workflow does not own (a labelled pod of another
	// tool), so that the controller still counts the attempt once the pod is gone: engines
	// delete their finished pods (Airflow's KubernetesPodOperator by default, Argo's
	// podGC, Nextflow's cleanup). Pod is the pod's name, Step and Instance its step
	// instance, Attempt its sluice.io/attempt (0 if none), Node where it ran, Created its
	// creation time (the attempts' order).
	Pod      string    `json:"pod,omitempty"`
	Step     string    `json:"step,omitempty"`
	Instance int       `json:"instance,omitempty"`
	Attempt  int       `json:"attempt,omitempty"`
	Node     string    `json:"node,omitempty"`
	Created  time.Time `json:"created,omitzero"`
	// Job and JobUID name the Job that controls the pod, if one does: its retry policy,
	// not the pod alone, decides when the pod's failure fails its instance.
	Job    string `json:"job,omitempty"`
	JobUID string `json:"jobUID,omitempty"`
}

// OutcomeKey is the KV key of the outcome of the pod whose metadata.uid is podUID.
// Pod UIDs are RFC 4122 strings of hex digits and "-", valid in a key.
func OutcomeKey(podUID string) string { return "outcome." + podUID }

// RecordOutcome writes the outcome of pod podUID into the workflow's KV bucket. Writing
// the same outcome again is harmless; errors are the bucket's, wrapped.
func RecordOutcome(ctx context.Context, js jetstream.JetStream, names Names, podUID string, o Outcome) error {
	kv, err := js.KeyValue(ctx, names.Bucket)
	if err != nil {
		return fmt.Errorf("KV bucket %s: %w", names.Bucket, err)
	}
	b, err := json.Marshal(o)
	if err != nil {
		return err
	}
	if _, err := kv.Put(ctx, OutcomeKey(podUID), b); err != nil {
		return fmt.Errorf("recording the outcome of pod %s in %s: %w", podUID, names.Bucket, err)
	}
	return nil
}
