// Package storeserver keeps a workflow's node store answering the other nodes after the
// pods that wrote it have ended.
//
// Bytes cross nodes only when a reader fetches them from the node that wrote them
// (docs/transport.md). On a cluster a pod's sidecar serves its node store while it runs
// and exits with its pod, yet a reader on another node may open a file after every pod
// that wrote it has ended. The CSI node plugin, which holds the node store and outlives
// the pods, therefore runs one serving peer per workflow it published a volume of on the
// node (published.Record), connected as the workflow's agent Secret in the API says
// (Options.Connection): it follows the workflow's stream, competes for the
// node's materialiser role like the sidecars (so the store keeps applying the other
// nodes' renames and removals in stream order), and answers fetches from the store until
// the workflow is retired (Servers.Stop). The plugin reads the Workflow and its agent
// Secret from the API as root, then runs the peer in an unprivileged child process of its
// own (Children, child.go); nothing a pod hands over configures it.
package storeserver

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go"
	"golang.org/x/sys/unix"
	"k8s.io/utils/ptr"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/outputs"
	"github.com/sluice-io/sluice/internal/pathpattern"
	"github.com/sluice-io/sluice/internal/podconfig"
	"github.com/sluice-io/sluice/internal/published"
	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/transport"
	"github.com/sluice-io/sluice/internal/wfmeta"
	"github.com/sluice-io/sluice/internal/wfnode"
)

// PeerName is the transport peer name of the store server of node: "store-<node>",
// distinct from every sidecar's (wfmeta.InstancePeer names step instances).
func PeerName(node string) string { return "store-" + node }

// Options configure the store servers of one node.
type Options struct {
	// Node is the Kubernetes node's name, as the sidecars give it as their transport host.
	Node string
	// Log receives the servers' logs.
	Log logr.Logger
	// DiskOf gives a workflow directory's disk tier directory (csidriver.Driver.DiskDirOf).
	DiskOf func(dir string) string
	// RecordOf gives the directory, which no pod can write, where the plugin records its
	// publications of the workflow whose node directory is dir (published.Record,
	// csidriver.Driver.RecordDirOf).
	RecordOf func(dir string) string
	// Workflow reads workflow ns/name from the API server: nil (and no error) when it
	// does not exist. A store server runs only for a Workflow the API has, with the spec
	// the API gives.
	Workflow func(ctx context.Context, ns, name string) (*v1alpha1.Workflow, error)
	// Connection reads the NATS connection of workflow wf's store servers, its agent
	// Secret (podconfig.AgentSecretName), from the API server: nil (and no error) while
	// the controller has not made it (a start that fails, and is tried again later).
	Connection func(ctx context.Context, wf *v1alpha1.Workflow) (*podconfig.Connection, error)
	// NATSURL, when set, is the NATS server every store server connects to, whatever
	// URL the agent Secret names.
	NATSURL string
	// Start starts the store server of a checked configuration: the CSI plugin runs each
	// in an unprivileged child process (Children.Start). Nil: in this process (Serve).
	Start func(ctx context.Context, cfg Config) (Instance, error)
}

// Instance is a running store server.
type Instance interface {
	// Stop stops the store server and returns once it ended.
	Stop()
}

// Config is what one store server is given, as the plugin read it from the API server:
// the Workflow, the NATS connection of its agent Secret, and the
// workflow's directories on the node. It travels to a store server's child process on its
// standard input, never on its command line or in its environment.
type Config struct {
	// Node is the Kubernetes node's name (Options.Node).
	Node string `json:"node"`
	// Workflow is the API server's Workflow (its spec, namespace, name and UID).
	Workflow *v1alpha1.Workflow `json:"workflow"`
	// NATSURL is the NATS server to connect to.
	NATSURL string `json:"natsURL"`
	// NATSCreds are the workflow's NATS credentials (natsauth; empty: none).
	NATSCreds []byte `json:"natsCreds,omitempty"`
	// NATSInbox is the workflow's inbox prefix.
	NATSInbox string `json:"natsInbox,omitempty"`
	// NATSCA is the installation's CA certificate NATS serves TLS with (empty: none).
	NATSCA []byte `json:"natsCA,omitempty"`
	// Dir is the workflow's node directory (<store>/<namespace>/<workflow>): the store
	// is its data/, the node's host state its state/.
	Dir string `json:"dir"`
	// DiskDir is the workflow's disk tier directory.
	DiskDir string `json:"diskDir"`
	// User is the user and group ID the server runs as: the workflow's (its
	// status.agentUser, which its sidecars run as and own its directories with); 0: the
	// plugin's default (ChildOptions.UID).
	User int64 `json:"user,omitempty"`
}

