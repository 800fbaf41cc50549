package runner

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// LogWriter returns where log lines go so that they do not break progress p's view: for
// a live view, above it (redrawn below them); otherwise nil (write them as usual).
func LogWriter(p Progress) io.Writer {
	if lp, ok := p.(*liveProgress); ok {
		return lp
	}
	return nil
}

// NewProgress returns a live view for a terminal (redrawn in place every second) or, for
// anything else, plain lines every interval.
func NewProgress(w io.Writer, terminal bool, interval time.Duration) Progress {
	if terminal {
		return &liveProgress{w: w}
	}
	return &lineProgress{w: w, interval: interval}
}

func stepLine(s StepSnapshot) string {
	state := "pending"
	switch {
	case s.Failed > 0:
		state = fmt.Sprintf("FAILED %d", s.Failed)
	case s.Done == s.Replicas:
		state = "done"
	case s.Running > 0 && s.Blocked > 0:
		state = "waiting"
	case s.Running > 0:
		state = "running"
	}
	instances := "instances"
	if s.Replicas == 1 {
		instances = "instance"
	}
	line := fmt.Sprintf("%-16s %-9s %d/%d %-9s  wrote %-10s read %s", s.Name, state, s.Done, s.Replicas, instances, HumanBytes(s.BytesWritten), HumanBytes(s.BytesRead))
	if state == "waiting" && s.Waiting != "" {
		line += "  (" + s.Waiting + ")"
	}
	return line
}

func totals(s Snapshot, prev Snapshot, dt time.Duration) string {
	rate := ""
	if dt > 0 {
		r := float64(s.BytesWritten+s.BytesRead-prev.BytesWritten-prev.BytesRead) / dt.Seconds()
		rate = fmt.Sprintf(", %s/s", HumanBytes(int64(r)))
	}
	return fmt.Sprintf("%s %5.1fs  %s committed, %s written, %s read%s", s.Workflow, s.Elapsed.Seconds(), plural(s.Committed, "file"), HumanBytes(s.BytesWritten), HumanBytes(s.BytesRead), rate)
}

// plural is n and the noun, in the plural unless n is 1: "1 file", "3 files".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

type liveProgress struct {
	mu    sync.Mutex
	w     io.Writer
	lines int
	prev  Snapshot
	drawn bool
}

// Write prints log lines above the live view, which it draws again below them, so that
// the two never interleave on the terminal (LogWriter).
func (p *liveProgress) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out strings.Builder
	if p.lines > 0 {
		fmt.Fprintf(&out, "\x1b[%dA\x1b[J", p.lines)
		p.lines = 0
	}
	out.Write(b)
	if _, err := io.WriteString(p.w, out.String()); err != nil {
		return 0, err
	}
	if p.drawn {
		p.drawLocked(p.prev)
	}
	return len(b), nil
}

func (p *liveProgress) draw(s Snapshot) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drawLocked(s)
}

func (p *liveProgress) drawLocked(s Snapshot) {
	p.drawn = true
	var b strings.Builder
	if p.lines > 0 {
		fmt.Fprintf(&b, "\x1b[%dA", p.lines)
	}
	lines := []string{totals(s, p.prev, s.Elapsed-p.prev.Elapsed)}
	for _, st := range s.Steps {
		lines = append(lines, "  "+stepLine(st))
	}
	for _, l := range lines {
		b.WriteString("\x1b[2K" + l + "\n")
	}
	p.lines = len(lines)
	p.prev = s
	io.WriteString(p.w, b.String())
}

func (p *liveProgress) Update(s Snapshot) { p.draw(s) }
func (p *liveProgress) Done(s Snapshot)   { p.draw(s) }

type lineProgress struct {
	w        io.Writer
	interval time.Duration
	last     time.Time
	prev     Snapshot
}

func (p *lineProgress) Update(s Snapshot) {
	if time.Since(p.last) < p.interval {
		return
	}
	p.last = time.Now()
	var parts, waits []string
	for _, st := range s.Steps {
		part := fmt.Sprintf("%s %d/%d", st.Name, st.Done, st.Replicas)
		if st.Failed > 0 {
			part += fmt.Sprintf(" (%d failed)", st.Failed)
		}
		parts = append(parts, part)
		if st.Running > 0 && st.Blocked > 0 && st.Waiting != "" {
			waits = append(waits, st.Waiting)
		}
	}
	line := fmt.Sprintf("%s [%s]", totals(s, p.prev, s.Elapsed-p.prev.Elapsed), strings.Join(parts, ", "))
	if len(waits) > 0 {
		// what the terminal view shows: which step waits, on what file and rule, how long
		line += "; waiting: " + strings.Join(waits, "; ")
	}
	fmt.Fprintln(p.w, line)
	p.prev = s
}

func (p *lineProgress) Done(s Snapshot) {
	p.last = time.Time{}
	p.Update(s)
}
