package takeover

import (
	"bufio"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/go-logr/logr"
)

// inodePaths maps the inode numbers a store reports (both its tiers) to their paths,
// walking it again when asked for an inode it has not seen.
type inodePaths struct {
	files Files
	mu    sync.Mutex
	paths map[uint64]string
}

func (ip *inodePaths) lookup(ino uint64) (string, bool) {
	if IsPlaceholder(ino) {
		return "", false
	}
	ip.mu.Lock()
	defer ip.mu.Unlock()
	if p, ok := ip.paths[ino]; ok {
		return p, true
	}
	ip.paths = map[uint64]string{}
	_ = ip.files.WalkFiles(func(ino uint64, rel string) error {
		if _, dup := ip.paths[ino]; !dup {
			ip.paths[ino] = rel
		}
		return nil
	})
	p, ok := ip.paths[ino]
	return p, ok
}

// placeholderBit is set in the node IDs of placeholders, and in no store inode number.
const placeholderBit = 1 << 62

// IsPlaceholder reports whether node ID ino is a placeholder's (PlaceholderIno), not a
// store inode number.
func IsPlaceholder(ino uint64) bool { return ino&placeholderBit != 0 }

// PlaceholderIno returns the node ID of the placeholder for path p (a name a view shows
// the kernel before it is visible): the same in every server of a mount, so that a
// restarted one revives it under the ID the kernel holds. 62 bits of FNV-1a: two paths
// that collide (odds about n²/2⁶³ for n placeholders) would share one node while neither
// is visible.
func PlaceholderIno(p string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(p))
	return placeholderBit | h.Sum64()&(placeholderBit-1)
}

// Placeholder is what a placeholder node ID stands for.
type Placeholder struct {
	// Path is the volume path of the name.
	Path string
	// Mode is the file type and permissions, as given to the kernel.
	Mode uint32
}

// NodeLog records the path of every placeholder node ID a view gave the kernel, in
// memory and in a file that outlives the server, one "<id> <mode> <quoted path>" line
// each, so that the next server of the mount revives them. A nil *NodeLog records
// nothing.
type NodeLog struct {
	mu    sync.Mutex
	paths map[uint64]Placeholder
	file  *os.File // nil: not recorded beyond this server
	name  string
	log   logr.Logger
}

// OpenNodeLog opens (creating it) the node log name and reads what earlier servers
// recorded. An empty name records in memory only. log receives failed writes. Errors
// name the file.
func OpenNodeLog(name string, log logr.Logger) (*NodeLog, error) {
	nl := &NodeLog{paths: map[uint64]Placeholder{}, name: name, log: log}
	if name == "" {
		return nl, nil
	}
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		return nil, fmt.Errorf("node log %s: %w", name, err)
	}
	f, err := os.OpenFile(name, os.O_CREATE|os.O_RDWR|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("node log %s: %w", name, err)
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		f := strings.SplitN(sc.Text(), " ", 3)
		if len(f) != 3 {
			continue
		}
		n, err := strconv.ParseUint(f[0], 10, 64)
		mode, merr := strconv.ParseUint(f[1], 8, 32)
		p, qerr := strconv.Unquote(f[2])
		if err == nil && merr == nil && qerr == nil {
			nl.paths[n] = Placeholder{Path: p, Mode: uint32(mode)}
		}
	}
	if err := sc.Err(); err != nil {
		f.Close()
		return nil, fmt.Errorf("reading node log %s: %w", name, err)
	}
	nl.file = f
	return nl, nil
}

// Record notes that node ID ino stands for path p, of mode. A failed write is logged: a
// restart would then fail that one node.
func (nl *NodeLog) Record(ino uint64, p string, mode uint32) {
	if nl == nil {
		return
	}
	nl.mu.Lock()
	defer nl.mu.Unlock()
	if _, ok := nl.paths[ino]; ok {
		return
	}
	nl.paths[ino] = Placeholder{Path: p, Mode: mode}
	if nl.file != nil {
		if _, err := fmt.Fprintf(nl.file, "%d %o %s\n", ino, mode, strconv.Quote(p)); err != nil {
			nl.log.Error(err, "recording a placeholder node for a later server", "file", nl.name, "path", p)
		}
	}
}

// Get returns what placeholder ino stands for.
func (nl *NodeLog) Get(ino uint64) (Placeholder, bool) {
	if nl == nil {
		return Placeholder{}, false
	}
	nl.mu.Lock()
	defer nl.mu.Unlock()
	p, ok := nl.paths[ino]
	return p, ok
}

// Close closes the node log's file; later placeholders are recorded in memory only.
func (nl *NodeLog) Close() {
	if nl == nil {
		return
	}
	nl.mu.Lock()
	defer nl.mu.Unlock()
	if nl.file != nil {
		nl.file.Close()
		nl.file = nil
	}
}
