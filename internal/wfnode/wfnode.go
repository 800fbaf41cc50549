// Package wfnode assembles a workflow's node: the node store that holds one workflow's
// files on one host, the engine of the workflow's rules over it, the disk tier's spill
// policy, the transport peer that joins the node to the other nodes, and the copier that
// stores the permanent outputs the node is home for. Three callers build one the same
// way: `sluice run`, one per --nodes node (internal/runner); a pod's sidecar (sidecar);
// the CSI node plugin's store server, which serves a node's store after its pods ended
// (internal/storeserver).
//
//	n, err := wfnode.New(wfnode.Config{Workflow: wf, Rules: rules, StoreDir: data, DiskDir: disk})
//	err = n.Join(ctx, transport.Config{Conn: nc, Names: names, Node: peer})
//	n.Output(uploadCtx, outputs.Config{Objects: objects, Home: home})
//	n.Engine.Observe(semantics.Observer{...}) // the caller's own observers
//	...
//	n.Stop()
//
// New, Join and Output are separate steps because the callers do work between them,
// each for a reason of its own: a direct-mode sidecar watches the app's directory and
// observes commits before the peer replays the workflow's history (nothing written is
// missed); a sidecar catches up with the stream and republishes its previous life's
// journal before it starts storing outputs; `sluice run` builds every node's store and
// engine, then every node's peer, then every node's copier and observers, so that what a
// peer's goroutines read is written before they start. A node that never joins has no
// peer (`sluice run` on one node without NATS); one that stores no outputs has no copier
// (the store server).
//
// The NATS connection is the caller's (transport.Connect): `sluice run` shares one among
// its nodes. Observers other than the copier's stay with the callers, which do different
// things with a released file or a withdrawal: they register them with Engine.Observe
// before the first event (semantics.Observer).
package wfnode

import (
	"context"
	"time"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/filestate"
	"github.com/sluice-io/sluice/internal/outputs"
	"github.com/sluice-io/sluice/internal/podconfig"
	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/store"
	"github.com/sluice-io/sluice/internal/transport"
)

// Spill says which files of a node store may move from its memory tier to its disk tier
// (when the workflow gives it one, podconfig.StoreOptions).
type Spill int

const (
	// SpillAll lets committed files move when the memory tier is full
	// (podconfig.Spillable), and files being written live on the disk tier
	// (podconfig.SpillWritten). The default: `sluice run` and a FUSE sidecar.
	SpillAll Spill = iota
	// SpillCommitted lets only committed files move: a file being written stays in the
	// memory tier. A direct-mode sidecar, whose app opens the files being written by their
	// memory-tier path.
	SpillCommitted
	// SpillNone moves nothing. The store server, which only serves.
	SpillNone
)

// Config configures a workflow's node.
type Config struct {
	// Workflow is the workflow (its spec.volume bounds the tiers), Rules its compiled rules.
	Workflow *v1alpha1.Workflow
	Rules    *semantics.RuleSet
	// StoreDir is the node store's directory (its memory tier); DiskDir the directory of
	// its disk tier, used when the workflow asks for one (podconfig.StoreOptions).
	StoreDir, DiskDir string
	// SpaceWait bounds how long a write waits for space in a full tier
	// (store.Options.SpaceWait).
	SpaceWait time.Duration
	// Spill says which files may move to the disk tier.
	Spill Spill
	// MemoryLimit and DiskLimit, when set, are the node's bounds of the tiers in bytes
	// (the CSI node plugin's, handoff.Volume): each replaces the spec's limit of its tier
	// when that is unset or larger, so that the store waits and spills before the kernel
	// refuses a write.
	MemoryLimit, DiskLimit int64
}

// Node is a workflow's node. Its fields are set by the step that builds each part and
// never change afterwards.
type Node struct {
	// Store is the node store and Engine the engine of the workflow's rules (New).
	Store  *store.Store
	Engine *semantics.Engine
	// Peer is the node's transport peer: nil before Join, and on a node that never joins.
	Peer *transport.Peer
	// Copier stores the permanent outputs the node is home for: nil before Output.
	Copier *outputs.Copier

	rules *semantics.RuleSet
}

// New builds a workflow's node store and its engine, with the spill policy cfg.Spill. It
// starts nothing: no goroutine reads the node until Join. Errors are the store's.
func New(cfg Config) (*Node, error) {
	opts := podconfig.StoreOptions(cfg.Workflow, cfg.Rules, cfg.SpaceWait, cfg.DiskDir)
	opts.Limit = tighter(opts.Limit, cfg.MemoryLimit)
	if opts.Disk != "" {
		opts.DiskLimit = tighter(opts.DiskLimit, cfg.DiskLimit)
	}
	st, err := store.New(cfg.StoreDir, opts)
	if err != nil {
		return nil, err
	}
	e := semantics.NewEngine(cfg.Rules)
	if cfg.Spill != SpillNone {
		st.SetSpillable(podconfig.Spillable(e, cfg.Rules))
	}
	if cfg.Spill == SpillAll {
		st.SetSpillWritten(podconfig.SpillWritten(cfg.Rules))
	}
	return &Node{Store: st, Engine: e, rules: cfg.Rules}, nil
}

// tighter returns the smaller of two limits, 0 being none.
func tighter(a, b int64) int64 {
	if a <= 0 || (b > 0 && b < a) {
		return b
	}
	return a
}

// Join starts the node's transport peer as cfg says, over the node's engine and store
// (cfg.Engine and cfg.Store are set here). From then on the peer applies the workflow's
// events: register observers that must see every event before. Errors are the
// transport's.
func (n *Node) Join(ctx context.Context, cfg transport.Config) error {
	cfg.Engine, cfg.Store = n.Engine, n.Store
	p, err := transport.Start(ctx, cfg)
	if err != nil {
		return err
	}
	n.Peer = p
	return nil
}

// Output starts the copier of the permanent outputs the node is home for, as cfg says
// (cfg.Engine, cfg.Store, cfg.Rules and, once the node joined, cfg.Meta are set here),
// and registers it with the engine: it hears of creations (to upload a NoUpdate file
// while it is written), commits and withdrawals. Uploads end when ctx does.
func (n *Node) Output(ctx context.Context, cfg outputs.Config) {
	cfg.Engine, cfg.Store, cfg.Rules = n.Engine, n.Store, n.rules
	if n.Peer != nil {
		cfg.Meta = n.Peer // a nil *transport.Peer would make a non-nil Recorder
	}
	n.Copier = outputs.New(ctx, cfg)
	n.Engine.Observe(semantics.Observer{Commit: n.Copier.Committed, Create: n.Copier.Created, Withdraw: n.Copier.Withdrawn})
}

// Semantics is what the node's views report to and wait on: its peer once it joined
// (which publishes what they report), else its engine.
func (n *Node) Semantics() filestate.Semantics {
	if n.Peer != nil {
		return n.Peer
	}
	return n.Engine
}

// Stop stops the node's peer, if it joined, then closes the store (store.Store.Close):
// call it once no view serves from the store. The store's files stay as they are: they
// belong to the host (the caller removes them when the workflow is retired). The copier
// ends with the context Output was given; an upload still running after Stop fails.
func (n *Node) Stop() {
	if n.Peer != nil {
		n.Peer.Stop()
	}
	n.Store.Close()
}
