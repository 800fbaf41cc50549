// Package filestate is the contract between a workflow volume's views (internal/streamfs
// over FUSE, sidecar/directview without it) and the workflow's file state behind them:
// the semantics engine on one node (*semantics.Engine), or the transport across nodes
// (*transport.Peer). It is a leaf: importing it pulls in neither go-fuse nor NATS.
package filestate

import (
	"context"

	"github.com/sluice-io/sluice/internal/semantics"
)

// Semantics is what a view needs from the workflow's file state: events in,
// answers and waits out. *semantics.Engine implements it for one node; the transport
// implements it across nodes. Paths are cleaned volume paths.
type Semantics interface {
	Rules() *semantics.RuleSet
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
	NoteOpened(p string)
	ReadProgress(p, step string, instance int, off int64)
	ReadToEnd(p, step string, instance int)
	Status(p string) semantics.FileStatus
	Visible(child string) bool
	CanOpen(p string) bool
	WaitExists(ctx context.Context, p string) (semantics.FileStatus, error)
	WaitOpen(ctx context.Context, p string) (semantics.FileStatus, error)
	WaitRead(ctx context.Context, p string, gen uint64, off int64) (n int64, eof bool, err error)
	WaitDir(ctx context.Context, p string) (semantics.FileStatus, error)
	Changed(p string) <-chan struct{}
	AnyChange() <-chan struct{}
	PendingListing(dir, step string) []string
}

var _ Semantics = (*semantics.Engine)(nil)

// DataSink is implemented by a Semantics that moves written bytes elsewhere (the
// transport publishes them to other nodes). Wrote is called after the bytes are in the
// store and after Write; data is only valid during the call.
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
