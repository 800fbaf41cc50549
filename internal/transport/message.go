// Package transport carries a workflow's files between nodes over NATS JetStream: every
// peer (a pod's sidecar, or a node of `sluice run --nodes`) publishes what its step
// instances do to governed files (creations, data chunks, closes, renames, terminations)
// to the workflow's stream, and applies what the other peers published, in stream order.
//
// Stream order is what makes the replicas agree: a writer's data chunks precede its close
// (and its instance's termination) in the stream, so when a peer sees the event that
// commits a file, it already holds every byte of it. Commit rules are monotone (counts
// only grow), so applying a peer's own events at once and the others' later gives every
// peer the same commits.
//
// Peers on the same host share one node store directory. Each peer's engine follows the
// whole stream headers-only; exactly one peer per host (the materialiser, elected with a
// file lock) downloads other hosts' bytes into the shared store, and a peer applies another
// host's event only once the materialiser has stored everything up to it. Bytes written on
// the same host are never fetched back from NATS: they are already in the store.
package transport

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/sluice-io/sluice/internal/pathpattern"
	"github.com/sluice-io/sluice/internal/wfmeta"
)

// MaxChunk is the largest data chunk in bytes (1 MiB): the workflow stream's
// wfmeta.MaxChunk, which sizes the stream's messages.
const MaxChunk = wfmeta.MaxChunk

// MaxFileSize bounds offsets on the wire: a chunk ending beyond it is refused (1 TiB).
const MaxFileSize = 1 << 40

// Kind is what a message says.
type Kind string

// Message kinds.
const (
	KindCreate    Kind = "create"    // Path created (Dir says whether a directory)
	KindData      Kind = "data"      // Data written at Offset of Path (replicated through the stream)
	KindExtent    Kind = "extent"    // Length bytes written at Offset of Path on Host, which serves them
	KindTruncate  Kind = "truncate"  // Path truncated to Size
	KindClose     Kind = "close"     // one close of Path by a writer
	KindRename    Kind = "rename"    // Path renamed to NewPath, of Size bytes
	KindRemove    Kind = "remove"    // Path unlinked before it committed
	KindTerminate Kind = "terminate" // Step[Instance] exited for good; failed, for Reason, when Reason is set
	KindPoison    Kind = "poison"    // Path can never be complete, for Reason (a write failed)
	KindSymlink   Kind = "symlink"   // Path created as a symbolic link to Target
	KindWithdraw  Kind = "withdraw"  // Path taken back, for Reason (its attempt failed)
	KindLink      Kind = "link"      // NewPath made a hard link to Path, of Size bytes final from then on
)

// MaxReason bounds a poison message's reason in bytes.
const MaxReason = 1024

// Header names.
const (
	hdrNode   = "Sluice-Node"
	hdrHost   = "Sluice-Host"
	hdrIncarn = "Sluice-Incarnation"
	hdrLength = "Sluice-Length"
	// hdrServerSize is set by the server on a message delivered headers-only: the size
	// of the payload left out.
	hdrServerSize = "Nats-Msg-Size"
	hdrKind       = "Sluice-Kind"
	hdrPath       = "Sluice-Path"
	hdrNewPath    = "Sluice-New-Path"
	hdrOffset     = "Sluice-Offset"
	hdrSize       = "Sluice-Size"
	hdrDir        = "Sluice-Dir"
	hdrStep       = "Sluice-Step"
	hdrInstance   = "Sluice-Instance"
	hdrReason     = "Sluice-Reason"
	hdrTarget     = "Sluice-Target"
)

// Message is one event of a peer.
type Message struct {
	Node        string // the publishing peer
	Host        string // the host whose node store holds the peer's writes (default Node)
	Incarnation string // the publishing process's life: a restarted peer has a new one
	Kind        Kind   // what the message says
	Path        string // cleaned volume path (all kinds but terminate)
	NewPath     string // rename target
	Offset      int64  // data offset in bytes
	Size        int64  // truncate and rename: the file's size in bytes
	Dir         bool   // create: a directory
	Step        string // terminate: the step
	Instance    int    // terminate: the instance
	Data        []byte // data: the bytes (at most MaxChunk); nil when received headers-only
	Length      int64  // data and extent: the number of bytes, also known without the payload
	Reason      string // poison, withdraw: why (at most MaxReason bytes); terminate: how the instance failed, "" for a success
	Target      string // symlink: the link's target, as written (never followed by a server)
}

