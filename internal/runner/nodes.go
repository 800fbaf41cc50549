package runner

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/outputs"
	"github.com/sluice-io/sluice/internal/podconfig"
	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/transport"
	"github.com/sluice-io/sluice/internal/wfmeta"
	"github.com/sluice-io/sluice/internal/wfnode"
)

// node is one node of a run: its store, its engine, its copier and, with more than one
// node, its end of the NATS transport (Peer, nil for a single node without --nats). Its
// views report to Semantics().
type node struct {
	name string
	*wfnode.Node
	// conn is the node's own NATS connection, which its peer's components share (nil
	// without transport).
	conn *nats.Conn
}

// terminate records, on every node, that step[instance] exited for good: after an
// attempt that succeeded when failure is "", else after one that failed as failure says,
// with no retries left (semantics.Engine.TerminateFailed: the waits on its outputs end).
func (n *node) terminate(step string, instance int, failure string) {
	switch {
	case n.Peer != nil && failure != "":
		n.Peer.TerminateFailed(step, instance, failure)
	case n.Peer != nil:
		n.Peer.Terminate(step, instance)
	case failure != "":
		n.Engine.TerminateFailed(step, instance, failure)
	default:
		n.Engine.Terminate(step, instance)
	}
}

// startNodes creates the run's nodes: one store and engine each and, when the run has
// several nodes or an external NATS server, the transport between them.
func (r *run) startNodes(ctx context.Context) error {
	count := r.opts.Nodes
	if count < 1 {
		count = 1
	}
	useNATS := count > 1 || r.opts.NATSURL != ""
	r.place(count)
	names := make([]string, count)
	for i := range names {
		names[i] = fmt.Sprintf("node-%d", i)
	}
	var url string
	var copts transport.ConnOptions
	if useNATS {
		url = r.opts.NATSURL
		copts = transport.ConnOptions{Name: "sluice-run-" + r.wf.Name, ReconnectWait: 250 * time.Millisecond}
		if url == "" {
			srv, err := transport.StartEmbedded(filepath.Join(r.opts.WorkDir, "jetstream"))
			if err != nil {
				return err
			}
			r.embedded = srv
			url = srv.URL()
			// The server is in this process: its nodes reach it without a socket.
			copts.InProcess = srv
		}
		nc, err := transport.Connect(url, copts)
		if err != nil {
			return err
		}
		r.nc = nc
		ns := r.wf.Namespace
		if ns == "" {
			ns = "default"
		}
		// Each run has streams of its own: a run never replays an earlier run's events, even
		// on a shared --nats server.
		r.names = wfmeta.NamesForWorkflow(ns, r.wf.Name, r.id)
	}
	// Three phases, so that everything a request handler or a transport consumer reads is
	// written before the goroutine that reads it starts: every node's store and engine
	// (wfnode.New), then the transports (Join), then the copiers and observers (Output,
	// Observe; registered before any event can happen).
	for _, name := range names {
		base := r.opts.WorkDir
		if count > 1 {
			base = filepath.Join(r.opts.WorkDir, "nodes", name)
		}
		// The memory tier is a tmpfs (memtier.go); the disk tier (spec.tiers.fs,
		// spec.volume.disk) lives under --work.
		storeDir := filepath.Join(base, "store")
		if !r.opts.StoreOnDisk {
			limit := podconfig.StoreOptions(r.wf, r.rules, r.opts.SpaceWait, "").Limit
			if err := mountMemoryTier(storeDir, limit); err != nil {
				return err
			}
			r.memTiers = append(r.memTiers, storeDir)
		}
		wn, err := wfnode.New(wfnode.Config{Workflow: r.wf, Rules: r.rules, StoreDir: storeDir,
			DiskDir: filepath.Join(base, "disk"), SpaceWait: r.opts.SpaceWait})
		if err != nil {
			return err
		}
		r.nodes = append(r.nodes, &node{name: name, Node: wn})
	}
	if useNATS {
		for _, n := range r.nodes {
			// A connection per node, as each node of a cluster has its own: the nodes'
			// messages are not parsed and delivered one after another by one reader.
			copts.Name = "sluice-run-" + r.wf.Name + "-" + n.name
			nc, err := transport.Connect(url, copts)
			if err != nil {
				return err
			}
			n.conn = nc
			if err := n.Join(ctx, transport.Config{Conn: nc, Names: r.names, Node: n.name, Log: r.log.WithName("transport")}); err != nil {
				return err
			}
		}
	}
	for i, n := range r.nodes {
		idx := i
		creator := func(p string) string { return "" }
		if n.Peer != nil {
			creator = n.Peer.Creator
		}
		label := ""
		if count > 1 {
			label = n.name
		}
		n.Output(r.permCtx, outputs.Config{Node: label, Objects: r.opts.ObjStore, Log: r.log.WithValues("node", n.name),
			Home: func(p string) bool { return r.homeOf(p, creator) == idx }})
		n.Engine.Observe(semantics.Observer{
			Poison:   r.notePoison,
			Withdraw: r.noteWithdrawn,
			Release:  func(st semantics.FileStatus) { r.release(n, st) },
			Punch:    func(p string, upto int64) { r.punch(n, p, upto) },
		})
		n.Engine.Observe(semantics.Observer{Withdraw: func(w *semantics.WithdrawnError) { r.abortReaders(idx, w) }})
	}
	return nil
}

