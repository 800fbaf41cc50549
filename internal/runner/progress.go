package runner

import (
	"fmt"
	"io"
	"strings"
	"time"
)

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
	w     io.Writer
	lines int
	prev  Snapshot
}

func (p *liveProgress) draw(s Snapshot) {
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
	var parts []string
	for _, st := range s.Steps {
		parts = append(parts, fmt.Sprintf("%s %d/%d", st.Name, st.Done, st.Replicas))
	}
	fmt.Fprintf(p.w, "%s [%s]\n", totals(s, p.prev, s.Elapsed-p.prev.Elapsed), strings.Join(parts, ", "))
	p.prev = s
}

func (p *lineProgress) Done(s Snapshot) {
	p.last = time.Time{}
	p.Update(s)
}