// ErrInvalid is wrapped by every decoding error: the message is refused, never applied.
var ErrInvalid = errors.New("invalid message")

// Encode turns m into a NATS message on subject.
func Encode(subject string, m *Message) *nats.Msg {
	msg := nats.NewMsg(subject)
	h := msg.Header
	h.Set(hdrNode, m.Node)
	if m.Host != "" && m.Host != m.Node {
		h.Set(hdrHost, m.Host)
	}
	if m.Incarnation != "" {
		h.Set(hdrIncarn, m.Incarnation)
	}
	h.Set(hdrKind, string(m.Kind))
	switch m.Kind {
	case KindTerminate:
		h.Set(hdrStep, m.Step)
		h.Set(hdrInstance, strconv.Itoa(m.Instance))
		if reason := m.Reason; reason != "" {
			if len(reason) > MaxReason {
				reason = reason[:MaxReason]
			}
			h.Set(hdrReason, reason)
		}
	default:
		h.Set(hdrPath, m.Path)
	}
	switch m.Kind {
	case KindCreate:
		if m.Dir {
			h.Set(hdrDir, "1")
		}
	case KindData:
		h.Set(hdrOffset, strconv.FormatInt(m.Offset, 10))
		h.Set(hdrLength, strconv.Itoa(len(m.Data)))
		msg.Data = m.Data
	case KindExtent:
		h.Set(hdrOffset, strconv.FormatInt(m.Offset, 10))
		h.Set(hdrLength, strconv.FormatInt(m.Length, 10))
	case KindTruncate:
		h.Set(hdrSize, strconv.FormatInt(m.Size, 10))
	case KindRename, KindLink:
		h.Set(hdrNewPath, m.NewPath)
		h.Set(hdrSize, strconv.FormatInt(m.Size, 10))
	case KindSymlink:
		h.Set(hdrTarget, m.Target)
	case KindPoison, KindWithdraw:
		reason := m.Reason
		if len(reason) > MaxReason {
			reason = reason[:MaxReason]
		}
		h.Set(hdrReason, reason)
	}
	return msg
}

