package bench

import (
	"encoding/csv"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// WriteResults writes results.csv, micro.csv and results.md (the table the README shows)
// into dir. header describes the machine and the command; notes are paragraphs added
// after the makespan table.
func WriteResults(dir, header string, prof Profile, results []Result, micros []Micro, notes []string) error {
	mib := map[string]int{}
	for _, p := range Patterns(prof) {
		mib[p.Name] = p.MiB
	}
	// cpuPerMiB is a result's median CPU time in milliseconds per MiB read, "-" for a
	// pattern without MiB.
	cpuPerMiB := func(r Result) string {
		if mib[r.Pattern] == 0 || len(r.CPU) == 0 {
			return "-"
		}
		return f2(float64(r.MedianCPU().Milliseconds()) / float64(mib[r.Pattern]))
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	baseline := map[string]map[string]float64{}
	for _, r := range results {
		if baseline[r.Pattern] == nil {
			baseline[r.Pattern] = map[string]float64{}
		}
		baseline[r.Pattern][r.Mode] = r.Median().Seconds()
	}
	f, err := os.Create(filepath.Join(dir, "results.csv"))
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	w.Write([]string{"pattern", "mode", "median_s", "min_s", "max_s", "runs", "speedup_vs_batch_s3", "speedup_vs_batch_local", "cpu_median_s", "cpu_ms_per_mib", "speedup_vs_batch_rclone"})
	for _, r := range results {
		w.Write([]string{r.Pattern, r.Mode, f3(r.Median().Seconds()), f3(r.Min().Seconds()), f3(r.Max().Seconds()), fmt.Sprint(len(r.Runs)),
			ratio(baseline[r.Pattern]["batch-s3"], r.Median().Seconds()), ratio(baseline[r.Pattern]["batch-local"], r.Median().Seconds()),
			f3(r.MedianCPU().Seconds()), cpuPerMiB(r), ratio(baseline[r.Pattern]["batch-rclone"], r.Median().Seconds())})
	}
	w.Flush()
	f.Close()
	mf, err := os.Create(filepath.Join(dir, "micro.csv"))
	if err != nil {
		return err
	}
	mw := csv.NewWriter(mf)
	mw.Write([]string{"measure", "unit", "volume_median", "volume_min", "volume_max", "tmpfs_median", "ratio_to_tmpfs"})
	for _, m := range micros {
		mw.Write([]string{m.Name, m.Unit, f3(m.Volume), f3(m.VolumeMin), f3(m.VolumeMax), f3(m.Tmpfs), f3(m.Ratio())})
	}
	mw.Flush()
	mf.Close()

	var b strings.Builder
	fmt.Fprintf(&b, "%s\n\n", header)
	fmt.Fprintf(&b, "Makespan, median of %d runs (min–max), and speed-up against the batch baselines measured in the same run:\n\n", prof.Reps)
	b.WriteString("| pattern | mode | makespan (s) | × vs batch-s3 | × vs batch-rclone | × vs batch-local | CPU (s) | CPU ms/MiB |\n|---|---|---|---|---|---|---|---|\n")
	for _, r := range results {
		fmt.Fprintf(&b, "| %s | %s | %s (%s–%s) | %s | %s | %s | %s | %s |\n", r.Pattern, r.Mode, f2(r.Median().Seconds()), f2(r.Min().Seconds()), f2(r.Max().Seconds()),
			ratio(baseline[r.Pattern]["batch-s3"], r.Median().Seconds()), ratio(baseline[r.Pattern]["batch-rclone"], r.Median().Seconds()), ratio(baseline[r.Pattern]["batch-local"], r.Median().Seconds()),
			f2(r.MedianCPU().Seconds()), cpuPerMiB(r))
	}
	for _, n := range notes {
		fmt.Fprintf(&b, "\n%s\n", n)
	}
	fmt.Fprintf(&b, "\nMicro-benchmarks through a Sluice view against the tmpfs the store lives on, median of %d runs (min–max) (ratio 1 = tmpfs speed; latency ratio = tmpfs/volume):\n\n", prof.Reps)
	b.WriteString("| measure | volume | tmpfs | ratio |\n|---|---|---|---|\n")
	for _, m := range micros {
		tmp, r := f2(m.Tmpfs)+" "+m.Unit, f2(m.Ratio())
		if m.Tmpfs == 0 {
			tmp, r = "-", "-"
		}
		fmt.Fprintf(&b, "| %s | %s %s (%s–%s) | %s | %s |\n", m.Name, f2(m.Volume), m.Unit, f2(m.VolumeMin), f2(m.VolumeMax), tmp, r)
	}
	return os.WriteFile(filepath.Join(dir, "results.md"), []byte(b.String()), 0o644)
}

func f2(v float64) string { return fmt.Sprintf("%.2f", v) }
func f3(v float64) string { return fmt.Sprintf("%.3f", v) }

// ratio is base/v (how many times faster v is than base), "-" without a base.
func ratio(base, v float64) string {
	if base == 0 || v == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", base/v)
}
