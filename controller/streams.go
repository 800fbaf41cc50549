package controller

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-io/sluice/internal/natsauth"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

// Streams is what the controller does on NATS for a workflow: provision its stream and KV
// bucket, issue its credentials, read its metadata, remove it all.
type Streams interface {
	// Ensure creates the workflow's stream and KV bucket if they do not exist, each
	// bounded to the consumers a workflow of pods pods at once needs
	// (wfmeta.StreamConsumers).
	Ensure(ctx context.Context, names wfmeta.Names, pods int) error
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
// account, then holds only the workflows made before namespace accounts (or while the
// server took none, natsauth.ErrNoResolver), which stay there until they are removed:
// a workflow whose bucket JS holds is served from JS, any other from its namespace's
// account. Without Accounts (a server without authorisation, the tests'), everything is
// on JS and users are signed with Keys.
type JetStreams struct {
	// JS is a JetStream context of a user of the installation's workflow account with
	// every right.
	JS jetstream.JetStream
	// Keys sign the users of the workflows JS holds.
	Keys natsauth.Keys
	// Accounts, if set, keeps an account per namespace on the server.
	Accounts *natsauth.Accounts
	// Limits bound every workflow's stream and bucket (zero fields: unbounded, which
	// the accounts refuse: they require MaxBytes). Its MaxConsumers is the most any
	// workflow's stream gets (its namespace account's limit, NamespaceQuota.Consumers; 0:
	// none), each getting wfmeta.StreamConsumers of its pods within it.
	Limits wfmeta.Limits

	// legacy remembers, by stream name, which account a workflow was found in: true for
	// JS's, false for its namespace's (its bucket is there, so it never moves), so that a
	// running workflow's reconciles ask the installation's account once, not each time.
	legacy sync.Map
}

// inInstallationAccount reports whether workflow names lives in JS's account: always
// without Accounts; else if JS holds its bucket (remembered, as is a bucket found in the
// namespace's account, until Delete).
// Only the server's word that the bucket is not there, or that the account has no
// JetStream, is a no: any other error (a timeout) is returned, so that no caller takes
// a workflow of the installation's account for one of its namespace's.
func (s *JetStreams) inInstallationAccount(ctx context.Context, names wfmeta.Names) (bool, error) {
	if s.Accounts == nil {
		return true, nil
	}
	if s.JS == nil {
		return false, nil
	}
	if v, ok := s.legacy.Load(names.Stream); ok {
		return v.(bool), nil
	}
	_, err := s.JS.KeyValue(ctx, names.Bucket)
	switch {
	case err == nil:
		s.legacy.Store(names.Stream, true)
		return true, nil
	case errors.Is(err, jetstream.ErrBucketNotFound), errors.Is(err, jetstream.ErrStreamNotFound),
		errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
		return false, nil
	}
	return false, fmt.Errorf("looking for KV bucket %s in the installation's NATS account: %w", names.Bucket, err)
}

// home returns the JetStream context of the account holding workflow names: JS for a
// workflow it holds, and while the server takes no account JWTs (natsauth.ErrNoResolver:
// upgraded, not restarted yet), so that workflows run as before until it restarts; its
// namespace's account otherwise. legacy reports which.
func (s *JetStreams) home(ctx context.Context, names wfmeta.Names) (js jetstream.JetStream, legacy bool, err error) {
	legacy, err = s.inInstallationAccount(ctx, names)
	if err != nil {
		return nil, false, err
	}
	if legacy {
		return s.JS, true, nil
	}
	js, err = s.Accounts.JetStream(ctx, names.Namespace)
	if errors.Is(err, natsauth.ErrNoResolver) && s.JS != nil {
		return s.JS, true, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("the NATS account of namespace %s: %w", names.Namespace, err)
	}
	return js, false, nil
}

// bucket returns the JetStream context of the account holding workflow names (home)
// and its KV bucket.
func (s *JetStreams) bucket(ctx context.Context, names wfmeta.Names) (jetstream.JetStream, jetstream.KeyValue, error) {
	js, legacy, err := s.home(ctx, names)
	if err != nil {
		return nil, nil, err
	}
	kv, err := js.KeyValue(ctx, names.Bucket)
	if err != nil {
		return nil, nil, fmt.Errorf("KV bucket %s: %w", names.Bucket, err)
	}
	s.found(names, legacy)
	return js, kv, nil
}

// Ensure implements Streams.
func (s *JetStreams) Ensure(ctx context.Context, names wfmeta.Names, pods int) error {
	js, legacy, err := s.home(ctx, names)
	if err != nil {
		return err
	}
	lim := s.Limits
	lim.MaxConsumers = wfmeta.StreamConsumers(pods)
	if s.Limits.MaxConsumers > 0 {
		lim.MaxConsumers = min(lim.MaxConsumers, s.Limits.MaxConsumers)
	}
	if err := wfmeta.EnsureStream(ctx, js, names, lim); err != nil {
		return err
	}
	if _, err = wfmeta.EnsureBucket(ctx, js, names, lim); err != nil {
		return err
	}
	s.found(names, legacy)
	return nil
}

// found remembers that workflow names' bucket is in JS's account (legacy) or in its
// namespace's, where it was just made or read.
func (s *JetStreams) found(names wfmeta.Names, legacy bool) {
	if s.Accounts != nil {
		s.legacy.Store(names.Stream, legacy)
	}
}

// Credentials implements Streams: a user of the account holding the workflow, one that
// expires (natsauth.Accounts.Credentials) in a namespace's account.
func (s *JetStreams) Credentials(ctx context.Context, name string, names wfmeta.Names) ([]byte, error) {
	_, legacy, err := s.home(ctx, names)
	var c []byte
	switch {
	case err != nil:
	case legacy:
		c, err = s.Keys.Creds(name, natsauth.WorkflowPermissions(names))
	default:
		c, err = s.Accounts.Credentials(ctx, name, names)
	}
	if err != nil {
		return nil, fmt.Errorf("credentials of %s: %w", name, err)
	}
	return c, nil
}

// Metadata implements Streams.
func (s *JetStreams) Metadata(ctx context.Context, names wfmeta.Names) (wfmeta.Meta, error) {
	js, _, err := s.home(ctx, names)
	if err != nil {
		return wfmeta.Meta{}, err
	}
	return wfmeta.Metadata(ctx, js, names)
}

// RecordOutcome implements Streams.
func (s *JetStreams) RecordOutcome(ctx context.Context, names wfmeta.Names, podUID string, o wfmeta.Outcome) error {
	js, _, err := s.home(ctx, names)
	if err != nil {
		return err
	}
	return wfmeta.RecordOutcome(ctx, js, names, podUID, o)
}

// Delete implements Streams. A workflow of its namespace's account has its user revoked
// first, through the system account alone (its pods lose NATS before their stream goes,
// and however many connections its credentials hold, the controller needs none of the
// account's to revoke them), then its stream and bucket go from that account. Delete
// never falls back to the installation's account for such a workflow: a server that
// takes no account JWTs (natsauth.ErrNoResolver) is an error, tried again.
func (s *JetStreams) Delete(ctx context.Context, names wfmeta.Names) error {
	legacy, err := s.inInstallationAccount(ctx, names)
	if err != nil {
		return err
	}
	js := s.JS
	if !legacy {
		if err := s.Accounts.Revoke(ctx, names); err != nil {
			return fmt.Errorf("revoking the NATS user of workflow %s: %w", names.Stream, err)
		}
		if js, err = s.Accounts.JetStream(ctx, names.Namespace); err != nil {
			return fmt.Errorf("the NATS account of namespace %s: %w", names.Namespace, err)
		}
	}
	if err := wfmeta.DeleteStream(ctx, js, names); err != nil {
		return err
	}
	s.legacy.Delete(names.Stream)
	return nil
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
