package transport

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-io/sluice/internal/wfmeta"
)

// What a peer records in the workflow's KV bucket: the records' types and keys are
// internal/wfmeta's, which the controller reads without the data plane.

// RecordCommit writes a committed file's metadata to the KV bucket.
func (n *Peer) RecordCommit(ctx context.Context, m wfmeta.FileMeta) error {
	if m.Holders == nil {
		m.Holders = n.Holders(m.Path)
	}
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if _, err := n.kv.Put(ctx, wfmeta.FileKey(m.Path), b); err != nil {
		return fmt.Errorf("recording %s in %s: %w", m.Path, n.cfg.Names.Bucket, err)
	}
	return nil
}

// ForgetCommit deletes the commit record of p from the KV bucket (the file was withdrawn,
// semantics.Engine.Withdraw); a missing record is not an error. Errors are the bucket's,
// wrapped.
func (n *Peer) ForgetCommit(ctx context.Context, p string) error {
	if err := n.kv.Delete(ctx, wfmeta.FileKey(p)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("deleting the record of %s from %s: %w", p, n.cfg.Names.Bucket, err)
	}
	return nil
}

// Adopt claims file p for this peer, as its home node in place of a creator that has
// departed, and reports whether this peer holds the claim. The first peer to call it wins
// (a KV create of wfmeta.AdoptKey); later calls, from any peer, report whether they are
// that peer. Errors are the bucket's.
func (n *Peer) Adopt(ctx context.Context, p string) (bool, error) {
	key := wfmeta.AdoptKey(p)
	_, err := n.kv.Create(ctx, key, []byte(n.cfg.Node))
	if err == nil {
		return true, nil
	}
	if !errors.Is(err, jetstream.ErrKeyExists) {
		return false, fmt.Errorf("claiming %s in %s: %w", p, n.cfg.Names.Bucket, err)
	}
	e, err := n.kv.Get(ctx, key)
	if err != nil {
		return false, fmt.Errorf("reading the claim on %s in %s: %w", p, n.cfg.Names.Bucket, err)
	}
	return string(e.Value()) == n.cfg.Node, nil
}

// AdoptOrphan claims file p as Adopt does when its creator has departed (Departed): a
// file that committed after the pod that made it ended, which a peer still running must
// record (and, if permanent, store). While the creator runs, or when no creator is known,
// it claims nothing and reports false. Errors are the bucket's.
func (n *Peer) AdoptOrphan(ctx context.Context, p string) (bool, error) {
	if creator := n.Creator(p); creator == "" || !n.Departed(creator) {
		return false, nil
	}
	return n.Adopt(ctx, p)
}

func (n *Peer) recordTermination(step string, instance int, failed string) {
	b, _ := json.Marshal(wfmeta.Termination{Step: step, Instance: instance, Node: n.cfg.Node, Failed: failed})
	ctx, cancel := context.WithTimeout(n.ctx, 30*time.Second)
	defer cancel()
	if _, err := n.kv.Put(ctx, wfmeta.TerminationKey(step, instance), b); err != nil {
		n.cfg.Log.Error(err, "recording a termination", "step", step, "instance", instance)
	}
}

// RecordStats writes st, with this peer's host and counters filled in, as the stats of
// pod podUID (name st.Pod) into the KV bucket, unless they equal what it wrote last. It
// reports whether it wrote. Errors are the bucket's, wrapped.
func (n *Peer) RecordStats(ctx context.Context, podUID string, st wfmeta.PodStats) (bool, error) {
	st.Host, st.BytesReceived = n.cfg.Host, n.received.Load()
	b, err := json.Marshal(st)
	if err != nil {
		return false, err
	}
	n.statsMu.Lock()
	defer n.statsMu.Unlock()
	if bytes.Equal(b, n.lastStats) {
		return false, nil
	}
	if _, err := n.kv.Put(ctx, wfmeta.StatsKey(podUID), b); err != nil {
		return false, fmt.Errorf("recording the stats of pod %s in %s: %w", st.Pod, n.cfg.Names.Bucket, err)
	}
	n.lastStats = b
	return true, nil
}

// RecordReads writes r as the reads of pod podUID into the KV bucket, with Inputs
// replaced by AllInputs when there are more than wfmeta.MaxRecordedInputs. Errors are the
// bucket's, wrapped.
func (n *Peer) RecordReads(ctx context.Context, podUID string, r wfmeta.Reads) error {
	if len(r.Inputs) > wfmeta.MaxRecordedInputs {
		r.Inputs, r.AllInputs = nil, true
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if _, err := n.kv.Put(ctx, wfmeta.ReadsKey(podUID), b); err != nil {
		return fmt.Errorf("recording the reads of pod %s in %s: %w", r.Pod, n.cfg.Names.Bucket, err)
	}
	return nil
}

// recordWithdrawal writes the withdrawal of p for reason into the KV bucket; a failure
// is logged (the withdrawal itself stands).
func (n *Peer) recordWithdrawal(p, reason string) {
	if n.kv == nil {
		return
	}
	b, _ := json.Marshal(wfmeta.Withdrawal{Path: p, Reason: reason, At: time.Now().UTC()})
	ctx, cancel := context.WithTimeout(n.ctx, 30*time.Second)
	defer cancel()
	if _, err := n.kv.Put(ctx, wfmeta.WithdrawalKey(p), b); err != nil {
		n.cfg.Log.Error(err, "recording a withdrawal", "path", p)
	}
}

// AwaitOutcome waits, watching the KV key (no polling), until the outcome of pod podUID
// is recorded and returns it. It returns ctx's error when ctx ends first, and the
// bucket's errors wrapped.
func (n *Peer) AwaitOutcome(ctx context.Context, podUID string) (wfmeta.Outcome, error) {
	w, err := n.kv.Watch(ctx, wfmeta.OutcomeKey(podUID))
	if err != nil {
		return wfmeta.Outcome{}, fmt.Errorf("watching the outcome of pod %s in %s: %w", podUID, n.cfg.Names.Bucket, err)
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return wfmeta.Outcome{}, ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				if ctx.Err() != nil {
					return wfmeta.Outcome{}, ctx.Err()
				}
				return wfmeta.Outcome{}, fmt.Errorf("watching the outcome of pod %s in %s: %w", podUID, n.cfg.Names.Bucket, errors.New("watch closed"))
			}
			// A nil entry marks the end of the initial values: keep waiting.
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			var o wfmeta.Outcome
			if err := json.Unmarshal(e.Value(), &o); err != nil {
				return wfmeta.Outcome{}, fmt.Errorf("outcome of pod %s in %s: %w", podUID, n.cfg.Names.Bucket, err)
			}
			return o, nil
		}
	}
}
