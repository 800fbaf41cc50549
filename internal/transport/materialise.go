package transport

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-io/sluice/internal/pathpattern"
	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/store"
)

// materialiser stores the other hosts' files in this host's node store: their bytes and
// their namespace changes (creations, truncations, renames, unlinks), in stream order. One
// peer per host holds the role; it keeps its own replica of the workflow's file state, so
// that it refuses exactly what every engine refuses (data for a committed file, paths no
// rule governs) without waiting for any peer's engine, which runs behind it.
type materialiser struct {
	n      *Peer
	engine *semantics.Engine
	files  *fileCache
	// w changes the store: bytes, names and their accounting together. It tells nobody:
	// apply gives every message to the replica (applyToEngine) once the store has it.
	w *store.Files
}

// materialise waits to become the host's materialiser, then stores the stream until the
// peer stops. After a previous materialiser (a sidecar that exited or was killed), it
// rebuilds its replica headers-only up to where that one got, and stores from there on:
// nothing is fetched twice, and a message half-applied by a killed materialiser is
// applied again (every file change below is idempotent when repeated at once).
func (n *Peer) materialise() {
	if err := n.host.Acquire(n.ctx); err != nil {
		if n.ctx.Err() == nil {
			n.cfg.Log.Error(err, "competing for the host's materialiser role")
		}
		return
	}
	m := &materialiser{n: n, engine: semantics.NewEngine(n.Rules()), files: newFileCache(), w: n.store.Files(nil)}
	defer m.files.closeAll()
	from := n.host.Progress()
	n.cfg.Log.V(1).Info("materialising other hosts' files", "fromSeq", from+1)
	if from > 0 {
		if err := m.replay(from); err != nil {
			if n.ctx.Err() == nil {
				n.cfg.Log.Error(err, "rebuilding the materialiser's file state")
			}
			return
		}
	}
	// The host's fetcher too: what a previous one fetched is in the store.
	n.fetcher.restore()
	sub, err := n.fetcher.serveEnsure()
	if err != nil {
		n.cfg.Log.Error(err, "becoming the host's fetcher")
		return
	}
	defer func() { _ = sub.Unsubscribe() }()
	n.fetching.Store(true)
	defer n.fetching.Store(false)
	m.store(from + 1)
}

// replay applies the stream up to and including seq to the replica, headers only.
func (m *materialiser) replay(seq uint64) error {
	n := m.n
	stream, err := n.js.Stream(n.ctx, n.cfg.Names.Stream)
	if err != nil {
		return fmt.Errorf("stream %s: %w", n.cfg.Names.Stream, err)
	}
	if last := stream.CachedInfo().State.LastSeq; last < seq {
		return fmt.Errorf("the host's state says sequence %d is stored, but stream %s ends at %d", seq, n.cfg.Names.Stream, last)
	}
	cons, err := n.consumer(n.ctx, 1, true)
	if err != nil {
		return err
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(4096), jetstream.PullHeartbeat(consumerHeartbeat))
	if err != nil {
		return err
	}
	defer it.Stop()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-n.ctx.Done():
			it.Stop()
		case <-stop:
		}
	}()
	for {
		msg, err := it.Next()
		if err != nil {
			return err
		}
		md, err := msg.Metadata()
		if err != nil {
			continue
		}
		if dm, err := Decode(&nats.Msg{Subject: msg.Subject(), Header: msg.Headers()}); err == nil {
			_ = applyToEngine(m.engine, n.Rules(), dm)
		}
		if md.Sequence.Stream >= seq {
			return nil
		}
	}
}

// store applies the stream from sequence start on, with payloads, recording its progress
// after each message.
func (m *materialiser) store(start uint64) {
	n := m.n
	cons, err := n.consumer(n.ctx, start, false)
	if err != nil {
		if n.ctx.Err() == nil {
			n.cfg.Log.Error(err, "materialising the workflow stream")
		}
		return
	}
	// Pull at most 16 MiB at a time: a nats.go subscription holds at most 64 MiB pending by
	// default, and a pull that fills it makes the client drop messages, which an ordered
	// consumer repairs only by resetting itself — measured as stalls of 2 to 40 s.
	n.consume(cons, "materialising the workflow stream", []jetstream.PullMessagesOpt{jetstream.PullMaxBytes(16 << 20)},
		func(msg jetstream.Msg, seq uint64) bool {
			if err := m.apply(msg); err != nil {
				n.cfg.Log.V(1).Info("materialiser refused a message", "subject", msg.Subject(), "seq", seq, "err", err.Error())
			}
			if err := n.host.SetProgress(seq); err != nil {
				n.cfg.Log.Error(err, "recording materialiser progress")
			}
			return true
		})
}

