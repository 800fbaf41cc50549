package runner

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/filestate"
	"github.com/sluice-io/sluice/internal/outputs"
	"github.com/sluice-io/sluice/internal/podconfig"
	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/store"
	"github.com/sluice-io/sluice/internal/transport"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

// node is one node of a run: its store, its engine and, with more than one node, its end
// of the NATS transport.
type node struct {
	name   string
	store  *store.Store
	engine *semantics.Engine
	tnode  *transport.Peer // nil for a single node without --nats
	perm   *outputs.Copier
}

// sem is what the node's views report to and wait on.
func (n *node) sem() filestate.Semantics {
	if n.tnode != nil {
		return n.tnode
	}
	return n.engine
}

// terminate records, on every node, that step[instance] exited for good: after an
// attempt that succeeded when failure is "", else after one that failed as failure says,
// with no retries left (semantics.Engine.TerminateFailed: the waits on its outputs end).
func (n *node) terminate(step string, instance int, failure string) {
	switch {
	case n.tnode != nil && failure != "":
		n.tnode.TerminateFailed(step, instance, failure)
	case n.tnode != nil:
		n.tnode.Terminate(step, instance)
	case failure != "":
		n.engine.TerminateFailed(step, instance, failure)
	default:
		n.engine.Terminate(step, instance)
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
	if useNATS {
		url := r.opts.NATSURL
		if url == "" {
			srv, err := transport.StartEmbedded(filepath.Join(r.opts.WorkDir, "jetstream"))
			if err != nil {
				return err
			}
			r.embedded = srv
			url = srv.URL()
		}
		nc, err := transport.Connect(url, transport.ConnOptions{Name: "sluice-run-" + r.wf.Name, ReconnectWait: 250 * time.Millisecond})
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
	// written before the goroutine that reads it starts: every node's store and engine,
	// then the transports, then the observers (registered before any event can happen).
	for _, name := range names {
		base := r.opts.WorkDir
		if count > 1 {
			base = filepath.Join(r.opts.WorkDir, "nodes", name)
		}
		// The disk tier (spec.tiers.fs, spec.volume.disk) lives under --work.
		st, err := store.New(filepath.Join(base, "store"), podconfig.StoreOptions(r.wf, r.rules, r.opts.SpaceWait, filepath.Join(base, "disk")))
		if err != nil {
			return err
		}
		e := semantics.NewEngine(r.rules)
		st.SetSpillable(podconfig.Spillable(e, r.rules))
		st.SetSpillWritten(podconfig.SpillWritten(r.rules))
		r.nodes = append(r.nodes, &node{name: name, store: st, engine: e})
	}
	if useNATS {
		for _, n := range r.nodes {
			tn, err := transport.Start(ctx, transport.Config{
				Conn: r.nc, Names: r.names, Node: n.name, Engine: n.engine, Store: n.store,
				Log: r.log.WithName("transport"),
			})
			if err != nil {
				return err
			}
			n.tnode = tn
		}
	}
	for i, n := range r.nodes {
		idx, tn := i, n.tnode
		creator := func(p string) string { return "" }
		if tn != nil {
			creator = tn.Creator
		}
		label := ""
		if count > 1 {
			label = n.name
		}
		cfg := outputs.Config{Node: label, Engine: n.engine, Store: n.store, Rules: r.rules, Objects: r.opts.ObjStore,
			Log: r.log.WithValues("node", n.name), Home: func(p string) bool { return r.homeOf(p, creator) == idx }}
		if tn != nil {
			cfg.Meta = tn // a nil *transport.Peer would make a non-nil Recorder
		}
		n.perm = outputs.New(r.permCtx, cfg)
		n.engine.Observe(semantics.Observer{Commit: n.perm.Committed, Create: n.perm.Created, Withdraw: n.perm.Withdrawn})
		n.engine.Observe(semantics.Observer{
			Poison:   r.notePoison,
			Withdraw: r.noteWithdrawn,
			Release:  func(st semantics.FileStatus) { r.release(n, st) },
			Punch:    func(p string, upto int64) { r.punch(n, p, upto) },
		})
		n.engine.Observe(semantics.Observer{Withdraw: func(w *semantics.WithdrawnError) { r.abortReaders(idx, w) }})
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
		if n.tnode == nil {
			continue
		}
		if err := n.tnode.Sync(ctx); err != nil {
			return fmt.Errorf("node %s: %w", n.name, err)
		}
	}
	for _, n := range r.nodes {
		if n.tnode == nil {
			continue
		}
		if err := n.tnode.CaughtUp(ctx); err != nil {
			return err
		}
	}
	// A Consumed file's release may have been decided by a consumer's close (its FUSE
	// RELEASE arrives after the process exited) while its observer, which deletes and
	// counts it, still runs: the report counts it only once that is done.
	for _, n := range r.nodes {
		if err := n.engine.Quiesce(ctx); err != nil {
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
		if n.tnode != nil {
			n.tnode.Stop()
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
}

func jetstreamFor(nc *nats.Conn) (jetstream.JetStream, error) { return jetstream.New(nc) }
