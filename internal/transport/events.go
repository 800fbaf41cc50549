package transport

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/pathpattern"
	"github.com/sluice-io/sluice/internal/semantics"
)

// The events a peer's local views report (filestate.Events and the failure modes):
// each is applied to the peer's engine and published on the workflow's stream for the
// other peers; what the stream refuses poisons the files it was about.

func (n *Peer) send(m *Message) {
	subj := n.cfg.Names.Events(n.cfg.Node)
	if m.Kind == KindData || m.Kind == KindExtent {
		subj = n.cfg.Names.Data(n.cfg.Host, n.cfg.Node)
	}
	m.Node, m.Host, m.Incarnation = n.cfg.Node, n.cfg.Host, n.incarnation
	n.fetcher.track(m) // at once, as the engine: a rename here moves what is known of the bytes
	if err := n.pub.publish(n.ctx, Encode(subj, m)); err != nil {
		var re *RefusedError
		switch {
		case errors.As(err, &re) && m.Kind == KindTerminate:
			// The instance's outputs are incomplete elsewhere: it ends failed there.
			if m.Reason == "" {
				m.Reason = refusedReason(re)
			}
			n.publishPast(m)
			return
		case errors.As(err, &re): // logged once; the files it touches fail
			if m.Path != "" && n.engine.Poisoned(m.Path) == nil {
				n.refused(re, []string{m.Path})
			}
			return
		}
		n.cfg.Log.Error(err, "event not published", "kind", m.Kind, "path", m.Path)
	}
}

// refused fails the files whose messages the stream refused, or the publisher dropped
// after a refusal (publisher.fail): poisoned here, so that they never commit and their
// readers here get the error, and on the other hosts by a poison message published past
// the publisher (publishPast). A file committed here before the refusal was known keeps
// its commit here, where all its bytes are; the other hosts never see it commit.
func (n *Peer) refused(re *RefusedError, paths []string) {
	reason := refusedReason(re)
	for _, p := range paths {
		if err := n.engine.Poison(p, reason); errors.Is(err, semantics.ErrCommitted) {
			n.cfg.Log.Error(re, "a file committed here before its events were refused: the other hosts never commit it",
				"stream", n.cfg.Names.Stream, "path", pathpattern.Printable(p))
		}
		n.publishPast(&Message{Kind: KindPoison, Path: p, Reason: reason})
	}
}

// refusedReason is the reason of the poisons and failed terminations a refusal causes.
func refusedReason(re *RefusedError) string {
	reason := fmt.Sprintf("the workflow's stream %s refused its events: %s", re.Stream, re.Limit)
	if len(reason) > MaxReason {
		reason = reason[:MaxReason]
	}
	return reason
}

// publishPast publishes m at once, after a refusal, bypassing the publisher that sends
// nothing more: a poison or a failed termination, which tell the other hosts that what
// this peer did is incomplete. It is best effort: a stream full to the last bytes refuses
// it too, which is logged.
func (n *Peer) publishPast(m *Message) {
	m.Node, m.Host, m.Incarnation = n.cfg.Node, n.cfg.Host, n.incarnation
	ctx, cancel := context.WithTimeout(n.ctx, 5*time.Second)
	defer cancel()
	if _, err := n.js.PublishMsg(ctx, Encode(n.cfg.Names.Events(n.cfg.Node), m)); err != nil {
		n.cfg.Log.Error(err, "after a refusal, the other hosts could not be told: they may wait on this peer until their timeouts",
			"stream", n.cfg.Names.Stream, "kind", m.Kind, "path", pathpattern.Printable(m.Path), "step", m.Step, "instance", m.Instance)
	}
}

// The event methods apply to the local engine first (local readers never wait on NATS),
// then publish. Paths no rule governs are plain node-local files and are not published.

// Create records and publishes a creation. A creation the engine refused (a committed
// file, ErrCommitted) or that no rule governs is not published. Once the stream refused
// a message of this peer (RefusedError) a new file is poisoned at once (send).
func (n *Peer) Create(p string, dir bool) error {
	err := n.engine.Create(p, dir)
	if err == nil {
		n.setCreator(p, n.cfg.Node, n.cfg.Host)
		n.send(&Message{Kind: KindCreate, Path: p, Dir: dir})
	}
	return err
}