// apply applies one message to the replica and, when it comes from another host, to the
// node store.
func (m *materialiser) apply(jm jetstream.Msg) error {
	n := m.n
	msg, err := Decode(&nats.Msg{Subject: jm.Subject(), Header: jm.Headers(), Data: jm.Data()})
	if err != nil {
		return err
	}
	if msg.Host == n.cfg.Host {
		// Written on this host: the bytes and names are in the store already.
		return applyToEngine(m.engine, n.Rules(), msg)
	}
	if msg.Kind != KindTerminate && !n.Rules().Resolve(msg.Path).Governed() {
		return fmt.Errorf("%s of %q: no rule governs it; plain files are never sent", msg.Kind, msg.Path)
	}
	st := n.store
	switch msg.Kind {
	case KindCreate:
		if err := st.MkdirAll(pathpattern.Parent(msg.Path)); err != nil {
			return err
		}
		if msg.Dir {
			if err := st.MkdirAll(msg.Path); err != nil {
				return err
			}
		} else if fd, err := st.Open(msg.Path, syscall.O_CREAT|syscall.O_WRONLY, 0o644); err == nil {
			syscall.Close(fd)
		} else {
			return err
		}
	case KindData:
		if int64(len(msg.Data)) != msg.Length {
			return fmt.Errorf("data for %q at %d: %d bytes received of %d", msg.Path, msg.Offset, len(msg.Data), msg.Length)
		}
		if m.engine.Failed(msg.Path) != nil {
			return nil // already reported
		}
		if s := m.engine.Status(msg.Path); s.Committed {
			return fmt.Errorf("data for %q at %d: the file is committed", msg.Path, msg.Offset)
		}
		f, err := m.files.get(st, msg.Path)
		if err != nil {
			return err
		}
		if _, err := m.w.WriteAt(n.ctx, msg.Path, int(f.Fd()), msg.Data, msg.Offset); err != nil {
			m.fail(msg.Path, err)
			var refused *store.ReserveError
			if errors.As(err, &refused) {
				return fmt.Errorf("storing %d bytes of %q: %w", msg.Length, msg.Path, err)
			}
			return fmt.Errorf("writing %q at %d: %w", msg.Path, msg.Offset, err)
		}
		n.received.Add(msg.Length)
	case KindExtent:
		// Where bytes are, not the bytes: fetched when a reader of this host reads them.
		// The store file grows to the size written (sparse: nothing is allocated), so
		// that its size is the file's; its holes are filled by the fetches.
		if m.engine.Failed(msg.Path) != nil {
			return nil // already reported
		}
		if s := m.engine.Status(msg.Path); s.Committed {
			return fmt.Errorf("extent of %q at %d: the file is committed", msg.Path, msg.Offset)
		}
		f, err := m.files.get(st, msg.Path)
		if err != nil {
			return err
		}
		end := msg.Offset + msg.Length
		if fi, err := f.Stat(); err != nil {
			return err
		} else if fi.Size() < end {
			if err := f.Truncate(end); err != nil {
				return fmt.Errorf("growing %q to %d bytes: %w", msg.Path, end, err)
			}
		}
	case KindSymlink:
		if err := st.MkdirAll(pathpattern.Parent(msg.Path)); err != nil {
			return err
		}
		// Repeated after a killed materialiser: the link is there already.
		if err := st.Symlink(msg.Target, msg.Path); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
	case KindTruncate:
		if err := m.w.Truncate(msg.Path, -1, msg.Size); err != nil {
			return err
		}
	case KindRename:
		if !n.Rules().Resolve(msg.NewPath).Governed() {
			return fmt.Errorf("rename onto %q: no rule governs it", msg.NewPath)
		}
		m.files.drop(msg.Path)
		if err := st.MkdirAll(pathpattern.Parent(msg.NewPath)); err != nil {
			return err
		}
		// Repeated after a killed materialiser: the source is gone and the target there
		// (and counted as it is).
		if err := m.w.Rename(msg.Path, msg.NewPath, 0); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	case KindLink:
		if !n.Rules().Resolve(msg.NewPath).Governed() {
			return fmt.Errorf("link %q: no rule governs it", msg.NewPath)
		}
		if err := st.MkdirAll(pathpattern.Parent(msg.NewPath)); err != nil {
			return err
		}
		// Repeated after a killed materialiser: the link is there already.
		if err := st.Link(msg.Path, msg.NewPath); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
	case KindRemove, KindWithdraw:
		m.files.drop(msg.Path)
		if err := m.w.Remove(msg.Path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return applyToEngine(m.engine, n.Rules(), msg)
}

// fail records that the bytes of p cannot be stored on this host: every peer's engine
// fails the file when it reaches the data (readers get ErrUnavailable, never a hang or
// a hole).
func (m *materialiser) fail(p string, err error) {
	m.engine.Fail(p, err)
	if merr := m.n.host.MarkFailed(p, err.Error()); merr != nil {
		m.n.cfg.Log.Error(merr, "recording a file that cannot be stored", "path", p)
	}
}
