package runner

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluice-io/sluice/internal/outputs"
	"github.com/sluice-io/sluice/internal/pathpattern"
)

// Report is what a run did: per step instance when it started, first read an input byte,
// ended, with what exit code and how many bytes it moved; the makespan; and how much the
// steps overlapped.
type Report struct {
	// Workflow is the workflow's name.
	Workflow string `json:"workflow"`
	// Start and End bound the run; Makespan is End - Start.
	Start    time.Time `json:"start"`
	End      time.Time `json:"end"`
	Makespan Seconds   `json:"makespanSeconds"`
	// Instances has one entry per step instance.
	Instances []InstanceReport `json:"instances"`
	// SerialTime is the sum over steps of the longest time one of the step's instances ran
	// without waiting on the rules (its run time less the time its reads, opens and
	// listings waited for other steps' files): about the makespan had the steps run one
	// after another, each with its inputs all there.
	SerialTime Seconds `json:"serialSeconds"`
	// Overlap is SerialTime / Makespan: 1 means no overlap, 2 means the steps ran as if
	// halved.
	Overlap float64 `json:"overlap"`
	// Committed counts committed files and directories.
	Committed int `json:"filesCommitted"`
	// Released counts the Consumed files deleted from the node stores once their
	// consumers had exited, and ReleasedBytes their bytes (summed over nodes).
	Released      int   `json:"filesReleased,omitempty"`
	ReleasedBytes int64 `json:"bytesReleased,omitempty"`
	// PeakMemoryBytes and PeakDiskBytes are the most bytes one node store held in its
	// memory tier and in its disk tier (spec.tiers.fs) during the run, the largest over
	// the nodes.
	PeakMemoryBytes int64 `json:"peakMemoryBytes"`
	PeakDiskBytes   int64 `json:"peakDiskBytes,omitempty"`
	// SpilledFiles and SpilledBytes count the files in the disk tier because the memory
	// tier was full (moved there, committed or being written, or created there while it
	// was taken) and their bytes there (summed over nodes).
	SpilledFiles int   `json:"filesSpilled,omitempty"`
	SpilledBytes int64 `json:"bytesSpilled,omitempty"`
	// Outputs are the permanent files stored.
	Outputs []outputs.Output `json:"outputs"`
	// Incomplete lists the files that can never be complete because a write to them failed
	// (semantics.Engine.Poison), by path: they never committed and were not stored.
	Incomplete []IncompleteFile `json:"incomplete,omitempty"`
	// Unmet lists the declared outputs that steps which succeeded did not deliver (never
	// created, never committed, permanent but not stored); any fails the run.
	Unmet []UnmetOutput `json:"unmet,omitempty"`
	// Tainted lists the instances that succeeded on an input withdrawn since; their
	// outputs were withdrawn, and any fails the run.
	Tainted []TaintedResult `json:"tainted,omitempty"`
	// Removed lists the permanent outputs a failed run had stored and took back, because
	// the step that made them failed or reads what a failed step makes (lineage.go).
	Removed []RemovedOutput `json:"removed,omitempty"`
	// Succeeded is true when every instance exited 0, every declared output was delivered
	// and every permanent output stored, and no result rests on withdrawn bytes.
	Succeeded bool `json:"succeeded"`
	// WorkDir is where the store, mounts and logs are, when kept.
	WorkDir string `json:"workDir,omitempty"`
	// Nodes has the transport counters of each node (runs with more than one node).
	Nodes []NodeReport `json:"nodes,omitempty"`
	// Metadata sums what the workflow's KV bucket recorded (runs with NATS).
	Metadata *MetadataReport `json:"metadata,omitempty"`
}

// MetadataReport sums the workflow's KV bucket.
type MetadataReport struct {
	Files        int   `json:"files"`        // committed files recorded by their home node
	Bytes        int64 `json:"bytes"`        // their total size
	Terminations int   `json:"terminations"` // step instances recorded as exited
}

// NodeReport is one node's store and its traffic through NATS (with several nodes).
type NodeReport struct {
	Name           string `json:"name"`           // node-0, node-1, ...
	BytesPublished int64  `json:"bytesPublished"` // data bytes its writers wrote and announced
	BytesReceived  int64  `json:"bytesReceived"`  // data bytes it fetched (or had replicated) from other nodes
	BytesServed    int64  `json:"bytesServed"`    // data bytes it served to other nodes' fetchers
	Rejected       int64  `json:"rejected"`       // messages refused
	// PeakMemoryBytes and PeakDiskBytes are the most bytes its store held in the memory
	// and disk tiers; SpilledBytes the bytes moved from memory to disk.
	PeakMemoryBytes int64 `json:"peakMemoryBytes"`
	PeakDiskBytes   int64 `json:"peakDiskBytes,omitempty"`
	SpilledBytes    int64 `json:"bytesSpilled,omitempty"`
}

