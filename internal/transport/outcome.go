package transport

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

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

// AwaitOutcome waits, watching the KV key (no polling), until the outcome of pod podUID
// is recorded and returns it. It returns ctx's error when ctx ends first, and the
// bucket's errors wrapped.
func (n *Node) AwaitOutcome(ctx context.Context, podUID string) (Outcome, error) {
	w, err := n.kv.Watch(ctx, OutcomeKey(podUID))
	if err != nil {
		return Outcome{}, fmt.Errorf("watching the outcome of pod %s in %s: %w", podUID, n.cfg.Names.Bucket, err)
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return Outcome{}, ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				if ctx.Err() != nil {
					return Outcome{}, ctx.Err()
				}
				return Outcome{}, fmt.Errorf("watching the outcome of pod %s in %s: %w", podUID, n.cfg.Names.Bucket, errors.New("watch closed"))
			}
			// A nil entry marks the end of the initial values: keep waiting.
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			var o Outcome
			if err := json.Unmarshal(e.Value(), &o); err != nil {
				return Outcome{}, fmt.Errorf("outcome of pod %s in %s: %w", podUID, n.cfg.Names.Bucket, err)
			}
			return o, nil
		}
	}
}
