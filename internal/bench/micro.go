package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/store"
	"github.com/sluice-io/sluice/internal/streamfs"
)

// Micro is one micro-benchmark: a figure through the volume against the same on tmpfs.
type Micro struct {
	Name   string  // what was measured
	Unit   string  // "us" (mean latency), "MB/s", or "ratio" (a plain figure, no baseline)
	Volume float64 // through a Sluice view (the median over repetitions, see Repeat)
	Tmpfs  float64 // on the tmpfs the store lives on (median)
	// VolumeMin and VolumeMax are the extremes of Volume over the repetitions.
	VolumeMin, VolumeMax float64
}

// Repeat runs fn reps times (at least once) and returns its micro-benchmarks with Volume
// and Tmpfs the medians of the repetitions and VolumeMin/VolumeMax their range. It stops
// at fn's first error.
func Repeat(reps int, fn func() ([]Micro, error)) ([]Micro, error) {
	var order []string
	runs := map[string][]Micro{}
	for i := 0; i < max(reps, 1); i++ {
		ms, err := fn()
		if err != nil {
			return nil, err
		}
		for _, m := range ms {
			if _, ok := runs[m.Name]; !ok {
				order = append(order, m.Name)
			}
			runs[m.Name] = append(runs[m.Name], m)
		}
	}
	out := make([]Micro, 0, len(order))
	for _, name := range order {
		ms := runs[name]
		vol, tmp := make([]float64, len(ms)), make([]float64, len(ms))
		for i, m := range ms {
			vol[i], tmp[i] = m.Volume, m.Tmpfs
		}
		sort.Float64s(vol)
		sort.Float64s(tmp)
		out = append(out, Micro{Name: name, Unit: ms[0].Unit, Volume: vol[len(vol)/2], Tmpfs: tmp[len(tmp)/2],
			VolumeMin: vol[0], VolumeMax: vol[len(vol)-1]})
	}
	return out, nil
}

// Ratio is Volume/Tmpfs for throughput, Tmpfs/Volume for latency: 1 is tmpfs speed.
func (m Micro) Ratio() float64 {
	if m.Volume == 0 || m.Tmpfs == 0 {
		return 0
	}
	if m.Unit == "MB/s" {
		return m.Volume / m.Tmpfs
	}
	return m.Tmpfs / m.Volume
}

const microSpec = `
steps:
- name: p
  outputs:
  - {path: "c/*", commit: {rule: OnClose}}
  - {path: "w/*", commit: {rule: OnClose}, fire: NoUpdate}
- name: c
  inputs: ["c/*", "w/*"]`

