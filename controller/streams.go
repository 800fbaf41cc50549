package controller

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-io/sluice/internal/natsauth"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

// Streams is what the controller does on NATS for a workflow: provision its stream and KV
// bucket, issue its credentials, read its metadata, remove it all.
type Streams interface {
	// Ensure creates the workflow's stream and KV bucket if they do not exist.
	Ensure(ctx context.Context, names wfmeta.Names) error
	// Credentials returns a new credentials file allowed the workflow's names only.
	Credentials(name string, names wfmeta.Names) ([]byte, error)
	// Metadata returns what the workflow's KV bucket recorded so far: committed files,
	// terminations, pods' transport counters.
	Metadata(ctx context.Context, names wfmeta.Names) (wfmeta.Meta, error)
	// RecordOutcome records how the app containers of pod podUID ended, for its sidecar.
	RecordOutcome(ctx context.Context, names wfmeta.Names, podUID string, o wfmeta.Outcome) error
	// Delete removes the stream and the bucket; removing what does not exist succeeds.
	Delete(ctx context.Context, names wfmeta.Names) error
	// Watch calls changed after each update of the workflow's metadata until ctx ends.
	Watch(ctx context.Context, names wfmeta.Names, changed func()) error
}

// JetStreams implements Streams on a JetStream connection of the installation's account
// user, signing workflow users with Keys.
type JetStreams struct {
	// JS is a JetStream context of a user of the workflow account with every right.
	JS jetstream.JetStream
	// Keys sign the workflow users.
	Keys natsauth.Keys
	// Limits bound every workflow's stream and bucket (zero fields: unbounded, which
	// the installation's account refuses: it requires MaxBytes).
	Limits wfmeta.Limits
}

// Ensure implements Streams.
func (s *JetStreams) Ensure(ctx context.Context, names wfmeta.Names) error {
	if err := wfmeta.EnsureStream(ctx, s.JS, names, s.Limits); err != nil {
		return err
	}
	_, err := wfmeta.EnsureBucket(ctx, s.JS, names, s.Limits)
	return err
}

// Credentials implements Streams.
func (s *JetStreams) Credentials(name string, names wfmeta.Names) ([]byte, error) {
	c, err := s.Keys.Creds(name, natsauth.WorkflowPermissions(names))
	if err != nil {
		return nil, fmt.Errorf("credentials of %s: %w", name, err)
	}
	return c, nil
}

// Metadata implements Streams.
func (s *JetStreams) Metadata(ctx context.Context, names wfmeta.Names) (wfmeta.Meta, error) {
	return wfmeta.Metadata(ctx, s.JS, names)
}

// RecordOutcome implements Streams.
func (s *JetStreams) RecordOutcome(ctx context.Context, names wfmeta.Names, podUID string, o wfmeta.Outcome) error {
	return wfmeta.RecordOutcome(ctx, s.JS, names, podUID, o)
}

// Delete implements Streams.
func (s *JetStreams) Delete(ctx context.Context, names wfmeta.Names) error {
	return wfmeta.DeleteStream(ctx, s.JS, names)
}

// Watch calls changed after every update of the workflow's KV bucket (a file committed,
// an instance terminated) until ctx ends. It is how the controller refreshes a running
// workflow's counters without polling.
func (s *JetStreams) Watch(ctx context.Context, names wfmeta.Names, changed func()) error {
	kv, err := s.JS.KeyValue(ctx, names.Bucket)
	if err != nil {
		return fmt.Errorf("KV bucket %s: %w", names.Bucket, err)
	}
	w, err := kv.WatchAll(ctx, jetstream.UpdatesOnly())
	if err != nil {
		return fmt.Errorf("watching KV bucket %s: %w", names.Bucket, err)
	}
	go func() {
		defer func() { _ = w.Stop() }()
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				if e != nil {
					changed()
				}
			}
		}
	}()
	return nil
}
