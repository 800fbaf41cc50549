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
	// MaxConsumers bounds the consumers of the stream and of the bucket's stream, each
	// (0: unbounded, `sluice run`). The controller sets StreamConsumers of the
	// workflow's pods, within its namespace account's limit.
	MaxConsumers int
	// ConsumerInactive, when set, is the stream's and the bucket's consumer inactivity
	// threshold: the server removes a consumer that no client has used for that long,
	// durable or not, and refuses one asking for a longer threshold. Sluice's own
	// consumers are ordered ones that set ConsumerInactive (or less) themselves.
	ConsumerInactive time.Duration
}

// ConsumerInactive is the consumer inactivity threshold of the controller's workflow
// streams (Limits.ConsumerInactive) and what Sluice's ordered consumers ask for
// (OrderedInactive, half of it): a consumer of a pod that is gone stops counting against
// MaxConsumers within a minute.
const ConsumerInactive = time.Minute

// OrderedInactive is the inactivity threshold of the ordered consumers Sluice's peers
// create (nats.go's default, 5 minutes, would be refused by a stream of
// ConsumerInactive): an ordered consumer whose client is alive pulls every few seconds.
const OrderedInactive = ConsumerInactive / 2

// StreamConsumers is the MaxConsumers of the streams of a workflow of pods pods
// (instances running at once, at most its replicas together): each of its peers — a
// sidecar per pod and a store server per node, at most one per pod — follows the stream
// with one ordered consumer, and each node's materialiser stores it with another
// (transport: peer.go, materialise.go), at most 3 per pod; a pod's sidecar watches the
// bucket for its outcome, and the controller watches and lists it; 32 more for a
// consumer being replaced (an ordered consumer's reset) and pods being replaced within
// ConsumerInactive.
func StreamConsumers(pods int) int { return 3*max(pods, 1) + 32 }

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
	lim.consumerLimits(&cfg)
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
	if lim.MaxConsumers == 0 && lim.ConsumerInactive == 0 {
		return kv, nil
	}
	// A KV bucket's configuration has no consumer limits: they go on its stream.
	st, err := js.Stream(ctx, "KV_"+names.Bucket)
	if err != nil {
		return nil, fmt.Errorf("KV bucket %s's stream: %w", names.Bucket, err)
	}
	scfg := st.CachedInfo().Config
	if lim.consumerLimits(&scfg) {
		if _, err := js.UpdateStream(ctx, scfg); err != nil {
			return nil, fmt.Errorf("bounding the consumers of KV bucket %s (max consumers %d, inactive threshold %s): %w", names.Bucket, lim.MaxConsumers, lim.ConsumerInactive, err)
		}
	}
	return kv, nil
}

// consumerLimits puts l's consumer limits into cfg and reports whether that changed it.
func (l Limits) consumerLimits(cfg *jetstream.StreamConfig) bool {
	maxc := -1
	if l.MaxConsumers > 0 {
		maxc = l.MaxConsumers
	}
	changed := cfg.MaxConsumers != maxc || cfg.ConsumerLimits.InactiveThreshold != l.ConsumerInactive
	cfg.MaxConsumers = maxc
	cfg.ConsumerLimits.InactiveThreshold = l.ConsumerInactive
	return changed
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