// homeOf returns the index of the node that holds (and stores, if permanent) file p, by
// the workflow's home-node policy: the creating node (Create, the default), a hash of the
// path over the nodes (Hashing), or the node of a step instance (Manual).
func (r *run) homeOf(p string, creatorOf func(string) string) int {
	if len(r.nodes) <= 1 {
		return 0
	}
	switch home := r.rules.Home(p); home.Policy {
	case v1alpha1.HomeNodeManual:
		return r.nodeOfInstance(home.Step, home.Instance)
	case v1alpha1.HomeNodeHashing:
		return semantics.HashNode(p, len(r.nodes))
	}
	creator := creatorOf(p)
	for i, n := range r.nodes {
		if n.name == creator {
			return i
		}
	}
	return 0
}

// place spreads the instances over the nodes round-robin, in step and instance order.
// It runs before any view is mounted: the placement is read by the views' request
// handlers and never changes.
func (r *run) place(nodes int) {
	r.placement = map[string]int{}
	k := 0
	for _, s := range r.wf.Spec.Steps {
		replicas := 1
		if s.Replicas != nil {
			replicas = int(*s.Replicas)
		}
		for i := 0; i < replicas; i++ {
			r.placement[fmt.Sprintf("%s/%d", s.Name, i)] = k % nodes
			k++
		}
	}
}

// nodeOfInstance returns the node an instance runs on.
func (r *run) nodeOfInstance(step string, index int) int {
	return r.placement[fmt.Sprintf("%s/%d", step, index)]
}

// settle waits until every node published and applied everything, so that every commit
// (and permanent upload) that the run's events imply has happened on every node.
func (r *run) settle(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	for _, n := range r.nodes {
		if n.Peer == nil {
			continue
		}
		if err := n.Peer.Sync(ctx); err != nil {
			return fmt.Errorf("node %s: %w", n.name, err)
		}
	}
	for _, n := range r.nodes {
		if n.Peer == nil {
			continue
		}
		if err := n.Peer.CaughtUp(ctx); err != nil {
			return err
		}
	}
	// A Consumed file's release may have been decided by a consumer's close (its FUSE
	// RELEASE arrives after the process exited) while its observer, which deletes and
	// counts it, still runs: the report counts it only once that is done.
	for _, n := range r.nodes {
		if err := n.Engine.Quiesce(ctx); err != nil {
			return fmt.Errorf("node %s: waiting for the engine's observers: %w", n.name, err)
		}
	}
	return nil
}

// metadata reads the commits and terminations recorded in the workflow's KV bucket.
func (r *run) metadata(ctx context.Context) (wfmeta.Meta, error) {
	js, err := jetstreamFor(r.nc)
	if err != nil {
		return wfmeta.Meta{}, err
	}
	return wfmeta.Metadata(ctx, js, r.names)
}

// stopNodes stops the transport, deletes the workflow's stream and bucket (their data was
// temporary) and shuts the embedded server down.
func (r *run) stopNodes() {
	for _, n := range r.nodes {
		n.Stop()
		if n.conn != nil {
			n.conn.Close()
		}
	}
	if r.nc != nil {
		if js, err := jetstreamFor(r.nc); err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if err := wfmeta.DeleteStream(ctx, js, r.names); err != nil {
				r.log.Error(err, "deleting the workflow's stream")
			}
			cancel()
		}
		r.nc.Close()
	}
	if r.embedded != nil {
		r.embedded.Shutdown()
	}
	r.unmountMemoryTiers()
}

func jetstreamFor(nc *nats.Conn) (jetstream.JetStream, error) { return jetstream.New(nc) }