// DataDir is the node store's directory of the workflow (Dir/data).
func (c *Config) DataDir() string { return filepath.Join(c.Dir, "data") }

// StateDir is the directory of the node's host state of the workflow (Dir/state).
func (c *Config) StateDir() string { return filepath.Join(c.Dir, "state") }

// Servers runs the store servers of one node, one per workflow directory.
type Servers struct {
	opts Options
	log  logr.Logger

	mu    sync.Mutex
	peers map[string]Instance // by workflow directory
	// starting holds the starts in progress (Ensure), by workflow directory: the function
	// that cancels one, and whether Stop was called for its directory meanwhile.
	starting map[string]*start
	// retry holds, by workflow directory, when a start that failed may be tried again.
	retry map[string]retryAfter
}

// start is a store server start in progress.
type start struct {
	cancel  context.CancelFunc
	stopped bool          // Stop was called for its directory meanwhile
	done    chan struct{} // closed once Ensure has recorded, or stopped, what it made
}

// retryAfter is when a failed start may be tried again, and how many failed in a row,
// for the publication record it was made from (its directory's inode: published.Record renames a
// new one over it when the workflow's UID changed, so a workflow made again under the
// same name is tried at once).
type retryAfter struct {
	at       time.Time
	failures int
	record   uint64
}

// recordID returns the inode of the publication record of the workflow whose node
// directory is dir (0: none).
func (s *Servers) recordID(dir string) uint64 {
	if s.opts.RecordOf == nil {
		return 0
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(s.opts.RecordOf(dir), published.Dir), &st); err != nil {
		return 0
	}
	return st.Ino
}

// Bounds of the wait before a failed start is tried again: doubling from the first to
// the last, so that a workflow that can never serve (a record it does not match,
// credentials NATS refuses) costs the plugin a check every few minutes, not every tick.
const (
	firstRetry = 5 * time.Second
	lastRetry  = 5 * time.Minute
)

// New returns the store servers of a node.
func New(opts Options) *Servers {
	return &Servers{opts: opts, log: opts.Log, peers: map[string]Instance{}, starting: map[string]*start{}, retry: map[string]retryAfter{}}
}