// Micros measures syscall latency and throughput through a consumer's and a producer's
// view against tmpfs, and commit-to-open latency on one node. The views are served by this
// process, as a sidecar serves its pod.
func Micros(ctx context.Context, cfg Config) ([]Micro, error) {
	var spec v1alpha1.WorkflowSpec
	if err := yaml.Unmarshal([]byte(microSpec), &spec); err != nil {
		return nil, err
	}
	rs, errs, _ := semantics.Compile(ctx, &spec)
	if len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	dir, err := os.MkdirTemp(cfg.Dir, "micro-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	st, err := store.New(filepath.Join(dir, "store"), store.Options{})
	if err != nil {
		return nil, err
	}
	defer st.Close() // after the views' deferred unmounts
	eng := semantics.NewEngine(rs)
	views := map[string]*streamfs.View{}
	// c-off is a second view of the consumer that serves every read itself (passthrough
	// off), to compare the two paths in one run.
	for _, m := range []struct {
		name, step string
		mode       streamfs.PassthroughMode
	}{{"p", "p", streamfs.PassthroughAuto}, {"c", "c", streamfs.PassthroughAuto}, {"c-off", "c", streamfs.PassthroughOff}} {
		mnt := filepath.Join(dir, "mnt-"+m.name)
		os.MkdirAll(mnt, 0o755)
		v, err := streamfs.Mount(mnt, st, eng, streamfs.Options{Step: m.step, Passthrough: m.mode})
		if err != nil {
			return nil, err
		}
		views[m.name] = v
		defer v.Unmount()
	}
	plain := filepath.Join(dir, "tmpfs")
	os.MkdirAll(filepath.Join(plain, "c"), 0o755)
	size := int64(cfg.Profile.ThroughputMiB) << 20
	// The throughput figures below hold up to six copies of size bytes in memory (store,
	// page caches, tmpfs). On a VM, memory the guest touches for the first time is slow
	// to come (measured here: dd into /dev/shm drops from 2 GB/s to 0.3 GB/s past
	// ≈3.5 GB), which would charge whichever measurement comes first; touch it once.
	if err := prefault(filepath.Join(dir, "prefault"), 8*size); err != nil {
		return nil, err
	}
	var out []Micro
	wTmp, err := writeSeq(filepath.Join(plain, "c", "big"), size)
	if err != nil {
		return nil, err
	}

	// An in-flight file (NoUpdate): the consumer reads while the producer writes.
	os.MkdirAll(filepath.Join(dir, "mnt-p", "w"), 0o755)
	wFly, rFly, err := inFlight(filepath.Join(dir, "mnt-p", "w", "big"), filepath.Join(dir, "mnt-c", "w", "big"), size)
	if err != nil {
		return nil, err
	}

	// A committed file, written through the producer's view.
	os.MkdirAll(filepath.Join(dir, "mnt-p", "c"), 0o755)
	wVol, err := writeSeq(filepath.Join(dir, "mnt-p", "c", "big"), size)
	if err != nil {
		return nil, err
	}
	out = append(out, Micro{Name: "sequential write, 1 MiB writes", Unit: "MB/s", Volume: wVol, Tmpfs: wTmp})
	// The same opened O_RDWR (Go's os.Create, sqlite, HDF5): such a handle keeps the page
	// cache, so that a shared writable mmap works (docs/semantics.md, "The fast path").
	wRW, err := writeSeqFlags(filepath.Join(dir, "mnt-p", "c", "rw"), size, os.O_RDWR)
	if err != nil {
		return nil, err
	}
	tRW, _ := writeSeqFlags(filepath.Join(plain, "c", "rw"), size, os.O_RDWR)
	os.Remove(filepath.Join(plain, "c", "rw"))
	out = append(out, Micro{Name: "sequential write, 1 MiB writes, opened read-write", Unit: "MB/s", Volume: wRW, Tmpfs: tRW})
	// A file no rule governs: the kernel writes it to the store itself (passthrough).
	os.MkdirAll(filepath.Join(dir, "mnt-p", "scratch"), 0o755)
	wFree, err := writeSeq(filepath.Join(dir, "mnt-p", "scratch", "big"), size)
	if err != nil {
		return nil, err
	}
	os.Remove(filepath.Join(dir, "mnt-p", "scratch", "big"))
	out = append(out, Micro{Name: "sequential write of an ungoverned file, 1 MiB writes", Unit: "MB/s", Volume: wFree, Tmpfs: wTmp})
	consBig := filepath.Join(dir, "mnt-c", "c", "big")
	readSeq(consBig) // first read fills the page cache (keep_cache), as for tmpfs
	rVol, err := readSeq(consBig)
	if err != nil {
		return nil, err
	}
	rTmp, _ := readSeq(filepath.Join(plain, "c", "big"))
	offBig := filepath.Join(dir, "mnt-c-off", "c", "big")
	readSeq(offBig)
	rOff, err := readSeq(offBig)
	if err != nil {
		return nil, err
	}
	out = append(out,
		Micro{Name: "sequential read of a committed file, 1 MiB reads", Unit: "MB/s", Volume: rVol, Tmpfs: rTmp},
		Micro{Name: "sequential read of a committed file, 1 MiB reads, passthrough off (the view serves them)", Unit: "MB/s", Volume: rOff, Tmpfs: rTmp},
		Micro{Name: "sequential write while a consumer reads it (NoUpdate), 1 MiB writes", Unit: "MB/s", Volume: wFly, Tmpfs: wTmp},
		// A reader of a file being written goes no faster than its writer: the baseline
		// is tmpfs's write rate.
		Micro{Name: "sequential read of an in-flight file (NoUpdate) as it is written, 1 MiB reads; against tmpfs writes", Unit: "MB/s", Volume: rFly, Tmpfs: wTmp})

	n := cfg.Profile.MicroOps
	for _, op := range []struct {
		name string
		fn   func(p string) error
	}{
		{"stat of a committed file", func(p string) error { var s syscall.Stat_t; return syscall.Stat(p, &s) }},
		{"open+close of a committed file", openClose},
	} {
		vol, err := latency(n, func() error { return op.fn(consBig) })
		if err != nil {
			return nil, err
		}
		tmp, _ := latency(n, func() error { return op.fn(filepath.Join(plain, "c", "big")) })
		out = append(out, Micro{Name: op.name, Unit: "us", Volume: vol, Tmpfs: tmp})
	}
	floor, err := fuseFloor(dir, n)
	if err != nil {
		return nil, err
	}
	vol, _ := latency(n, func() error { return openClose(consBig) })
	out = append(out, Micro{Name: "open+close of a committed file, against open+close on a minimal go-fuse server (one FUSE round trip: the floor of any FUSE volume here)", Unit: "us", Volume: vol, Tmpfs: floor})
	volOff, err := latency(n, func() error { return openClose(offBig) })
	if err != nil {
		return nil, err
	}
	out = append(out, Micro{Name: "open+close of a committed file, passthrough off, against the same minimal go-fuse server", Unit: "us", Volume: volOff, Tmpfs: floor})
	for _, op := range []struct {
		name string
		fn   func(fd int) error
	}{
		{"fstat", func(fd int) error { var s syscall.Stat_t; return syscall.Fstat(fd, &s) }},
		{"1-byte pread", func(fd int) error { b := make([]byte, 1); _, err := syscall.Pread(fd, b, 4096); return err }},
	} {
		vf, err := syscall.Open(consBig, syscall.O_RDONLY, 0)
		if err != nil {
			return nil, err
		}
		tf, _ := syscall.Open(filepath.Join(plain, "c", "big"), syscall.O_RDONLY, 0)
		vol, _ := latency(n, func() error { return op.fn(vf) })
		tmp, _ := latency(n, func() error { return op.fn(tf) })
		syscall.Close(vf)
		syscall.Close(tf)
		out = append(out, Micro{Name: op.name + " of a committed file", Unit: "us", Volume: vol, Tmpfs: tmp})
	}
	p50, err := commitToOpen(dir, views["c"], 200)
	if err != nil {
		return nil, err
	}
	out = append(out, Micro{Name: "commit-to-open p50 (close() in the producer to open() returning in a waiting consumer), one node", Unit: "us", Volume: p50, Tmpfs: 0})
	return out, nil
}

// writeSeq creates the file at p write-only (O_WRONLY|O_CREAT|O_TRUNC, as dd, cp and a
// shell redirection open their output), writes size bytes in 1 MiB writes and returns
// MB/s.
func writeSeq(p string, size int64) (float64, error) {
	return writeSeqFlags(p, size, os.O_WRONLY)
}

// writeSeqFlags is writeSeq with the access mode given (os.O_WRONLY or os.O_RDWR).
func writeSeqFlags(p string, size int64, access int) (float64, error) {
	f, err := os.OpenFile(p, access|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return 0, err
	}
	buf := make([]byte, 1<<20)
	start := time.Now()
	for off := int64(0); off < size; off += int64(len(buf)) {
		if _, err := f.Write(buf); err != nil {
			f.Close()
			return 0, err
		}
	}
	if err := f.Close(); err != nil {
		return 0, err
	}
	return float64(size) / 1e6 / time.Since(start).Seconds(), nil
}

// readSeq reads the file at p to its end in 1 MiB reads and returns MB/s.
func readSeq(p string) (float64, error) {
	f, err := os.Open(p)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	mbps, _ := drain(f)
	return mbps, nil
}

// drain reads f from its offset to EOF (or the first error) in 1 MiB reads and returns
// the rate in MB/s and the bytes read.
func drain(f *os.File) (float64, int64) {
	buf := make([]byte, 1<<20)
	var n int64
	start := time.Now()
	for {
		k, err := f.Read(buf)
		n += int64(k)
		if err != nil || k == 0 {
			break
		}
	}
	return float64(n) / 1e6 / time.Since(start).Seconds(), n
}

// prefault writes n bytes to a file at p and removes it, so that the memory is backed.
func prefault(p string, n int64) error {
	if _, err := writeSeq(p, n); err != nil {
		return fmt.Errorf("touching %d bytes of memory: %w", n, err)
	}
	return os.Remove(p)
}

// inFlight writes size bytes to prodPath in 1 MiB writes while a consumer reads consPath
// (the same file through its own view) until EOF, which comes at commit. It returns the
// producer's and the consumer's MB/s, the consumer's from its open returning (once the
// file exists) to EOF.
func inFlight(prodPath, consPath string, size int64) (write, read float64, err error) {
	type result struct {
		mbps float64
		n    int64
		err  error
	}
	done := make(chan result, 1)
	go func() {
		f, err := os.Open(consPath) // waits until the producer creates the file
		if err != nil {
			done <- result{err: err}
			return
		}
		defer f.Close()
		mbps, n := drain(f)
		done <- result{mbps: mbps, n: n}
	}()
	write, err = writeSeq(prodPath, size)
	if err != nil {
		return 0, 0, err
	}
	select {
	case r := <-done:
		if r.err != nil {
			return 0, 0, fmt.Errorf("reading the in-flight file: %w", r.err)
		}
		if r.n != size {
			return 0, 0, fmt.Errorf("the consumer read %d of %d bytes of the in-flight file", r.n, size)
		}
		return write, r.mbps, nil
	case <-time.After(time.Minute):
		return 0, 0, fmt.Errorf("the consumer of the in-flight file did not reach EOF a minute after commit")
	}
}

// latency returns the mean duration of fn in microseconds over n calls.
func latency(n int, fn func() error) (float64, error) {
	start := time.Now()
	for i := 0; i < n; i++ {
		if err := fn(); err != nil {
			return 0, err
		}
	}
	return float64(time.Since(start).Microseconds()) / float64(n), nil
}

// commitToOpen measures, k times, the time from a producer's close() returning to a
// consumer's waiting open() returning, and returns the median in microseconds.
func commitToOpen(dir string, consumer *streamfs.View, k int) (float64, error) {
	var samples []time.Duration
	for i := 0; i < k; i++ {
		name := fmt.Sprintf("lat%d", i)
		opened := make(chan time.Time, 1)
		errc := make(chan error, 1)
		go func() {
			fd, err := syscall.Open(filepath.Join(dir, "mnt-c", "c", name), syscall.O_RDONLY, 0)
			if err != nil {
				errc <- err
				return
			}
			opened <- time.Now()
			syscall.Close(fd)
		}()
		wctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := consumer.WaitBlocked(wctx, 1) // the open is parked in the filesystem
		cancel()
		if err != nil {
			return 0, err
		}
		f, err := os.Create(filepath.Join(dir, "mnt-p", "c", name))
		if err != nil {
			return 0, err
		}
		f.Write([]byte("x"))
		closed := time.Now()
		f.Close()
		select {
		case t := <-opened:
			samples = append(samples, t.Sub(closed))
		case err := <-errc:
			return 0, err
		case <-time.After(10 * time.Second):
			return 0, fmt.Errorf("open did not return after commit")
		}
	}
	sort.Slice(samples, func(i, j int) bool { return samples[i] < samples[j] })
	return float64(samples[len(samples)/2].Nanoseconds()) / 1000, nil
}