// creator is the peer that created a file and the host whose node store holds what it
// wrote.
type creator struct{ node, host string }

// Creator returns the node that created p first, as far as this node knows ("" if none).
func (n *Peer) Creator(p string) string {
	n.creatorMu.Lock()
	defer n.creatorMu.Unlock()
	return n.creators[p].node
}

// CreatorHost returns the host whose node store holds what p's creator (Creator) wrote:
// on a cluster, the Kubernetes node its pod ran on ("" if this node knows no creator).
func (n *Peer) CreatorHost(p string) string {
	n.creatorMu.Lock()
	defer n.creatorMu.Unlock()
	return n.creators[p].host
}

// Departed reports whether peer node has published the termination of a step instance.
// On a cluster every peer is one pod's sidecar serving one instance, so such a peer has
// left (or is leaving) and can no longer act as a home node; under `sluice run` a peer
// serves several instances and this says nothing about it.
func (n *Peer) Departed(node string) bool {
	n.creatorMu.Lock()
	defer n.creatorMu.Unlock()
	return n.departed[node]
}

func (n *Peer) setCreator(p, node, host string) {
	n.creatorMu.Lock()
	defer n.creatorMu.Unlock()
	if _, ok := n.creators[p]; !ok {
		n.creators[p] = creator{node: node, host: host}
	}
}

// Wrote announces the bytes a view wrote at off of p (filestate.DataSink): an extent
// message per MaxChunk, whose bytes this host serves to the fetchers of the hosts that
// read them; with Config.Replicate, or for an output declared `replicate: Stream`, data
// messages carrying a copy of the bytes.
func (n *Peer) Wrote(p string, off int64, data []byte) {
	if !n.Rules().Resolve(p).Governed() {
		return
	}
	for len(data) > 0 {
		k := min(len(data), MaxChunk)
		if n.cfg.Replicate || n.Rules().Resolve(p).Rule.Replicate == v1alpha1.ReplicateStream {
			n.send(&Message{Kind: KindData, Path: p, Offset: off, Data: append([]byte(nil), data[:k]...)})
		} else {
			n.send(&Message{Kind: KindExtent, Path: p, Offset: off, Length: int64(k)})
		}
		data, off = data[k:], off+int64(k)
	}
}

// Truncate records and publishes a truncation.
func (n *Peer) Truncate(p string, size int64) error {
	err := n.engine.Truncate(p, size)
	if err == nil {
		n.send(&Message{Kind: KindTruncate, Path: p, Size: size})
	}
	return err
}

// Close records and publishes one close.
func (n *Peer) Close(p string) error {
	err := n.engine.Close(p)
	if err == nil {
		n.send(&Message{Kind: KindClose, Path: p})
	}
	return err
}

// Rename records and publishes a rename. A rename onto a governed path from one no rule
// governs (the temporary of rsync, install and many editors, ".name.XXXXXX") is published
// as the new file written whole here (wholeFile): the other hosts never heard of the
// temporary, whose writes stay local, so a rename would name a file they do not have.
func (n *Peer) Rename(oldPath, newPath string, size int64) error {
	err := n.engine.Rename(oldPath, newPath, size)
	if err != nil {
		return err
	}
	n.setCreator(newPath, n.cfg.Node, n.cfg.Host)
	if !n.Rules().Resolve(oldPath).Governed() {
		n.wholeFile(newPath, size)
		return nil
	}
	n.send(&Message{Kind: KindRename, Path: oldPath, NewPath: newPath, Size: size})
	return nil
}

