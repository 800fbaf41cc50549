// Package filestate is the contract between a workflow volume's views (internal/streamfs
// over FUSE, sidecar/directview without it) and the workflow's file state behind them:
// the semantics engine on one node (*semantics.Engine), or the transport across nodes
// (*transport.Peer). It is a leaf: importing it pulls in neither go-fuse nor NATS.
package filestate

import (
	"context"

	"github.com/sluice-io/sluice/internal/semantics"
)

// Semantics is the whole of a workflow's file state as a view sees it: the events it
// tells, the reads it reports, the questions it asks and the waits it blocks in.
// *semantics.Engine implements it for one node, the transport (*transport.Peer) across
// nodes; wfnode.Node.Semantics hands it out, and a FUSE view (streamfs.Mount), which
// does all of it, takes it whole. Every other consumer declares the few methods it uses
// where it uses them: store.Events (what store.Files tells of a writer's changes),
// directview.Semantics, the stage-in's stager (internal/runner). Paths are cleaned
// volume paths.
type Semantics interface {
	Events
	Reads
	Queries
	Waits
}

// Events are what a writer tells: files and directories created, bytes written,
// truncations, closes, new names (renames, hard links, symlinks), removals, and the
// failures that end a file (Poison: its bytes are incomplete; Withdraw: its attempt
// failed). Create, Write, Truncate, Rename and Remove are store.Events, which a writer
// tells through store.Files with the change they describe.
type Events interface {
	Create(p string, dir bool) error
	Write(p string, off, n int64) error
	Truncate(p string, size int64) error
	Close(p string) error
	Rename(oldPath, newPath string, size int64) error
	Link(oldPath, newPath string, size int64) error
	Remove(p string) error
	Poison(p, reason string) error
	Withdraw(p, reason string) error
	Symlink(p, target string) error
}

// Reads are what a reader tells: an input opened (lineage, withdrawals), how far a step
// instance has read a file, and that it read a file to its end (a Consumed file's bytes
// may be released).
type Reads interface {
	NoteOpened(p string)
	ReadProgress(p, step string, instance int, off int64)
	ReadToEnd(p, step string, instance int)
}

// Queries answer at once: the rules, a file's status, whether a consumer sees or may
// open a path, and which steps may still add entries to a listed directory.
type Queries interface {
	Rules() *semantics.RuleSet
	Status(p string) semantics.FileStatus
	Visible(child string) bool
	CanOpen(p string) bool
	PendingListing(dir, step string) []string
}

// Waits block until the rules allow what a view was asked (a name to exist or open, a
// byte to read, a directory to be complete) or report a change.
type Waits interface {
	WaitExists(ctx context.Context, p string) (semantics.FileStatus, error)
	WaitOpen(ctx context.Context, p string) (semantics.FileStatus, error)
	WaitRead(ctx context.Context, p string, gen uint64, off int64) (n int64, eof bool, err error)
	WaitDir(ctx context.Context, p string) (semantics.FileStatus, error)
	Changed(p string) <-chan struct{}
	AnyChange() <-chan struct{}
}

var _ Semantics = (*semantics.Engine)(nil)

// DataSink is implemented by a Semantics that moves written bytes elsewhere (the
// transport publishes them to other nodes). store.Files.WriteAt calls it (as store.Sink,
// the same interface) after the bytes are in the store and after Write; data is only
// valid during the call.
type DataSink interface {
	Wrote(p string, off int64, data []byte)
}

// Fetcher is implemented by a Semantics whose files' bytes may have been written on
// another node (the transport fetches them on demand): the store holds such a file's
// size and namespace, and its bytes once fetched.
type Fetcher interface {
	// Remote reports whether bytes [off, end) of p may not be in the store yet (cheap;
	// false for files written on this node).
	Remote(p string, off, end int64) bool
	// Fetch returns once bytes [off, end) of p are in the store, or fails saying which
	// node holds them and why they could not be fetched.
	Fetch(ctx context.Context, p string, off, end int64) error
}
