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

// Limits bound one workflow's stream and KV bucket on the NATS server: what one
// workflow may reserve of the server's disk (its namespace's account allows a number of
// workflows, natsauth.NamespaceQuota), and how long a forgotten workflow's records stay.
// Nothing a tenant writes changes them.
type Limits struct {
	// StreamBytes is the stream's MaxBytes: events, and the bytes of files replicated
	// through the stream. Once full the stream refuses new messages (DiscardNew): nothing
	// recorded is ever dropped to make room, and the peer whose message was refused fails
	// the files concerned (transport.RefusedError).
	StreamBytes int64
	// BucketBytes is the KV bucket's MaxBytes (file records, terminations, pod counters).
	BucketBytes int64
	// MaxAge is how long the stream and the bucket keep a message: past it a workflow
	// nobody removed loses its records. It must exceed any run's duration.
	MaxAge time.Duration
}

// DefaultLimits are the controller's defaults. 128 MiB of stream: a workflow whose files
// travel by fetch (the default) publishes a few hundred bytes per write and close, so
// this is some 400,000 events, or 100 MiB of `replicate: Stream` files besides; 16 MiB
// of bucket: a file record is a few hundred bytes; 7 days, longer than any run. With
// natsauth.DefaultNamespaceQuota (7 workflows) a namespace reserves at most 1 GiB.
var DefaultLimits = Limits{StreamBytes: 128 << 20, BucketBytes: 16 << 20, MaxAge: 7 * 24 * time.Hour}

// Validate reports whether l bounds every dimension.
func (l Limits) Validate() error {
	if l.StreamBytes <= 0 || l.BucketBytes <= 0 || l.MaxAge <= 0 {
		return fmt.Errorf("workflow stream limits: stream bytes %d, bucket bytes %d and max age %s must be positive", l.StreamBytes, l.BucketBytes, l.MaxAge)
	}
	if l.StreamBytes < 2*MaxChunk {
		return fmt.Errorf("workflow stream limits: stream bytes %d must hold at least two %d-byte chunks", l.StreamBytes, MaxChunk)
	}
	return nil
}

// EnsureStream creates the workflow's stream if it does not exist, bounded by lim (zero
// fields: unbounded, for a server of a single run, `sluice run`), and brings an existing
// stream's limits to lim.
func EnsureStream(ctx context.Context, js jetstream.JetStream, names Names, lim Limits) error {
	cfg := jetstream.StreamConfig{
		Name:       names.Stream,
		Subjects:   []string{names.All()},
		Storage:    jetstream.FileStorage,
		Retention:  jetstream.LimitsPolicy,
		Discard:    jetstream.DiscardNew,
		Duplicates: 2 * time.Minute,
		MaxMsgSize: MaxChunk + 64<<10,
		MaxBytes:   -1,
		MaxAge:     lim.MaxAge,
	}
	if lim.StreamBytes > 0 {
		cfg.MaxBytes = lim.StreamBytes
	}
	if cfg.MaxAge > 0 && cfg.MaxAge < cfg.Duplicates {
		cfg.Duplicates = cfg.MaxAge
	}
	if _, err := js.CreateOrUpdateStream(ctx, cfg); err != nil {
		return fmt.Errorf("creating stream %s (max bytes %d, max age %s): %w", names.Stream, cfg.MaxBytes, cfg.MaxAge, err)
	}
	return nil
}

// EnsureBucket creates the workflow's KV bucket of file metadata and terminations if it
// does not exist, bounded by lim as EnsureStream, and returns it.
func EnsureBucket(ctx context.Context, js jetstream.JetStream, names Names, lim Limits) (jetstream.KeyValue, error) {
	cfg := jetstream.KeyValueConfig{Bucket: names.Bucket, Storage: jetstream.FileStorage, MaxBytes: -1, TTL: lim.MaxAge}
	if lim.BucketBytes > 0 {
		cfg.MaxBytes = lim.BucketBytes
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("creating KV bucket %s (max bytes %d, max age %s): %w", names.Bucket, cfg.MaxBytes, cfg.TTL, err)
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
