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
	"github.com/sluice-io/sluice/internal/storeserver"
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
	// deposit keeps the store server's deposit of the pod's workflow (OpDeposit).
	deposit func(vol handoff.Volume, data map[string][]byte) error
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
	s := &session{dir: dir, listener: lis, done: make(chan struct{}), deposit: d.keepDeposit}
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
		if s.init == nil {
			s.init = append([]byte(nil), req.Init...)
			if s.appTarget != "" {
				target := s.appTarget // read under s.mu
				go func() { _ = DisablePoll(target) }()
			}
		}
		return handoff.Reply{}, nil
	case handoff.OpDeposit:
		if !s.appPublished {
			return handoff.Reply{Error: "the pod's streaming volume is not published yet"}, nil
		}
		if err := s.deposit(s.vol, req.Deposit); err != nil {
			return handoff.Reply{Error: err.Error()}, nil
		}
		return handoff.Reply{}, nil
	default:
		return handoff.Reply{Error: fmt.Sprintf("unknown op %q", req.Op)}, nil
	}
}

// keepDeposit checks the store server deposit a sidecar of the pod published as vol
// handed over and keeps it in the workflow's deposit directory (DepositDir), which no pod
// can write: it must name the pod's own namespace and workflow (and the UID the plugin
// found in the API at publication).
func (d *Driver) keepDeposit(vol handoff.Volume, data map[string][]byte) error {
	if err := storeserver.CheckDeposit(data, vol.Namespace, vol.Workflow, vol.WorkflowUID); err != nil {
		return err
	}
	return storeserver.Deposit(d.DepositDir(vol.Namespace, vol.Workflow), data)
}

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

// pollHackName is the file go-fuse's servers answer specially so that the kernel asks
// them POLL once, gets ENOSYS, and never sends POLL again on the connection.
const pollHackName = ".go-fuse-epoll-hack"

// DisablePoll does for a handed-over FUSE mount at target what go-fuse does for the mounts
// it makes itself: it polls go-fuse's poll-hack file there, the server answers POLL with
// ENOSYS, and the kernel never sends POLL on the connection again (the answer stays with
// the connection across server restarts). Without it, the first epoll registration of a
// file on the volume sends FUSE POLL from inside epoll_ctl(2). Go's runtime registers every
// file it opens, with a raw system call that keeps its P: a process that serves the mount
// itself and opens files on it (a test running a sidecar in-process) can then have both of
// its Ps blocked in the kernel — the registering thread waiting for the answer, a netpoller
// thread waiting for the epoll instance — and the server goroutines that would answer never
// run. The CSI node plugin calls it once per mount, after the first server answered INIT;
// it needs the mount served. It returns the open's error (the mount is not served, or not a
// go-fuse server).
func DisablePoll(target string) error {
	fd, err := unix.Open(filepath.Join(target, pollHackName), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening the poll hack file of FUSE mount %q: %w", target, err)
	}
	defer unix.Close(fd)
	_, _ = unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN | unix.POLLPRI | unix.POLLOUT}}, 0)
	return nil
}