// wholeFile publishes that p, of size bytes in this host's store, appeared complete here:
// its creation, its bytes (extents this host serves, or the bytes themselves when p is
// replicated) and one close, as a writer's events would have said. A replicated chunk
// that cannot be read from the store poisons p, so no host takes it for complete.
func (n *Peer) wholeFile(p string, size int64) {
	n.send(&Message{Kind: KindCreate, Path: p})
	res := n.Rules().Resolve(p)
	replicate := n.cfg.Replicate || res.Rule != nil && res.Rule.Replicate == v1alpha1.ReplicateStream
	var f *os.File
	if replicate && size > 0 {
		sp, err := n.store.Path(p)
		if err == nil {
			f, err = os.Open(sp)
		}
		if err != nil {
			_ = n.Poison(p, fmt.Sprintf("reading the renamed file from the node store: %v", err))
			return
		}
		defer f.Close()
	}
	for off := int64(0); off < size; {
		k := min(size-off, MaxChunk)
		if f == nil {
			n.send(&Message{Kind: KindExtent, Path: p, Offset: off, Length: k})
		} else {
			buf := make([]byte, k)
			if _, err := f.ReadAt(buf, off); err != nil {
				_ = n.Poison(p, fmt.Sprintf("reading the renamed file from the node store at %d: %v", off, err))
				return
			}
			n.send(&Message{Kind: KindData, Path: p, Offset: off, Data: buf})
		}
		off += k
	}
	n.send(&Message{Kind: KindClose, Path: p})
}

// Link records and publishes that newPath was made a hard link to the file oldPath of
// size bytes, committed or fixed by the link (streamfs: a step's own uncommitted output);
// on the other hosts the materialiser makes the same link to their copy of oldPath, so
// the bytes travel once.
func (n *Peer) Link(oldPath, newPath string, size int64) error {
	err := n.engine.Link(oldPath, newPath, size)
	if err == nil {
		n.setCreator(newPath, n.cfg.Node, n.cfg.Host)
		n.send(&Message{Kind: KindLink, Path: oldPath, NewPath: newPath, Size: size})
	}
	return err
}

// Symlink records and publishes that p was created as a symbolic link to target; on the
// other hosts the materialiser creates the same link (never following it).
func (n *Peer) Symlink(p, target string) error {
	err := n.engine.Symlink(p, target)
	if err == nil {
		n.setCreator(p, n.cfg.Node, n.cfg.Host)
		n.send(&Message{Kind: KindSymlink, Path: p, Target: target})
	}
	return err
}

// Poison records and publishes that p can never be complete (semantics.Engine.Poison),
// so that no peer commits it, stores it or lets a reader take it for complete.
func (n *Peer) Poison(p, reason string) error {
	err := n.engine.Poison(p, reason)
	if err == nil {
		n.send(&Message{Kind: KindPoison, Path: p, Reason: reason})
	}
	return err
}

// Withdraw records and publishes that p was taken back because the attempt that produced
// it failed (semantics.Engine.Withdraw): every peer forgets it, and every host's
// materialiser removes its copy, so that a retry writes it anew everywhere.
func (n *Peer) Withdraw(p, reason string) error {
	err := n.engine.Withdraw(p, reason)
	if err == nil {
		n.forgetCreator(p)
		n.send(&Message{Kind: KindWithdraw, Path: p, Reason: reason})
		n.recordWithdrawal(p, reason)
	}
	return err
}

// forgetCreator drops the creator of the withdrawn file p: whoever makes it again (the
// retry) becomes its creator, hence its home node.
func (n *Peer) forgetCreator(p string) {
	n.creatorMu.Lock()
	defer n.creatorMu.Unlock()
	delete(n.creators, p)
}

// Remove records and publishes an unlink.
func (n *Peer) Remove(p string) error {
	err := n.engine.Remove(p)
	if err == nil {
		n.send(&Message{Kind: KindRemove, Path: p})
	}
	return err
}

// Terminate records and publishes that step[instance] (running on this node) exited.
func (n *Peer) Terminate(step string, instance int) {
	n.engine.Terminate(step, instance)
	n.send(&Message{Kind: KindTerminate, Step: step, Instance: instance})
	n.recordTermination(step, instance, "")
}

// TerminateFailed records and publishes that step[instance] (running on this node)
// exited for good after a failed attempt, with no retries left, for reason
// (semantics.Engine.TerminateFailed): every node's waits on its outputs end.
func (n *Peer) TerminateFailed(step string, instance int, reason string) {
	if reason == "" {
		reason = "failed"
	}
	n.engine.TerminateFailed(step, instance, reason)
	n.send(&Message{Kind: KindTerminate, Step: step, Instance: instance, Reason: reason})
	n.recordTermination(step, instance, reason)
}
