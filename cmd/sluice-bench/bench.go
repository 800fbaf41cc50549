package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-io/sluice/internal/bench"
	"github.com/sluice-io/sluice/internal/exitcode"
	"github.com/sluice-io/sluice/internal/servers"
)

// newBenchCommand is the sluice-bench command: its flags, and what it runs.
func newBenchCommand() *cobra.Command {
	var out, dir string
	var full, noS3, microOnly bool
	var only, modes []string
	var cpuProfile string
	var writeKiB int
	cmd := &cobra.Command{
		Use:   "sluice-bench",
		Short: "Run CAPIO's patterns in every mode and the micro-benchmarks; write CSV and a markdown table",
		Long: `Runs CAPIO's patterns (1-to-1, 1-to-1 with gzip, 1-to-many, one sparse file read
in ranges, MapReduce, a 1000-Genomes-shaped workflow, many-to-1, many-to-1 small files,
small files read by one process)
in the modes batch-local, batch-s3 (needs the MinIO of 'make servers'), batch-rclone
(the same, files moved with rclone copy; needs rclone on PATH), sluice-update,
sluice-noupdate, and both on 2 nodes where the pattern has a cross-node edge, repeated and
interleaved; then the micro-benchmarks of a Sluice view against tmpfs, commit-to-open
latency and NATS throughput against raw TCP. Writes results.csv, micro.csv, results.md
and results.png into --out, every comparison a ratio against a baseline of the same run.
Needs root and /dev/fuse.

A command of its own, beside the sluice binary: the plots and the MinIO launcher it
needs have no place in the image that runs in a cluster.`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			prof := bench.Quick
			if full {
				prof = bench.Full
			}
			if writeKiB > 0 {
				prof.WriteKiB = writeKiB
			}
			if cpuProfile != "" {
				// The views are served by this process: the profile shows where the
				// filesystem and the transport spend their time.
				f, err := os.Create(cpuProfile)
				if err != nil {
					return err
				}
				if err := pprof.StartCPUProfile(f); err != nil {
					return err
				}
				defer func() { pprof.StopCPUProfile(); f.Close() }()
			}
			if dir == "" {
				dir = os.TempDir()
				if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
					dir = "/dev/shm"
				}
			}
			work, err := os.MkdirTemp(dir, "sluice-bench-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(work)
			for _, name := range only {
				if !slices.ContainsFunc(bench.Patterns(prof), func(p bench.Pattern) bool { return p.Name == name }) {
					return &exitcode.Error{Code: 2, Err: fmt.Errorf("--pattern %q: no such pattern", name)}
				}
			}
			cfg := bench.Config{Profile: prof, Dir: work, Log: cmd.ErrOrStderr(), Only: only}
			for _, m := range modes {
				if !slices.Contains(bench.Modes, bench.Mode(m)) {
					return &exitcode.Error{Code: 2, Err: fmt.Errorf("--mode %q: no such mode", m)}
				}
				cfg.Modes = append(cfg.Modes, bench.Mode(m))
			}
			if !noS3 && !microOnly {
				m, err := servers.StartMinIO(filepath.Join(work, "minio"))
				if err != nil {
					return &exitcode.Error{Code: 1, Err: fmt.Errorf("batch-s3 needs MinIO (%w); run 'make servers' or pass --no-s3", err)}
				}
				defer m.Stop()
				cfg.S3Endpoint, cfg.S3AccessKey, cfg.S3SecretKey = m.Endpoint, m.AccessKey, m.SecretKey
			}
			start := time.Now()
			micros, err := bench.Repeat(prof.Reps, func() ([]bench.Micro, error) {
				if len(only) > 0 {
					return nil, nil // patterns only
				}
				local, err := bench.Micros(cmd.Context(), cfg)
				if err != nil {
					return nil, fmt.Errorf("micro-benchmarks: %w", err)
				}
				cross, err := bench.CrossNode(cmd.Context(), cfg)
				if err != nil {
					return nil, fmt.Errorf("cross-node micro-benchmarks: %w", err)
				}
				return append(local, cross...), nil
			})
			if err != nil {
				return &exitcode.Error{Code: 1, Err: err}
			}
			if len(only) == 0 {
				scale, err := bench.SmallFileScale(cmd.Context(), cfg)
				if err != nil {
					return &exitcode.Error{Code: 1, Err: fmt.Errorf("small-file scale rows: %w", err)}
				}
				micros = append(micros, scale...)
			}
			var notes []string
			var results []bench.Result
			if !microOnly {
				results, err = bench.Makespans(cmd.Context(), cfg)
				if err != nil {
					return &exitcode.Error{Code: 1, Err: err}
				}
				for _, pat := range bench.Patterns(prof) {
					if pat.Name != "1to1-gzip" || len(only) > 0 && !slices.Contains(only, pat.Name) {
						continue
					}
					tp, tc, err := bench.OverlapBound(cmd.Context(), cfg, pat)
					if err != nil {
						return &exitcode.Error{Code: 1, Err: fmt.Errorf("overlap bound: %w", err)}
					}
					bound := max(tp, tc)
					for _, r := range results {
						if r.Pattern == pat.Name && r.Mode == "sluice-noupdate" {
							notes = append(notes, fmt.Sprintf("Ideal overlap bound of `1to1-gzip`: the producer alone takes %.2fs and the consumer alone %.2fs on tmpfs, so perfect overlap gives %.2fs; sluice-noupdate's median makespan %.2fs is %.2f× that bound.",
								tp.Seconds(), tc.Seconds(), bound.Seconds(), r.Median().Seconds(), r.Median().Seconds()/bound.Seconds()))
						}
					}
				}
				if err := os.MkdirAll(out, 0o755); err != nil {
					return err
				}
				if err := bench.Plot(filepath.Join(out, "results.png"), "sluice-bench ("+prof.Name+"): speed-up over batch-s3", results); err != nil {
					return err
				}
			}
			header := fmt.Sprintf("`sluice-bench%s` (profile %s, %s, took %s) on %s, %d CPUs, Linux, stores on %s.",
				map[bool]string{true: " --full", false: ""}[full], prof.Name, versionString(), time.Since(start).Round(time.Second),
				hostDescription(), runtime.NumCPU(), dir)
			if err := bench.WriteResults(out, header, prof, results, micros, notes); err != nil {
				return err
			}
			md, _ := os.ReadFile(filepath.Join(out, "results.md"))
			fmt.Fprint(cmd.OutOrStdout(), string(md))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&out, "out", "bench/results", "directory for results.csv, micro.csv and results.md")
	f.StringVar(&dir, "dir", "", "where stores and batch directories live (default /dev/shm)")
	f.BoolVar(&full, "full", false, "the full profile (larger files, 5 repetitions)")
	f.BoolVar(&noS3, "no-s3", false, "skip the batch-s3 mode (no MinIO)")
	f.BoolVar(&microOnly, "micro", false, "only the micro-benchmarks")
	f.StringSliceVar(&only, "pattern", nil, "run only these patterns (repeatable or comma-separated), without the micro-benchmarks")
	f.StringSliceVar(&modes, "mode", nil, "run only these modes of each pattern (repeatable or comma-separated: batch-local, batch-s3, sluice-noupdate-2nodes, ...)")
	f.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of this process (the views and transport it serves) to this file")
	f.IntVar(&writeKiB, "ws", 0, "I/O buffer of the 1-to-1 producer's writes in KiB (default 1024)")
	return cmd
}

// hostDescription is the CPU model of this machine (/proc/cpuinfo), else its
// architecture.
func hostDescription() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "model name") {
			if _, v, ok := strings.Cut(line, ":"); ok {
				return strings.TrimSpace(v)
			}
		}
	}
	return runtime.GOARCH
}
