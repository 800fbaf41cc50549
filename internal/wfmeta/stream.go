package wfmeta

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// MaxChunk is the most file bytes one message of a workflow's stream carries (a
// transport data message, transport.MaxChunk); the stream and the workflow's NATS users
// accept messages of MaxChunk bytes and their headers.
const MaxChunk = 1 << 20

// EnsureStream creates the workflow's stream if it does not exist.
func EnsureStream(ctx context.Context, js jetstream.JetStream, names Names) error {
	_, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:       names.Stream,
		Subjects:   []string{names.All()},
		Storage:    jetstream.FileStorage,
		Retention:  jetstream.LimitsPolicy,
		Duplicates: 2 * time.Minute,
		MaxMsgSize: MaxChunk + 64<<10,
	})
	if err != nil {
		return fmt.Errorf("creating stream %s: %w", names.Stream, err)
	}
	return nil
}

// EnsureBucket creates the workflow's KV bucket of file metadata and terminations if it
// does not exist, and returns it.
func EnsureBucket(ctx context.Context, js jetstream.JetStream, names Names) (jetstream.KeyValue, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: names.Bucket, Storage: jetstream.FileStorage})
	if err != nil {
		return nil, fmt.Errorf("creating KV bucket %s: %w", names.Bucket, err)
	}
	return kv, nil
}

// DeleteStream removes the workflow's stream and KV bucket (when the workflow is cleaned
// up).
func DeleteStream(ctx context.Context, js jetstream.JetStream, names Names) error {
	if err := js.DeleteStream(ctx, names.Stream); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("deleting stream %s: %w", names.Stream, err)
	}
	if err := js.DeleteKeyValue(ctx, names.Bucket); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
		return fmt.Errorf("deleting KV bucket %s: %w", names.Bucket, err)
	}
	return nil
}