// InstanceReport is one step instance's part of a Report.
type InstanceReport struct {
	Step       string    `json:"step"`                 // the step
	Instance   int       `json:"instance"`             // 0-based instance
	Start      time.Time `json:"start"`                // when its first container started
	FirstInput time.Time `json:"firstInput,omitempty"` // when it read its first byte of a governed file
	End        time.Time `json:"end"`                  // when its last process exited
	ExitCode   int       `json:"exitCode"`             // the first non-zero container exit code, or 0
	Error      string    `json:"error,omitempty"`      // why it could not run, if so
	BytesIn    int64     `json:"bytesIn"`              // bytes read from the volume that the view served (not reads by passthrough)
	BytesOut   int64     `json:"bytesOut"`             // bytes written to the volume
	Log        string    `json:"log"`                  // path of its log file
	// BytesInPassthrough stands for the reads the kernel served from the node store itself
	// (FUSE passthrough), which Sluice never sees: the size of each file opened read-only
	// so, counted at its open (streamfs.Stats.BytesOpenedPassthrough). It is what a program
	// that reads each such file once to its end reads; how much was really read is unknown.
	BytesInPassthrough int64 `json:"bytesInPassthrough,omitempty"`
	// Attempts is how many times the instance ran: 1, plus one per retry after a failed
	// attempt (the step's backoffLimit).
	Attempts int `json:"attempts"`
	// Withdrawn are the files its failed attempts had written and that were taken back
	// (docs/semantics.md, "A failed attempt withdraws its outputs").
	Withdrawn []string `json:"withdrawn,omitempty"`
	// Requests are its view's FUSE requests by opcode (LOOKUP, CREATE, ...), counted only
	// with Options.CountRequests.
	Requests map[string]int `json:"fuseRequests,omitempty"`
	// Refused are the changes of files its view refused (EACCES, EPERM), the last ones
	// first made, each with what to do about it: why a program's write failed.
	Refused []string `json:"refused,omitempty"`
}

// Name returns "step[i]".
func (ir InstanceReport) Name() string { return fmt.Sprintf("%s[%d]", ir.Step, ir.Instance) }

// Seconds is a duration written as seconds in JSON.
type Seconds float64

// Duration converts back.
func (s Seconds) Duration() time.Duration { return time.Duration(float64(s) * float64(time.Second)) }

func (r *run) report(start, end time.Time) *Report {
	rep := &Report{Workflow: r.wf.Name, Start: start, End: end, Makespan: Seconds(end.Sub(start).Seconds()), Committed: r.committed()}
	r.releaseMu.Lock()
	rep.Released, rep.ReleasedBytes = len(r.released), r.releasedBytes
	r.releaseMu.Unlock()
	for _, n := range r.nodes {
		mem, disk := n.Store.Peaks()
		rep.PeakMemoryBytes, rep.PeakDiskBytes = max(rep.PeakMemoryBytes, mem), max(rep.PeakDiskBytes, disk)
		files, bytes := n.Store.Spilled()
		rep.SpilledFiles += files
		rep.SpilledBytes += bytes
	}
	// A step run alone, its inputs all there, would take about as long as its slowest
	// instance took without waiting on the rules (instances of a step run side by side).
	working := map[string]time.Duration{}
	var order []string
	for _, in := range r.instances {
		in.mu.Lock()
		if !in.start.IsZero() && in.end.After(in.start) {
			w := in.end.Sub(in.start) - min(in.final.BlockedTotal, in.end.Sub(in.start))
			working[in.step] = max(working[in.step], w)
		}
		ir := InstanceReport{
			Step: in.step, Instance: in.index, Start: in.start, FirstInput: in.final.FirstInput, End: in.end,
			ExitCode: in.exitCode, Error: in.err, BytesIn: in.final.BytesRead, BytesInPassthrough: in.final.BytesOpenedPassthrough,
			BytesOut: in.final.BytesWritten, Log: in.logPath,
			Attempts: in.attempts, Withdrawn: slices.Clone(in.withdrawn),
		}
		if in.requests != nil {
			ir.Requests = in.requests.Counts()
		}
		for _, rf := range in.final.Refused {
			ir.Refused = append(ir.Refused, rf.What+": "+rf.Hint)
		}
		in.mu.Unlock()
		rep.Instances = append(rep.Instances, ir)
		if !slices.Contains(order, in.step) {
			order = append(order, in.step)
		}
	}
	var serial time.Duration
	for _, s := range order {
		serial += working[s]
	}
	rep.SerialTime = Seconds(serial.Seconds())
	if rep.Makespan > 0 {
		rep.Overlap = float64(rep.SerialTime) / float64(rep.Makespan)
	}
	for _, n := range r.nodes {
		rep.Outputs = append(rep.Outputs, n.Copier.Results()...)
		nr := NodeReport{Name: n.name}
		nr.PeakMemoryBytes, nr.PeakDiskBytes = n.Store.Peaks()
		_, nr.SpilledBytes = n.Store.Spilled()
		if n.Peer != nil {
			c := n.Peer.Counters()
			nr.BytesPublished, nr.BytesReceived, nr.BytesServed, nr.Rejected = c.BytesPublished, c.BytesReceived, c.BytesServed, c.Rejected
		}
		rep.Nodes = append(rep.Nodes, nr)
	}
	sort.Slice(rep.Outputs, func(i, j int) bool { return rep.Outputs[i].Path < rep.Outputs[j].Path })
	return rep
}

