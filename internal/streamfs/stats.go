package streamfs

import (
	"slices"
	"sort"
	"time"
)

// Stats counts what a view's processes did, for progress reports. Times are zero until set.
type Stats struct {
	// BytesRead and BytesWritten count bytes read from and written to the volume.
	// BytesRead counts the reads the view serves: those the kernel serves from the store
	// file itself (passthrough, committed files) never reach it; BytesOpenedPassthrough
	// stands for them.
	BytesRead, BytesWritten int64
	// BytesOpenedPassthrough sums the sizes of the files opened read-only whose reads the
	// kernel serves from the store file itself (FUSE passthrough: a consumer's committed
	// input, an ungoverned file), each open counted at open as the file's size then. The
	// server never sees those reads, so how much of each file was read is unknown: this is
	// what a program that reads each open file once to its end reads (cat, sha256sum,
	// gzip). An open whose reads reach the server after all is taken out of it (its reads
	// are in BytesRead).
	BytesOpenedPassthrough int64
	// BytesWrittenPassthrough is the part of BytesWritten the kernel wrote to the store
	// itself (ungoverned files, FUSE passthrough), counted at each writer's release as
	// the file's growth since its open.
	BytesWrittenPassthrough int64
	// FirstInput is when the first byte of a governed file was read.
	FirstInput time.Time
	// Blocked is the number of requests waiting now; BlockedTotal the time spent waiting.
	Blocked      int64
	BlockedTotal time.Duration // summed over finished waits
	// Waits are the requests waiting now, oldest first.
	Waits []Wait
	// WaitDurations counts finished waits by duration (WaitBuckets).
	WaitDurations WaitHistogram
	// FailedWaits are the most recent waits that ended in an error (at most
	// maxFailedWaits), oldest first.
	FailedWaits []FailedWait
	// Refused are the most recent changes the rules refused (at most maxFailedWaits),
	// oldest first: what a program got EACCES or EPERM for, with what to do about it.
	Refused []Refusal
}

// Refusal is a change of a file the rules refused: a write, create or truncate of a
// committed file (EPERM), or of a governed file the step does not declare (EACCES).
type Refusal struct {
	// What names the change, the file and its rule, e.g.
	// `change of committed "log.txt" (OnClose:1, Update)`; Hint says what to do.
	What, Hint string
	// At is when it was refused.
	At time.Time
}

// FailedWait is a wait on the rules that ended in an error the reader got (a timeout,
// a file that will never be complete), not an interruption.
type FailedWait struct {
	// What names the request, the file and its rule; Err says why it failed.
	What, Err string
	// At is when it failed.
	At time.Time
}

// maxFailedWaits bounds Stats.FailedWaits.
const maxFailedWaits = 20

// Wait is one request waiting on the rules now.
type Wait struct {
	// What names the request and the file, e.g. `open of "data/f"`.
	What string
	// Path is the volume path of the file waited for.
	Path string
	// Since is when it started waiting.
	Since time.Time
}

// WaitBuckets are the upper bounds, in seconds, of WaitHistogram's buckets.
var WaitBuckets = []float64{0.001, 0.01, 0.1, 1, 10, 60, 600, 3600}

// WaitHistogram counts finished waits by duration, cumulatively as Prometheus histograms.
type WaitHistogram struct {
	// Counts[i] is the number of waits that took at most WaitBuckets[i] seconds.
	Counts []uint64
	// Count is the number of waits in all.
	Count uint64
	// Sum is their duration in seconds, in all.
	Sum float64
}

// Stats returns a snapshot of the view's counters.
func (v *View) Stats() Stats {
	s := Stats{
		BytesRead:               v.bytesRead.Load(),
		BytesWritten:            v.bytesWritten.Load(),
		BytesWrittenPassthrough: v.bytesPassedThrough.Load(),
		BytesOpenedPassthrough:  v.bytesOpenedPassthrough.Load(),
		Blocked:                 v.blocked.Load(),
		BlockedTotal:            time.Duration(v.blockedNanos.Load()),
	}
	v.bmu.Lock()
	for _, w := range v.waits {
		s.Waits = append(s.Waits, *w)
	}
	s.WaitDurations = WaitHistogram{Counts: slices.Clone(v.waitHist.Counts), Count: v.waitHist.Count, Sum: v.waitHist.Sum}
	s.FailedWaits = slices.Clone(v.failedWaits)
	s.Refused = slices.Clone(v.refused)
	v.bmu.Unlock()
	sort.Slice(s.Waits, func(i, j int) bool { return s.Waits[i].Since.Before(s.Waits[j].Since) })
	if n := v.firstInput.Load(); n != 0 {
		s.FirstInput = time.Unix(0, n)
	}
	return s
}

// observe counts one finished wait of secs seconds.
func (h *WaitHistogram) observe(secs float64) {
	if h.Counts == nil {
		h.Counts = make([]uint64, len(WaitBuckets))
	}
	for i, b := range WaitBuckets {
		if secs <= b {
			h.Counts[i]++
		}
	}
	h.Count++
	h.Sum += secs
}

func (v *View) noteRead(n int, governed bool) {
	if n <= 0 {
		return
	}
	v.bytesRead.Add(int64(n))
	if governed {
		v.noteInput()
	}
}

// noteInput records the first input: the first read of a governed file's bytes, or, for
// reads the kernel serves by passthrough (which the server never sees), the first open
// of a non-empty committed governed file.
func (v *View) noteInput() {
	if v.firstInput.Load() == 0 {
		v.firstInput.CompareAndSwap(0, time.Now().UnixNano())
	}
}

// refuse records a refused change (Stats.Refused), keeping the most recent ones.
func (v *View) refuse(what, hint string) {
	v.bmu.Lock()
	defer v.bmu.Unlock()
	v.refused = append(v.refused, Refusal{What: what, Hint: hint, At: time.Now()})
	if len(v.refused) > maxFailedWaits {
		v.refused = slices.Delete(v.refused, 0, len(v.refused)-maxFailedWaits)
	}
}
