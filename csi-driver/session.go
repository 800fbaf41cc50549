package csidriver

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/sluice-io/sluice/csi-driver/handoff"
)

// session is what the plugin keeps of one pod between NodePublishVolume and
// NodeUnpublishVolume of its volumes: the mounted FUSE descriptor, the INIT request its
// first sidecar read, and the listener its sidecars attach through.
type session struct {
	dir string // pods/<uid>
	// ops counts the publishes working on the session (acquireSession); guarded by the
	// driver's mu.
	ops int

	mu            sync.Mutex
	vol           handoff.Volume
	appPublished  bool     // the app volume is published
	fuse          *os.File // the kept descriptor (fuse mode)
	directDir     string   // the pod's direct-mode directory (direct mode)
	appTarget     string
	sidecarTarget string
	init          []byte
	listener      *net.UnixListener
	done          chan struct{}
}

// sessionFor returns the session of pod uid, creating it and starting its listener.
// Callers hold d.mu.
func (d *Driver) sessionFor(uid string) (*session, error) {
	if s, ok := d.sessions[uid]; ok {
		return s, nil
	}
	dir := filepath.Join(d.podsRoot(), uid)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating the pod's control directory: %w", err)
	}
	sock := filepath.Join(dir, handoff.SocketName)
	_ = os.Remove(sock)
	lis, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", sock, err)
	}
	// The sidecar runs as a non-root user; only this pod's sidecar sees the directory.
	if err := os.Chmod(sock, 0o666); err != nil {
		lis.Close()
		return nil, fmt.Errorf("opening %s to the sidecar: %w", sock, err)
	}
	s := &session{dir: dir, listener: lis, done: make(chan struct{})}
	d.sessions[uid] = s
	go s.serve(d)
	return s, nil
}

// handoffConnsPerPod is how many connections to a pod's hand-off socket the plugin
// serves at once. A sidecar makes one request at a time; each connection may buffer a
// request of up to handoff.MaxRequest bytes for up to 30 s, so this bounds what a pod can
// make the plugin hold (2 MiB per pod on the node) however many connections it opens.
const handoffConnsPerPod = 2

func (s *session) serve(d *Driver) {
	defer close(s.done)
	slots := make(chan struct{}, handoffConnsPerPod)
	for {
		conn, err := s.listener.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			d.log.Error(err, "accepting a sidecar connection", "dir", s.dir)
			return
		}
		select {
		case slots <- struct{}{}:
		default:
			// Refused at once, with the reason, so that a sidecar retries (handoff.Attach
			// does) instead of waiting behind connections that send nothing.
			handoff.Refuse(conn, fmt.Sprintf("more than %d connections from this pod at once", handoffConnsPerPod))
			continue
		}
		go func() {
			defer func() { <-slots }()
			if err := handoff.Serve(conn, s.answer); err != nil {
				d.log.Info("sidecar hand-off failed", "dir", s.dir, "err", err.Error())
			}
		}()
	}
}

// answer answers a sidecar's request.
func (s *session) answer(req handoff.Request) (handoff.Reply, *os.File) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch req.Op {
	case handoff.OpAttach:
		if !s.appPublished {
			return handoff.Reply{Error: "the pod's streaming volume is not published yet"}, nil
		}
		vol := s.vol
		var dup *os.File
		if s.fuse != nil {
			fd, err := unix.FcntlInt(s.fuse.Fd(), unix.F_DUPFD_CLOEXEC, 0)
			if err != nil {
				return handoff.Reply{Error: "duplicating the FUSE descriptor: " + err.Error()}, nil
			}
			dup = os.NewFile(uintptr(fd), "/dev/fuse")
		}
		return handoff.Reply{Volume: &vol, Init: s.init}, dup
	case handoff.OpInit:
		if len(req.Init) == 0 {
			return handoff.Reply{Error: "empty INIT request"}, nil
		}
		// Kept, never looked into. The plugin opens nothing in the pod's volume: go-fuse's
		// servers answer the kernel's first POLL with ENOSYS themselves, and go-fuse's own
		// "poll hack" open (which would send that POLL early) would be the root plugin
		// following whatever a tenant's volume names there (issue 42).
		if s.init == nil {
			s.init = append([]byte(nil), req.Init...)
		}
		return handoff.Reply{}, nil
	case opDeposit:
		// Sidecars before issue 42 sent their NATS credentials for the store server, and
		// stop if refused: acknowledged, and nothing of it kept (the request's fields
		// past op are not even decoded). The store server's connection is the agent
		// Secret in the API.
		return handoff.Reply{}, nil
	default:
		return handoff.Reply{Error: fmt.Sprintf("unknown op %q", req.Op)}, nil
	}
}

// opDeposit is the op of older sidecars' deposits (see serve).
const opDeposit = "deposit"

// idle reports whether neither of the pod's volumes is published.
func (s *session) idle() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.appPublished && s.sidecarTarget == ""
}

// close stops the listener and drops the kept descriptor.
func (s *session) close() {
	s.listener.Close()
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fuse != nil {
		s.fuse.Close()
		s.fuse = nil
	}
}