// Ensure starts the store server of the workflow whose node directory is dir
// (<store>/<namespace>/<workflow>, holding data/ and state/) if the plugin holds a
// publication record of it (Options.RecordOf), the controller made its agent Secret, and
// none runs yet; otherwise it does nothing. The Workflow must exist in the API with the
// record's UID; its spec is the API's. Errors name the
// directory; a failed start is tried again by a later call, 5 s after it failed, the wait
// doubling with each failure in a row up to 5 min.
//
// The start runs outside the servers' lock: a slow one (a store of many files to read, a
// NATS server that does not answer) holds up neither the other workflows' starts nor
// Stop, which cancels it.
func (s *Servers) Ensure(ctx context.Context, dir string) error {
	s.mu.Lock()
	r := s.retry[dir]
	// The record is looked at only for a start to make or one waiting after a failure,
	// never for a server that runs (every directory, every tick of the plugin's loop).
	if _, ok := s.peers[dir]; ok || s.starting[dir] != nil {
		s.mu.Unlock()
		return nil
	}
	record := s.recordID(dir)
	if r.record == record && time.Now().Before(r.at) {
		s.mu.Unlock()
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	st := &start{cancel: cancel, done: make(chan struct{})}
	defer close(st.done)
	s.starting[dir] = st
	s.mu.Unlock()
	srv, err := s.start(ctx, dir)
	cancel()
	s.mu.Lock()
	delete(s.starting, dir)
	switch {
	case st.stopped:
		delete(s.retry, dir)
	case err != nil:
		if r.record != record {
			r = retryAfter{record: record}
		}
		r.failures++
		r.at = time.Now().Add(min(firstRetry<<min(r.failures-1, 16), lastRetry))
		s.retry[dir] = r
	default:
		delete(s.retry, dir)
		if srv != nil {
			s.peers[dir] = srv
		}
	}
	s.mu.Unlock()
	if st.stopped {
		if srv != nil {
			srv.Stop() // Stop came while it started
		}
		return nil
	}
	return err
}

// Serving reports whether the store server of the workflow directory dir runs.
func (s *Servers) Serving(dir string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.peers[dir]
	return ok
}

// start checks the publication record of the workflow whose node directory is dir
// against the API and starts its store server (Ensure): nil and no error when there is
// no record.
func (s *Servers) start(ctx context.Context, dir string) (Instance, error) {
	if s.opts.RecordOf == nil {
		return nil, nil
	}
	uid, ok, err := published.Load(filepath.Join(s.opts.RecordOf(dir), published.Dir))
	if err != nil {
		return nil, fmt.Errorf("store server of %s: %w", dir, err)
	}
	if !ok {
		return nil, nil
	}
	// After the first pod's sidecar on the node has joined the transport, as when the
	// sidecars handed over their connection: the server is there to answer once they have
	// ended, and a sidecar that joins first is the host's materialiser and fetcher, whose
	// fetches its pod's stats count (status.nodes[].receivedBytes) and whose reads need
	// no relay through NATS.
	if !transport.HostJoined(filepath.Join(dir, "state")) {
		return nil, nil
	}
	// The record's directory is the published pod's own workflow's (the plugin chose it
	// from the publication), and its UID the API's then.
	ns, name := filepath.Base(filepath.Dir(dir)), filepath.Base(dir)
	if s.opts.Workflow == nil || s.opts.Connection == nil {
		return nil, fmt.Errorf("store server of %s: no access to the API server to read workflow %s/%s", dir, ns, name)
	}
	wf, err := s.opts.Workflow(ctx, ns, name)
	if err != nil {
		return nil, fmt.Errorf("store server of %s: %w", dir, err)
	}
	if wf == nil || !wf.DeletionTimestamp.IsZero() {
		return nil, fmt.Errorf("store server of %s: no Workflow %s/%s in the API server", dir, ns, name)
	}
	if string(wf.UID) != uid {
		return nil, fmt.Errorf("store server of %s: the node published workflow %s/%s with UID %q, the API's has UID %q", dir, ns, name, uid, wf.UID)
	}
	if _, errs, _ := semantics.Compile(ctx, &wf.Spec); len(errs) > 0 {
		return nil, fmt.Errorf("store server of %s: workflow %s: %w", dir, wf.Name, errs.ToAggregate())
	}
	conn, err := s.opts.Connection(ctx, wf)
	if err != nil {
		return nil, fmt.Errorf("store server of %s: %w", dir, err)
	}
	if conn == nil {
		// The controller has not made it yet (or never will, for a workflow it refuses):
		// tried again after the failures' wait, not at every tick of the plugin's loop.
		return nil, fmt.Errorf("store server of %s: workflow %s/%s has no agent Secret yet", dir, ns, name)
	}
	url := conn.URL
	if s.opts.NATSURL != "" {
		url = s.opts.NATSURL
	}
	c := Config{Node: s.opts.Node, Workflow: wf, NATSURL: url, NATSCreds: conn.Creds, NATSInbox: conn.Inbox,
		NATSCA: conn.CA, Dir: dir, DiskDir: s.opts.DiskOf(dir), User: ptr.Deref(wf.Status.AgentUser, 0)}
	start := s.opts.Start
	if start == nil {
		start = func(ctx context.Context, c Config) (Instance, error) {
			return Serve(ctx, c, s.log.WithValues("dir", dir))
		}
	}
	srv, err := start(ctx, c)
	if err != nil {
		return nil, fmt.Errorf("store server of %s: %w", dir, err)
	}
	return srv, nil
}

// Server is a store server running in this process (Serve).
type Server struct {
	node   *wfnode.Node
	nc     *nats.Conn
	log    logr.Logger
	host   string
	rules  *semantics.RuleSet
	cancel context.CancelFunc // ends the recording of adopted files (home)
}

// Serve starts serving the node store of the workflow cfg names, in this process, until
// Stop: it connects to NATS, follows the workflow's stream and answers fetches from the
// store. It never writes the object store; it records the commits of the files written
// on its node whose creator's pod had ended before they committed (home).
func Serve(ctx context.Context, cfg Config, log logr.Logger) (*Server, error) {
	wf := cfg.Workflow
	if wf == nil {
		return nil, errors.New("store server: the configuration names no workflow")
	}
	rules, errs, _ := semantics.Compile(ctx, &wf.Spec)
	if len(errs) > 0 {
		return nil, fmt.Errorf("workflow %s: %w", wf.Name, errs.ToAggregate())
	}
	nc, err := transport.Connect(cfg.NATSURL, transport.ConnOptions{
		Name:          "sluice-store-server " + wf.Namespace + "/" + wf.Name,
		ReconnectWait: time.Second, Inbox: cfg.NATSInbox, Creds: cfg.NATSCreds, CA: cfg.NATSCA,
	})
	if err != nil {
		return nil, err
	}
	// The server only serves: nothing of the store moves to the disk tier on its account,
	// and it stores no permanent output.
	n, err := wfnode.New(wfnode.Config{Workflow: wf, Rules: rules, StoreDir: cfg.DataDir(),
		DiskDir: cfg.DiskDir, Spill: wfnode.SpillNone})
	if err != nil {
		nc.Close()
		return nil, err
	}
	log = log.WithValues("namespace", wf.Namespace, "workflow", wf.Name)
	err = n.Join(ctx, transport.Config{
		Conn: nc, Names: wfmeta.NamesForWorkflow(wf.Namespace, wf.Name, string(wf.UID)),
		Provisioned: len(cfg.NATSCreds) > 0,
		Node:        PeerName(cfg.Node), Host: cfg.Node, StateDir: cfg.StateDir(),
		Log: log.WithName("transport"),
	})
	if err != nil {
		nc.Close()
		n.Store.Close()
		return nil, err
	}
	log.Info("serving the workflow's node store to the other nodes")
	srv := &Server{node: n, nc: nc, log: log, host: cfg.Node, rules: rules}
	var outCtx context.Context
	outCtx, srv.cancel = context.WithCancel(context.WithoutCancel(ctx))
	n.Output(outCtx, outputs.Config{Node: PeerName(cfg.Node), Log: log.WithName("outputs"), Home: srv.home})
	return srv, nil
}

// home says whether this server records the commit of file p (its size, SHA-256 and
// holders, outputs.Copier): a file that committed after its creator's pod had ended
// (OnTermination over several instances, OnFile), written on this server's node, and
// not permanent. Its bytes are here, so nothing crosses the network to hash them; a pod
// of the workflow still running elsewhere would have to fetch them all. A permanent
// file is adopted by a running pod instead (sidecar), which holds the object storage's
// credentials this server never gets. The first peer to claim a file records it
// (transport.Peer.AdoptOrphan).
func (s *Server) home(p string) bool {
	if s.rules.IsPermanent(p) || s.node.Peer.CreatorHost(p) != s.host {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ok, err := s.node.Peer.AdoptOrphan(ctx, p)
	if err != nil {
		s.log.Error(err, "adopting a file whose creator's pod has ended", "path", pathpattern.Printable(p))
		return false
	}
	if ok {
		s.log.V(1).Info("adopted a file whose creator's pod has ended", "path", pathpattern.Printable(p))
	}
	return ok
}

// Stop stops serving.
func (s *Server) Stop() {
	s.cancel()
	s.node.Stop()
	s.nc.Close()
	s.log.Info("stopped serving the workflow's node store")
}

// Stop stops the store server of the workflow directory dir, if one runs: before the
// directory is removed (the workflow retired): it returns once no process of it holds
// the workflow's directories. A start in progress is cancelled, and Stop waits for it
// (outside the servers' lock: a child process is stopped within seconds of the cancel)
// and for Ensure to stop what it made; the record, which the plugin removes first, is
// gone for the next one.
func (s *Servers) Stop(dir string) {
	s.mu.Lock()
	srv := s.peers[dir]
	delete(s.peers, dir)
	delete(s.retry, dir)
	st := s.starting[dir]
	if st != nil {
		st.stopped = true
		st.cancel()
	}
	s.mu.Unlock()
	if st != nil {
		<-st.done
	}
	if srv != nil {
		srv.Stop()
		s.log.Info("stopped serving a workflow's node store", "dir", dir)
	}
}

// StopAll stops every store server, and cancels the starts in progress (the plugin is
// shutting down).
func (s *Servers) StopAll() {
	s.mu.Lock()
	dirs := make([]string, 0, len(s.peers)+len(s.starting))
	for dir := range s.peers {
		dirs = append(dirs, dir)
	}
	for dir := range s.starting {
		dirs = append(dirs, dir)
	}
	s.mu.Unlock()
	for _, dir := range dirs {
		s.Stop(dir)
	}
}

// Running returns the workflow directories served now.
func (s *Servers) Running() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.peers))
	for dir := range s.peers {
		out = append(out, dir)
	}
	return out
}
