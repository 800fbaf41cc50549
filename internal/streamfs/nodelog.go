package streamfs

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

	"github.com/sluice-io/sluice/internal/store"
)

// inodePaths maps the inode numbers a store reports (both its tiers) to their paths,
// walking it again when asked for an inode it has not seen.
type inodePaths struct {
	store *store.Store
	mu    sync.Mutex
	paths map[uint64]string
}

func (ip *inodePaths) lookup(ino uint64) (string, bool) {
	if ino&placeholderBit != 0 {
		return "", false
	}
	ip.mu.Lock()
	defer ip.mu.Unlock()
	if p, ok := ip.paths[ino]; ok {
		return p, true
	}
	ip.paths = map[uint64]string{}
	_ = ip.store.WalkFiles(func(ino uint64, rel string) error {
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

// placeholderIno returns the node ID of the placeholder for path p: the same in every
// server of a mount, so that a restarted one revives it under the ID the kernel holds.
// 62 bits of FNV-1a: two paths that collide (odds about n²/2⁶³ for n placeholders) would
// share one node while neither is visible.
func placeholderIno(p string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(p))
	return placeholderBit | h.Sum64()&(placeholderBit-1)
}

// placeholder is what a placeholder node ID stands for.
type placeholder struct {
	path string
	mode uint32 // file type and permissions, as given to the kernel
}

// placeholders records the path of every placeholder node ID a view gave the kernel, in
// memory and in the view's node log (Options.NodeLog), one "<id> <mode> <quoted path>"
// line each.
type placeholders struct {
	mu    sync.Mutex
	paths map[uint64]placeholder
	log   *os.File // nil: not recorded beyond this server
	name  string
}

// openPlaceholders opens (creating it) the node log name and reads what earlier servers
// recorded. An empty name records in memory only. Errors name the file.
func openPlaceholders(name string) (*placeholders, error) {
	ph := &placeholders{paths: map[uint64]placeholder{}, name: name}
	if name == "" {
		return ph, nil
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
			ph.paths[n] = placeholder{path: p, mode: uint32(mode)}
		}
	}
	if err := sc.Err(); err != nil {
		f.Close()
		return nil, fmt.Errorf("reading node log %s: %w", name, err)
	}
	ph.log = f
	return ph, nil
}

// record notes that node ID ino stands for path p. A view without placeholders (nil)
// records nothing. A failed write is logged: a restart would then fail that one node.
func (ph *placeholders) record(ino uint64, p string, mode uint32, log logr.Logger) {
	if ph == nil {
		return
	}
	ph.mu.Lock()
	defer ph.mu.Unlock()
	if _, ok := ph.paths[ino]; ok {
		return
	}
	ph.paths[ino] = placeholder{path: p, mode: mode}
	if ph.log != nil {
		if _, err := fmt.Fprintf(ph.log, "%d %o %s\n", ino, mode, strconv.Quote(p)); err != nil {
			log.Error(err, "recording a placeholder node for a later server", "file", ph.name, "path", p)
		}
	}
}

// get returns what placeholder ino stands for.
func (ph *placeholders) get(ino uint64) (placeholder, bool) {
	if ph == nil {
		return placeholder{}, false
	}
	ph.mu.Lock()
	defer ph.mu.Unlock()
	p, ok := ph.paths[ino]
	return p, ok
}

// close closes the node log; later placeholders are recorded in memory only.
func (ph *placeholders) close() {
	if ph == nil {
		return
	}
	ph.mu.Lock()
	defer ph.mu.Unlock()
	if ph.log != nil {
		ph.log.Close()
		ph.log = nil
	}
}