// Decode reads a message received from the wire. Everything in it is untrusted: paths
// must be clean volume paths (no "..", not absolute, no NUL), offsets and sizes within
// MaxFileSize, chunks at most MaxChunk. A data message received headers-only (no payload)
// keeps its Sluice-Length in Length; with a payload, the payload's length must equal it.
// It returns an error wrapping ErrInvalid otherwise.
func Decode(msg *nats.Msg) (*Message, error) {
	h := msg.Header
	m := &Message{Node: h.Get(hdrNode), Host: h.Get(hdrHost), Incarnation: h.Get(hdrIncarn), Kind: Kind(h.Get(hdrKind))}
	if m.Node == "" || strings.ContainsAny(m.Node, "\x00") {
		return nil, fmt.Errorf("%w: no node", ErrInvalid)
	}
	if m.Host == "" {
		m.Host = m.Node
	} else if strings.ContainsAny(m.Host, "\x00") {
		return nil, fmt.Errorf("%w: bad host %q", ErrInvalid, m.Host)
	}
	var err error
	if m.Kind != KindTerminate {
		if m.Path, err = wirePath(h.Get(hdrPath)); err != nil {
			return nil, err
		}
	}
	switch m.Kind {
	case KindCreate:
		m.Dir = h.Get(hdrDir) == "1"
	case KindData:
		if m.Offset, err = wireInt(h.Get(hdrOffset), "offset"); err != nil {
			return nil, err
		}
		// The payload's length: the bytes received, or, delivered headers-only, the size
		// the server reports. It must be what the sender said, so that a peer following
		// headers-only decides exactly as one that received the bytes.
		got := int64(len(msg.Data))
		if sz := h.Get(hdrServerSize); sz != "" && got == 0 {
			if got, err = wireInt(sz, "payload size"); err != nil {
				return nil, err
			}
		}
		if m.Length, err = wireInt(h.Get(hdrLength), "length"); err != nil {
			return nil, err
		}
		if got != m.Length {
			return nil, fmt.Errorf("%w: chunk of %d bytes says it has %d", ErrInvalid, got, m.Length)
		}
		if m.Length > MaxChunk {
			return nil, fmt.Errorf("%w: chunk of %d bytes exceeds %d", ErrInvalid, m.Length, MaxChunk)
		}
		if m.Offset+m.Length > MaxFileSize {
			return nil, fmt.Errorf("%w: chunk at %d+%d ends beyond %d", ErrInvalid, m.Offset, m.Length, int64(MaxFileSize))
		}
		if len(msg.Data) > 0 {
			m.Data = msg.Data
		}
	case KindExtent:
		if m.Offset, err = wireInt(h.Get(hdrOffset), "offset"); err != nil {
			return nil, err
		}
		if m.Length, err = wireInt(h.Get(hdrLength), "length"); err != nil {
			return nil, err
		}
		if sz := h.Get(hdrServerSize); len(msg.Data) > 0 || sz != "" && sz != "0" {
			return nil, fmt.Errorf("%w: an extent of %q carries a payload", ErrInvalid, m.Path)
		}
		if m.Length == 0 || m.Length > MaxChunk {
			return nil, fmt.Errorf("%w: extent of %d bytes (1 to %d)", ErrInvalid, m.Length, MaxChunk)
		}
		if m.Offset+m.Length > MaxFileSize {
			return nil, fmt.Errorf("%w: extent at %d+%d ends beyond %d", ErrInvalid, m.Offset, m.Length, int64(MaxFileSize))
		}
	case KindTruncate:
		if m.Size, err = wireInt(h.Get(hdrSize), "size"); err != nil {
			return nil, err
		}
	case KindRename, KindLink:
		if m.NewPath, err = wirePath(h.Get(hdrNewPath)); err != nil {
			return nil, err
		}
		if m.Size, err = wireInt(h.Get(hdrSize), "size"); err != nil {
			return nil, err
		}
	case KindClose, KindRemove:
	case KindSymlink:
		m.Target = h.Get(hdrTarget)
		if m.Target == "" || len(m.Target) >= 4096 || strings.ContainsRune(m.Target, 0) {
			return nil, fmt.Errorf("%w: symlink %q with a target of %d bytes (1 to 4095, no NUL)", ErrInvalid, m.Path, len(m.Target))
		}
	case KindPoison, KindWithdraw:
		m.Reason = h.Get(hdrReason)
		if m.Reason == "" || len(m.Reason) > MaxReason {
			return nil, fmt.Errorf("%w: %s of %q with a reason of %d bytes (1 to %d)", ErrInvalid, m.Kind, m.Path, len(m.Reason), MaxReason)
		}
	case KindTerminate:
		m.Step = h.Get(hdrStep)
		if m.Step == "" || strings.ContainsAny(m.Step, "\x00/") {
			return nil, fmt.Errorf("%w: bad step %q", ErrInvalid, m.Step)
		}
		inst, err := wireInt(h.Get(hdrInstance), "instance")
		if err != nil {
			return nil, err
		}
		if inst > 1<<20 {
			return nil, fmt.Errorf("%w: instance %d out of range", ErrInvalid, inst)
		}
		m.Instance = int(inst)
		if m.Reason = h.Get(hdrReason); len(m.Reason) > MaxReason {
			return nil, fmt.Errorf("%w: termination of %s[%d] with a reason of %d bytes (at most %d)", ErrInvalid, m.Step, m.Instance, len(m.Reason), MaxReason)
		}
	default:
		return nil, fmt.Errorf("%w: unknown kind %q", ErrInvalid, m.Kind)
	}
	return m, nil
}

// wirePath accepts only paths that are already clean volume paths.
func wirePath(p string) (string, error) {
	if strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("%w: absolute path %q", ErrInvalid, p)
	}
	c, err := pathpattern.Clean(p)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if c != p || c == "." {
		return "", fmt.Errorf("%w: path %q is not a clean volume path", ErrInvalid, p)
	}
	return c, nil
}

func wireInt(s, what string) (int64, error) {
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 || v > MaxFileSize {
		return 0, fmt.Errorf("%w: bad %s %q", ErrInvalid, what, s)
	}
	return v, nil
}
