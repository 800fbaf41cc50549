package controller

import (
	"context"
	"errors"
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
	Credentials(ctx context.Context, name string, names wfmeta.Names) ([]byte, error)
	// Metadata returns what the workflow's KV bucket recorded so far: committed files,
	// terminations, pods' transport counters.
	Metadata(ctx context.Context, names wfmeta.Names) (wfmeta.Meta, error)
	// RecordOutcome records how the app containers of pod podUID ended, for its sidecar.
	RecordOutcome(ctx context.Context, names wfmeta.Names, podUID string, o wfmeta.Outcome) error
	// Delete removes the stream and the bucket, and revokes the workflow's credentials;
	// removing what does not exist succeeds.
	Delete(ctx context.Context, names wfmeta.Names) error
	// Watch calls changed after each update of the workflow's metadata until ctx ends.
	Watch(ctx context.Context, names wfmeta.Names, changed func()) error
}

// JetStreams implements Streams on NATS. With Accounts, each namespace's workflows are
// in an account of their own (natsauth.Accounts): the stream and bucket are made and
// read on the controller's connection of that account, and the workflow's users, signed
// by it, expire and are revoked by Delete. JS, a connection of the installation's
// account, then holds only the workflows made before namespace accounts, which are
// read and removed there until they are gone. Without Accounts (a server without
// authorisation, the tests'), everything is on JS and users are signed with Keys.
type JetStreams struct {
	// JS is a JetStream context of a user of the installation's workflow account with
	// every right.
	JS jetstream.JetStream
	// Keys sign the workflow users when Accounts is nil.
	Keys natsauth.Keys
	// Accounts, if set, keeps an account per namespace on the server.
	Accounts *natsauth.Accounts
	// Limits bound every workflow's stream and bucket (zero fields: unbounded, which
	// the accounts refuse: they require MaxBytes).
	Limits wfmeta.Limits
}

// home returns the JetStream context of the account of the workflow's namespace: JS
// without Accounts, and while the server takes no account JWTs (natsauth.ErrNoResolver:
// upgraded, not restarted yet), so that workflows run as before until it restarts.
func (s *JetStreams) home(ctx context.Context, names wfmeta.Names) (jetstream.JetStream, error) {
	if s.Accounts == nil {
		return s.JS, nil
	}
	js, err := s.Accounts.JetStream(ctx, names.Namespace)
	if errors.Is(err, natsauth.ErrNoResolver) && s.JS != nil {
		return s.JS, nil
	}
	return js, err
}

// bucket returns the JetStream context holding the workflow's KV bucket and the bucket:
// its namespace's account, else (a workflow made before namespace accounts) JS.
func (s *JetStreams) bucket(ctx context.Context, names wfmeta.Names) (jetstream.JetStream, jetstream.KeyValue, error) {
	js, err := s.home(ctx, names)
	var kv jetstream.KeyValue
	if err == nil {
		kv, err = js.KeyValue(ctx, names.Bucket)
	}
	if err != nil && s.Accounts != nil && s.JS != nil {
		if old, oerr := s.JS.KeyValue(ctx, names.Bucket); oerr == nil {
			return s.JS, old, nil
		}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("KV bucket %s: %w", names.Bucket, err)
	}
	return js, kv, nil
}

// Ensure implements Streams.
func (s *JetStreams) Ensure(ctx context.Context, names wfmeta.Names) error {
	js, err := s.home(ctx, names)
	if err != nil {
		return err
	}
	if err := wfmeta.EnsureStream(ctx, js, names, s.Limits); err != nil {
		return err
	}
	_, err = wfmeta.EnsureBucket(ctx, js, names, s.Limits)
	return err
}

// Credentials implements Streams.
func (s *JetStreams) Credentials(ctx context.Context, name string, names wfmeta.Names) ([]byte, error) {
	var c []byte
	var err error
	if s.Accounts != nil {
		c, err = s.Accounts.Credentials(ctx, name, names)
	}
	if s.Accounts == nil || errors.Is(err, natsauth.ErrNoResolver) { // as home
		c, err = s.Keys.Creds(name, natsauth.WorkflowPermissions(names))
	}
	if err != nil {
		return nil, fmt.Errorf("credentials of %s: %w", name, err)
	}
	return c, nil
}

// Metadata implements Streams.
func (s *JetStreams) Metadata(ctx context.Context, names wfmeta.Names) (wfmeta.Meta, error) {
	js, _, err := s.bucket(ctx, names)
	if err != nil {
		return wfmeta.Meta{}, err
	}
	return wfmeta.Metadata(ctx, js, names)
}

// RecordOutcome implements Streams.
func (s *JetStreams) RecordOutcome(ctx context.Context, names wfmeta.Names, podUID string, o wfmeta.Outcome) error {
	js, _, err := s.bucket(ctx, names)
	if err != nil {
		return err
	}
	return wfmeta.RecordOutcome(ctx, js, names, podUID, o)
}

// Delete implements Streams: the stream and bucket go from the namespace's account and
// the installation's, then the workflow's user is revoked.
func (s *JetStreams) Delete(ctx context.Context, names wfmeta.Names) error {
	js, err := s.home(ctx, names)
	if err != nil {
		return err
	}
	if err := wfmeta.DeleteStream(ctx, js, names); err != nil {
		return err
	}
	if s.Accounts == nil {
		return nil
	}
	if s.JS != nil {
		if err := wfmeta.DeleteStream(ctx, s.JS, names); err != nil {
			return err
		}
	}
	if err := s.Accounts.Revoke(ctx, names); err != nil && !errors.Is(err, natsauth.ErrNoResolver) {
		return err
	}
	return nil // without the resolver, its user is the installation account's (home)
}

// Watch calls changed after every update of the workflow's KV bucket (a file committed,
// an instance terminated) until ctx ends. It is how the controller refreshes a running
// workflow's counters without polling.
func (s *JetStreams) Watch(ctx context.Context, names wfmeta.Names, changed func()) error {
	_, kv, err := s.bucket(ctx, names)
	if err != nil {
		return err
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
