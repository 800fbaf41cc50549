package transport

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A journal keeps, in a file of the peer's own (Config.JournalDir), every message the peer
// published that the server has not acknowledged yet, so that a peer killed before the
// acknowledgements (a sidecar's process killed) loses none of its events: the next life
// of the same peer publishes again those its predecessor's journal holds and the stream
// lacks (Peer.Recover). One file per incarnation, named after it; it is emptied whenever
// every message is acknowledged. Records are appended in publishing order:
//
//	uint32 length of meta | meta (JSON: subject, headers) | uint32 length of data | data
//
// Bytes written to the node store survive a killed process in the page cache, and so does
// the journal: it is written, not synced.
type journal struct {
	f   *os.File
	off int64
}

// journalMeta is a record's subject and headers.
type journalMeta struct {
	Subject string      `json:"s"`
	Header  nats.Header `json:"h"`
}

// journalSuffix ends every journal file's name.
const journalSuffix = ".journal"

// openJournal creates the journal of incarnation in dir.
func openJournal(dir, incarnation string) (*journal, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("journal directory %s: %w", dir, err)
	}
	f, err := os.OpenFile(filepath.Join(dir, incarnation+journalSuffix), os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	return &journal{f: f}, nil
}

// append records msg; an error means the message is published without the journal's
// protection (it is logged by the caller, never fatal).
func (j *journal) append(msg *nats.Msg) error {
	meta, err := json.Marshal(journalMeta{Subject: msg.Subject, Header: msg.Header})
	if err != nil {
		return err
	}
	rec := make([]byte, 0, 8+len(meta)+len(msg.Data))
	rec = binary.LittleEndian.AppendUint32(rec, uint32(len(meta)))
	rec = append(rec, meta...)
	rec = binary.LittleEndian.AppendUint32(rec, uint32(len(msg.Data)))
	rec = append(rec, msg.Data...)
	if _, err := j.f.WriteAt(rec, j.off); err != nil {
		return fmt.Errorf("journal %s: %w", j.f.Name(), err)
	}
	j.off += int64(len(rec))
	return nil
}

// reset empties the journal: everything in it is acknowledged.
func (j *journal) reset() error {
	if j.off == 0 {
		return nil
	}
	j.off = 0
	return j.f.Truncate(0)
}

func (j *journal) close() { j.f.Close() }

// leftover is what the journals of a peer's earlier lives hold.
type leftover struct {
	files []string
	msgs  []*nats.Msg
	// incarnations are the earlier lives whose messages the stream may hold.
	incarnations map[string]bool
}

// readLeftovers reads every journal in dir but current's, in file order then record
// order; a record cut short (the process killed while appending) ends its file.
func readLeftovers(dir, current string) (*leftover, error) {
	lo := &leftover{incarnations: map[string]bool{}}
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return lo, nil
	}
	if err != nil {
		return nil, fmt.Errorf("journal directory %s: %w", dir, err)
	}
	for _, e := range entries {
		name := e.Name()
		inc, ok := strings.CutSuffix(name, journalSuffix)
		if !ok || inc == current || !e.Type().IsRegular() {
			continue
		}
		path := filepath.Join(dir, name)
		lo.files = append(lo.files, path)
		lo.incarnations[inc] = true
		msgs, err := readJournal(path)
		if err != nil {
			return nil, err
		}
		lo.msgs = append(lo.msgs, msgs...)
	}
	return lo, nil
}

// readJournal reads one journal file's complete records.
func readJournal(path string) ([]*nats.Msg, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	defer f.Close()
	r := bufio.NewReader(f)
	var out []*nats.Msg
	for {
		meta, err := readBlock(r)
		if err != nil {
			return out, nil // end, or a record cut short
		}
		data, err := readBlock(r)
		if err != nil {
			return out, nil
		}
		var m journalMeta
		if err := json.Unmarshal(meta, &m); err != nil {
			return nil, fmt.Errorf("journal %s: record %d: %w", path, len(out), err)
		}
		msg := nats.NewMsg(m.Subject)
		msg.Header = m.Header
		if len(data) > 0 {
			msg.Data = data
		}
		out = append(out, msg)
	}
}

func readBlock(r io.Reader) ([]byte, error) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, err
	}
	size := binary.LittleEndian.Uint32(n[:])
	if size > MaxChunk+64<<10 {
		return nil, fmt.Errorf("journal record of %d bytes", size)
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, err
	}
	return b, nil
}

// msgID returns a message's Nats-Msg-Id.
func msgID(h nats.Header) string { return h.Get(jetstream.MsgIDHeader) }