// WriteJSON writes the report as indented JSON to path.
func (rep *Report) WriteJSON(path string) error {
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding report: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("writing report: %w", err)
	}
	return nil
}

// WriteTable prints the per-instance table, the makespan and the overlap.
func (rep *Report) WriteTable(w io.Writer) {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "INSTANCE\tSTART\tFIRST INPUT\tEND\tEXIT\tIN\tOUT")
	at := func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return fmt.Sprintf("%.2fs", t.Sub(rep.Start).Seconds())
	}
	insts := append([]InstanceReport(nil), rep.Instances...)
	// By start as shown (to 10 ms); instances that start together keep the workflow's
	// order (rep.Instances): split before count, not as nanoseconds fell.
	shown := func(t time.Time) time.Duration { return t.Sub(rep.Start).Round(10 * time.Millisecond) }
	sort.SliceStable(insts, func(i, j int) bool { return shown(insts[i].Start) < shown(insts[j].Start) })
	marked := false
	for _, ir := range insts {
		exit := fmt.Sprint(ir.ExitCode)
		if ir.Error != "" && ir.ExitCode == 0 {
			exit = "error"
		}
		in := HumanBytes(ir.BytesIn + ir.BytesInPassthrough)
		if ir.BytesInPassthrough > 0 {
			in += passthroughMark
			marked = true
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", ir.Name(), at(ir.Start), at(ir.FirstInput), at(ir.End), exit, in, HumanBytes(ir.BytesOut))
	}
	tw.Flush()
	if marked {
		fmt.Fprintln(w, passthroughMark+" includes files read by FUSE passthrough, which Sluice does not see: each counted at its size when opened")
	}
	switch {
	case !rep.Succeeded:
		// The steps' times of a failed run say nothing of a serial run of the workflow.
		fmt.Fprintf(w, "makespan %.2fs (the run failed); %s committed\n", float64(rep.Makespan), plural(rep.Committed, "file"))
	case float64(rep.Makespan) < minOverlapSeconds:
		fmt.Fprintf(w, "makespan %.2fs (too short to compare with the steps one after another); %s committed\n",
			float64(rep.Makespan), plural(rep.Committed, "file"))
	default:
		fmt.Fprintf(w, "makespan %.2fs; steps one after another would take %.2fs (overlap %.2fx); %s committed\n",
			float64(rep.Makespan), float64(rep.SerialTime), rep.Overlap, plural(rep.Committed, "file"))
	}
	for _, n := range rep.Nodes {
		if len(rep.Nodes) > 1 {
			fmt.Fprintf(w, "%s: wrote %s, received %s from other nodes, served %s to them\n", n.Name,
				HumanBytes(n.BytesPublished), HumanBytes(n.BytesReceived), HumanBytes(n.BytesServed))
		}
	}
	if rep.PeakDiskBytes > 0 {
		fmt.Fprintf(w, "node store peak: %s in memory, %s on disk; %s (%s) spilled from memory to disk\n",
			HumanBytes(rep.PeakMemoryBytes), HumanBytes(rep.PeakDiskBytes), plural(rep.SpilledFiles, "file"), HumanBytes(rep.SpilledBytes))
	} else {
		fmt.Fprintf(w, "node store peak: %s in memory\n", HumanBytes(rep.PeakMemoryBytes))
	}
	if rep.Released > 0 {
		fmt.Fprintf(w, "%s released from the node stores (%s)\n", plural(rep.Released, "consumed file"), HumanBytes(rep.ReleasedBytes))
	}
	for _, ir := range insts {
		if ir.Attempts > 1 {
			names := make([]string, len(ir.Withdrawn))
			for i, p := range ir.Withdrawn {
				names[i] = pathpattern.Printable(p)
			}
			if len(names) == 0 {
				fmt.Fprintf(w, "%s ran %d times; its failed attempts wrote no declared output to withdraw\n", ir.Name(), ir.Attempts)
				continue
			}
			fmt.Fprintf(w, "%s ran %d times; its failed attempts' files were withdrawn: %s\n", ir.Name(), ir.Attempts, strings.Join(names, ", "))
		}
	}
}

// minOverlapSeconds is the shortest makespan whose overlap WriteTable gives: below it,
// starting processes and mounting views, not the steps' work, make up the times.
const minOverlapSeconds = 1.0

// passthroughMark follows an IN figure that counts reads by passthrough at the size of
// the files opened (InstanceReport.BytesInPassthrough), and starts the table's note
// saying so.
const passthroughMark = "*"

// HumanBytes renders a byte count with a binary unit.
func HumanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// tail returns the last n lines of the file at path.
func tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return "  (no log: " + err.Error() + ")"
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	if len(lines) == 0 {
		return "  (empty)"
	}
	return "  " + strings.Join(lines, "\n  ")
}

// IncompleteFile is a file that can never be complete, and why.
type IncompleteFile struct {
	// Path is the file's volume path.
	Path string `json:"path"`
	// Reason says which write failed and why.
	Reason string `json:"reason"`
}
