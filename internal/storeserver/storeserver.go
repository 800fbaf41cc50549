// Package storeserver keeps a workflow's node store answering the other nodes after the
// pods that wrote it have ended.
//
// Bytes cross nodes only when a reader fetches them from the node that wrote them
// (docs/transport.md). On a cluster a pod's sidecar serves its node store while it runs
// and exits with its pod, yet a reader on another node may open a file after every pod
// that wrote it has ended. The CSI node plugin, which holds the node store and outlives
// the pods, therefore runs one serving peer per workflow whose sidecars deposited their
// connection on the node (Deposit): it follows the workflow's stream, competes for the
// node's materialiser role like the sidecars (so the store keeps applying the other
// nodes' renames and removals in stream order), and answers fetches from the store until
// the workflow is retired (Servers.Stop).
package storeserver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/podconfig"
	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/store"
	"github.com/sluice-io/sluice/internal/transport"
)

// DepositDir is the directory, under a workflow's state directory on a node, where the
// workflow's sidecars leave what the serving peer needs: the workflow, the NATS URL, the
// workflow's NATS credentials and inbox prefix (the pod configuration's files, without
// the object storage's credentials), readable by their owner only.
const DepositDir = "server"

// Deposit writes cfg's workflow and NATS connection into stateDir/DepositDir, replacing an
// earlier deposit at once (a new directory renamed over the old one), so the serving
// peer never reads half of one. Called by every sidecar of the workflow at start; the
// deposits are the same.
func Deposit(stateDir string, cfg *podconfig.Config) error {
	keep := *cfg
	keep.Storage = nil // the serving peer stores nothing in object storage
	data, err := keep.Data()
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(stateDir, "."+DepositDir+"-")
	if err != nil {
		return fmt.Errorf("depositing the workflow's connection for the node's store server: %w", err)
	}
	defer os.RemoveAll(tmp)
	for key, b := range data {
		if err := os.WriteFile(filepath.Join(tmp, key), b, 0o600); err != nil {
			return fmt.Errorf("depositing %s for the node's store server: %w", key, err)
		}
	}
	dst := filepath.Join(stateDir, DepositDir)
	// rename(2) replaces an empty directory only: move the old deposit aside first.
	old := tmp + ".old"
	if err := os.Rename(dst, old); err == nil {
		defer os.RemoveAll(old)
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("replacing the deposit in %s: %w", dst, err)
	}
	if err := os.Rename(tmp, dst); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("depositing the workflow's connection in %s: %w", dst, err)
	}
	return nil
}

// PeerName is the transport peer name of the store server of node: "store-<node>",
// distinct from every sidecar's (transport.InstancePeer names step instances).
func PeerName(node string) string { return "store-" + node }

// Servers runs the store servers of one node, one per workflow directory.
type Servers struct {
	node   string
	log    logr.Logger
	diskOf func(dir string) string

	mu    sync.Mutex
	peers map[string]*server // by workflow directory
}

type server struct {
	tn *transport.Node
	nc *nats.Conn
}

// New returns the store servers of node (the Kubernetes node's name, as the sidecars give
// it as their transport host); diskOf gives a workflow directory's disk tier directory
// (csidriver.Driver.DiskDirOf).
func New(node string, log logr.Logger, diskOf func(dir string) string) *Servers {
	return &Servers{node: node, log: log, diskOf: diskOf, peers: map[string]*server{}}
}

// Ensure starts the store server of the workflow whose node directory is dir (holding
// data/ and state/) if its sidecars left a deposit there and none runs yet; otherwise it
// does nothing. Errors name the directory; a failed start is tried again at the next call.
func (s *Servers) Ensure(ctx context.Context, dir string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.peers[dir]; ok {
		return nil
	}
	deposit := filepath.Join(dir, "state", DepositDir)
	if _, err := os.Stat(deposit); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	cfg, err := podconfig.Load(deposit)
	if err != nil {
		return fmt.Errorf("store server of %s: %w", dir, err)
	}
	wf := cfg.Workflow
	rules, errs, _ := semantics.Compile(&wf.Spec)
	if len(errs) > 0 {
		return fmt.Errorf("store server of %s: workflow %s: %w", dir, wf.Name, errs.ToAggregate())
	}
	opts := []nats.Option{
		nats.Name("sluice-store-server " + wf.Namespace + "/" + wf.Name),
		nats.MaxReconnects(-1), nats.ReconnectWait(time.Second),
	}
	if len(cfg.NATSCreds) > 0 {
		opts = append(opts, nats.UserCredentials(filepath.Join(deposit, v1alpha1.SecretKeyNATSCreds)))
	}
	if cfg.NATSInbox != "" {
		opts = append(opts, nats.CustomInboxPrefix(cfg.NATSInbox))
	}
	nc, err := nats.Connect(cfg.NATSURL, opts...)
	if err != nil {
		return fmt.Errorf("store server of %s: connecting to NATS at %s: %w", dir, cfg.NATSURL, err)
	}
	st, err := store.New(filepath.Join(dir, "data"), podconfig.StoreOptions(wf, rules, 0, s.diskOf(dir)))
	if err != nil {
		nc.Close()
		return fmt.Errorf("store server of %s: %w", dir, err)
	}
	log := s.log.WithValues("namespace", wf.Namespace, "workflow", wf.Name)
	tn, err := transport.Start(ctx, transport.Config{
		Conn: nc, Names: transport.NamesForWorkflow(wf.Namespace, wf.Name, string(wf.UID)),
		Provisioned: len(cfg.NATSCreds) > 0,
		Node:        PeerName(s.node), Host: s.node, StateDir: filepath.Join(dir, "state"),
		Engine: semantics.NewEngine(rules), Store: st, Log: log.WithName("transport"),
	})
	if err != nil {
		nc.Close()
		return fmt.Errorf("store server of %s: %w", dir, err)
	}
	s.peers[dir] = &server{tn: tn, nc: nc}
	log.Info("serving the workflow's node store to the other nodes", "dir", dir)
	return nil
}

// Stop stops the store server of the workflow directory dir, if one runs: before the
// directory is removed (the workflow retired).
func (s *Servers) Stop(dir string) {
	s.mu.Lock()
	srv := s.peers[dir]
	delete(s.peers, dir)
	s.mu.Unlock()
	if srv != nil {
		srv.tn.Stop()
		srv.nc.Close()
		s.log.Info("stopped serving a workflow's node store", "dir", dir)
	}
}

// StopAll stops every store server (the plugin is shutting down).
func (s *Servers) StopAll() {
	s.mu.Lock()
	dirs := make([]string, 0, len(s.peers))
	for dir := range s.peers {
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
