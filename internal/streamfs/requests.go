package streamfs

import (
	"bytes"
	"sort"
	"sync"
)

// RequestCounter counts FUSE requests by opcode from a view's request log
// (Options.RequestLog): each "rx N: OPCODE ..." line go-fuse writes for a request the
// kernel sent. A view's small-file cost is mostly its round trips, so the bench reports,
// and a test bounds, the requests a program's file costs. Safe for concurrent use.
type RequestCounter struct {
	mu      sync.Mutex
	partial []byte
	counts  map[string]int
}

// Write counts the requests in p, which may end within a line (the rest comes with the
// next Write). It never fails.
func (c *RequestCounter) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.counts == nil {
		c.counts = map[string]int{}
	}
	c.partial = append(c.partial, p...)
	data := c.partial
	for {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			break
		}
		c.count(data[:i])
		data = data[i+1:]
	}
	c.partial = append([]byte(nil), data...)
	return len(p), nil
}

// count counts one log line if it is a request's.
func (c *RequestCounter) count(line []byte) {
	rest, ok := bytes.CutPrefix(line, []byte("rx "))
	if !ok {
		return
	}
	_, op, ok := bytes.Cut(rest, []byte(": "))
	if !ok {
		return
	}
	if i := bytes.IndexByte(op, ' '); i >= 0 {
		op = op[:i]
	}
	c.counts[string(op)]++
}

// Counts returns the requests counted so far, by opcode (LOOKUP, CREATE, ...).
func (c *RequestCounter) Counts() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.counts))
	for k, v := range c.counts {
		out[k] = v
	}
	return out
}

// Total returns the number of requests counted so far, and the opcodes seen, sorted.
func (c *RequestCounter) Total() (int, []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	ops := make([]string, 0, len(c.counts))
	for k, v := range c.counts {
		n += v
		ops = append(ops, k)
	}
	sort.Strings(ops)
	return n, ops
}

// Reset forgets what was counted.
func (c *RequestCounter) Reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.counts, c.partial = nil, nil
}
