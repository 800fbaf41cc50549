package transport

import (
	"context"

	"github.com/sluice-io/sluice/internal/semantics"
)

// The methods of filestate.Semantics that change nothing other peers must learn: queries
// and waits, and the local bookkeeping of this peer's readers. Each delegates to the
// peer's engine (see Peer). The mutators, which publish, are in peer.go.

// Rules returns the workflow's compiled rules (semantics.Engine.Rules).
func (n *Peer) Rules() *semantics.RuleSet { return n.engine.Rules() }

// Write records that a view wrote n bytes at off of p (semantics.Engine.Write); the
// extent is published when the view hands over the bytes (Wrote).
func (n *Peer) Write(p string, off, k int64) error { return n.engine.Write(p, off, k) }

// NoteOpened records that a reader on this peer's node opened p
// (semantics.Engine.NoteOpened).
func (n *Peer) NoteOpened(p string) { n.engine.NoteOpened(p) }

// ReadProgress records how far (off, bytes) a reader, instance of step, has read p
// contiguously (semantics.Engine.ReadProgress).
func (n *Peer) ReadProgress(p, step string, instance int, off int64) {
	n.engine.ReadProgress(p, step, instance, off)
}

// ReadToEnd records that a reader, instance of step, read p to its end
// (semantics.Engine.ReadToEnd).
func (n *Peer) ReadToEnd(p, step string, instance int) { n.engine.ReadToEnd(p, step, instance) }

// Status returns what this peer knows of p (semantics.Engine.Status).
func (n *Peer) Status(p string) semantics.FileStatus { return n.engine.Status(p) }

// Visible reports whether a consumer may see child in a listing (semantics.Engine.Visible).
func (n *Peer) Visible(child string) bool { return n.engine.Visible(child) }

// CanOpen reports whether a consumer may open p now (semantics.Engine.CanOpen).
func (n *Peer) CanOpen(p string) bool { return n.engine.CanOpen(p) }

// WaitExists waits until p exists (semantics.Engine.WaitExists).
func (n *Peer) WaitExists(ctx context.Context, p string) (semantics.FileStatus, error) {
	return n.engine.WaitExists(ctx, p)
}

// WaitOpen waits until a consumer may open p (semantics.Engine.WaitOpen).
func (n *Peer) WaitOpen(ctx context.Context, p string) (semantics.FileStatus, error) {
	return n.engine.WaitOpen(ctx, p)
}

// WaitRead waits until bytes of generation gen of p are readable at off, returning how
// many (semantics.Engine.WaitRead).
func (n *Peer) WaitRead(ctx context.Context, p string, gen uint64, off int64) (int64, bool, error) {
	return n.engine.WaitRead(ctx, p, gen, off)
}

// WaitDir waits until the directory (or file) p is committed (semantics.Engine.WaitDir).
func (n *Peer) WaitDir(ctx context.Context, p string) (semantics.FileStatus, error) {
	return n.engine.WaitDir(ctx, p)
}

// Changed returns a channel closed at the next change of p (semantics.Engine.Changed).
func (n *Peer) Changed(p string) <-chan struct{} { return n.engine.Changed(p) }

// AnyChange is the engine's (semantics.Engine.AnyChange).
func (n *Peer) AnyChange() <-chan struct{} { return n.engine.AnyChange() }

// PendingListing is the engine's (semantics.Engine.PendingListing).
func (n *Peer) PendingListing(dir, step string) []string { return n.engine.PendingListing(dir, step) }
