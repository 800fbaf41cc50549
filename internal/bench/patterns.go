// Package bench is `sluice-bench`: CAPIO's workflow patterns run side by side in the modes
// users compare (batch on a local directory, batch through object storage as Kubernetes
// workflow engines do it, Sluice with each firing rule, on one node and on two), plus
// micro-benchmarks of the volume against tmpfs. Every figure is the median of repeated
// runs with its min and max, and every comparison a ratio against a baseline measured in
// the same run.
package bench

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluice-io/sluice/api/v1alpha1"
)

// Pattern is a benchmark workflow, built for a firing rule.
type Pattern struct {
	// Name identifies the pattern in results ("1to1", "1to1-gzip", ...).
	Name string
	// Describe says what it does, with its sizes.
	Describe string
	// Build returns the workflow with every output's firing rule set to fire.
	Build func(fire v1alpha1.FireRule) *v1alpha1.Workflow
	// CrossNode is true when the pattern has an edge between steps that --nodes 2 puts on
	// two nodes.
	CrossNode bool
	// FourNodes is true when the pattern also runs with --nodes 4 (NoUpdate), its instances
	// spread over four node stores.
	FourNodes bool
	// StreamOnly is true when the pattern runs only as it streams (NoUpdate): its data
	// does not fit the node store at once, so the Update modes, which keep every file
	// whole until its commit, are not run.
	StreamOnly bool
	// MiB is how many MiB the consumers read from the producers, when the pattern's
	// report gives CPU time per MiB (0: none).
	MiB int
}

// Profile sizes the patterns.
type Profile struct {
	Name          string // quick or full
	Files         int    // files of the 1-to-1 patterns
	FileMiB       int    // MiB per file
	SmallFiles    int    // files of the many-small-files pattern
	SmallPy       int    // files of the small-file probe (small-py, smallfiles.go)
	ScaleFiles    []int  // file counts of the probe's per-file rows (SmallFileScale)
	GenomeFiles   int    // files each instance of the 1000-Genomes-shaped pattern writes
	GenomeInsts   int    // instances of its first step
	Producers     int    // producers of the many-to-1 pattern
	Reps          int    // repetitions of every measurement
	WriteKiB      int    // I/O buffer (ws) of the 1-to-1 producer's writes, in KiB
	MicroOps      int    // operations per latency micro-benchmark
	ThroughputMiB int    // MiB of the throughput micro-benchmarks
	StreamFiles   int    // files of the 1to1-stream pattern
	StreamFileMiB int    // MiB per file of the 1to1-stream pattern
}

// Quick finishes in a few minutes on a 2-core machine; Full is the documented profile.
var (
	Quick = Profile{Name: "quick", Files: 8, FileMiB: 16, SmallFiles: 2000, SmallPy: 10000, ScaleFiles: []int{1000, 10000, 100000}, GenomeFiles: 500, GenomeInsts: 2, Producers: 4, Reps: 3, WriteKiB: 1024, MicroOps: 20000, ThroughputMiB: 256, StreamFiles: 8, StreamFileMiB: 64}
	Full  = Profile{Name: "full", Files: 16, FileMiB: 64, SmallFiles: 10000, SmallPy: 10000, ScaleFiles: []int{1000, 10000, 100000}, GenomeFiles: 2504, GenomeInsts: 4, Producers: 8, Reps: 5, WriteKiB: 1024, MicroOps: 100000, ThroughputMiB: 512, StreamFiles: 16, StreamFileMiB: 64}
)

func int32p(v int32) *int32 { return &v }

func step(name string, replicas int32, script string, env map[string]string, outputs []v1alpha1.Output, inputs []string) v1alpha1.Step {
	var ev []corev1.EnvVar
	for k, v := range env {
		ev = append(ev, corev1.EnvVar{Name: k, Value: v})
	}
	return v1alpha1.Step{
		Name: name, Replicas: int32p(replicas), Inputs: inputs, Outputs: outputs,
		Template: &corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: name, Image: "sluice:bench", Env: ev, Command: []string{"sh", "-c", script},
		}}}},
	}
}

func workflow(name string, steps ...v1alpha1.Step) *v1alpha1.Workflow {
	return &v1alpha1.Workflow{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "Workflow"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1alpha1.WorkflowSpec{Steps: steps},
	}
}

func onClose(path string, fire v1alpha1.FireRule) v1alpha1.Output {
	return v1alpha1.Output{Path: path, Commit: v1alpha1.CommitSpec{Rule: v1alpha1.CommitOnClose}, Fire: fire}
}

// genomes is the 1000-Genomes-shaped workflow of profile p with every output's firing rule
// fire.
func genomes(p Profile, fire v1alpha1.FireRule) *v1alpha1.Workflow {
	genv := map[string]string{"N": fmt.Sprint(p.GenomeFiles), "INSTS": fmt.Sprint(p.GenomeInsts)}
	ind := `set -eu; d="$SLUICE_DIR/ind$SLUICE_INSTANCE"; mkdir -p "$d"; i=0; while [ $i -lt $N ]; do printf 'sample%05d %s\n' $i "$(head -c 48 /dev/urandom | base64 -w0)" > "$d/s$i"; i=$((i+1)); done`
	merge := `set -eu; k=0; while [ $k -lt $INSTS ]; do i=0; while [ $i -lt $N ]; do cat "$SLUICE_DIR/ind$k/s$i"; i=$((i+1)); done; k=$((k+1)); done > "$SLUICE_DIR/merged"`
	freq := `set -eu; cut -c1-6 "$SLUICE_DIR/merged" | sort | uniq -c > "$SLUICE_DIR/freq"`
	muts := `set -eu; tr -cd 'A' < "$SLUICE_DIR/merged" | wc -c > "$SLUICE_DIR/muts"`
	var outs []v1alpha1.Output
	for k := 0; k < p.GenomeInsts; k++ {
		outs = append(outs, v1alpha1.Output{Path: fmt.Sprintf("ind%d", k), Type: v1alpha1.FileTypeDirectory, Commit: v1alpha1.CommitSpec{Rule: v1alpha1.CommitOnNFiles, Count: int32p(int32(p.GenomeFiles))}, Fire: fire})
	}
	outs = append(outs, onClose("ind*/s*", fire))
	return workflow("b-genomes",
		step("individuals", int32(p.GenomeInsts), ind, genv, outs, nil),
		step("merge", 1, merge, genv, []v1alpha1.Output{onClose("merged", fire)}, []string{"ind*/s*"}),
		step("frequency", 1, freq, genv, []v1alpha1.Output{onClose("freq", v1alpha1.FireUpdate)}, []string{"merged"}),
		step("mutations", 1, muts, genv, []v1alpha1.Output{onClose("muts", v1alpha1.FireUpdate)}, []string{"merged"}))
}

// Patterns returns the patterns of a profile.
func Patterns(p Profile) []Pattern {
	files, mib := fmt.Sprint(p.Files), fmt.Sprint(p.FileMiB)
	env := map[string]string{"FILES": files, "MIB": mib, "SMALL": fmt.Sprint(p.SmallFiles), "PRODUCERS": fmt.Sprint(p.Producers),
		"WS": fmt.Sprint(p.WriteKiB), "COUNT": fmt.Sprint(p.FileMiB * 1024 / p.WriteKiB)}
	produce := `set -eu; mkdir -p "$SLUICE_DIR/data"; k=0; while [ $k -lt $FILES ]; do dd if=/dev/zero of="$SLUICE_DIR/data/f$k" bs=${WS}K count=$COUNT status=none; k=$((k+1)); done`
	consume := `set -eu; k=0; while [ $k -lt $FILES ]; do sha256sum "$SLUICE_DIR/data/f$k" >> "$SLUICE_DIR/sums"; k=$((k+1)); done`
	gzProduce := `set -eu; mkdir -p "$SLUICE_DIR/data"; k=0; while [ $k -lt $FILES ]; do head -c ${MIB}M /dev/urandom | base64 | gzip -1 > "$SLUICE_DIR/data/f$k"; k=$((k+1)); done`
	gzConsume := `set -eu; k=0; while [ $k -lt $FILES ]; do gunzip -c "$SLUICE_DIR/data/f$k" | sha256sum >> "$SLUICE_DIR/sums"; k=$((k+1)); done`
	return []Pattern{
		{
			Name: "1to1", CrossNode: true,
			Describe: fmt.Sprintf("1-to-1: %d files x %d MiB written with dd (%d KiB buffer), each checksummed as it commits", p.Files, p.FileMiB, p.WriteKiB),
			Build: func(fire v1alpha1.FireRule) *v1alpha1.Workflow {
				return workflow("b-1to1",
					step("produce", 1, produce, env, []v1alpha1.Output{onClose("data/*", fire)}, nil),
					step("consume", 1, consume, env, []v1alpha1.Output{{Path: "sums", Commit: v1alpha1.CommitSpec{Rule: v1alpha1.CommitOnClose, Count: int32p(int32(p.Files))}}}, []string{"data/*"}))
			},
		},
		{
			Name: "1to1-stream", CrossNode: true, MiB: p.StreamFiles * p.StreamFileMiB,
			Describe: fmt.Sprintf("1-to-1 stream with the least compute: %d files x %d MiB written with dd (1 MiB buffer), each read with cksum as it is written: the bytes' path, not the steps, sets the makespan", p.StreamFiles, p.StreamFileMiB),
			Build: func(fire v1alpha1.FireRule) *v1alpha1.Workflow {
				senv := map[string]string{"FILES": fmt.Sprint(p.StreamFiles), "COUNT": fmt.Sprint(p.StreamFileMiB), "WS": "1024"}
				cons := `set -eu; k=0; while [ $k -lt $FILES ]; do cksum "$SLUICE_DIR/data/f$k" >> "$SLUICE_DIR/sums"; k=$((k+1)); done`
				return workflow("b-1to1-stream",
					step("produce", 1, produce, senv, []v1alpha1.Output{onClose("data/*", fire)}, nil),
					step("consume", 1, cons, senv, []v1alpha1.Output{{Path: "sums", Commit: v1alpha1.CommitSpec{Rule: v1alpha1.CommitOnClose, Count: int32p(int32(p.StreamFiles))}}}, []string{"data/*"}))
			},
		},
		{
			Name: "1to1-gzip", CrossNode: true,
			Describe: fmt.Sprintf("1-to-1 with compute: %d files of %d MiB random text gzipped, each gunzipped and checksummed", p.Files, p.FileMiB),
			Build: func(fire v1alpha1.FireRule) *v1alpha1.Workflow {
				return workflow("b-1to1-gzip",
					step("produce", 1, gzProduce, env, []v1alpha1.Output{onClose("data/*", fire)}, nil),
					step("consume", 1, gzConsume, env, []v1alpha1.Output{{Path: "sums", Commit: v1alpha1.CommitSpec{Rule: v1alpha1.CommitOnClose, Count: int32p(int32(p.Files))}}}, []string{"data/*"}))
			},
		},
		{
			Name: "1toN", CrossNode: true, FourNodes: true,
			Describe: fmt.Sprintf("1-to-many: %d files x %d MiB, 4 consumers each reading a disjoint quarter", p.Files, p.FileMiB),
			Build: func(fire v1alpha1.FireRule) *v1alpha1.Workflow {
				split := `set -eu; k=$SLUICE_INSTANCE; while [ $k -lt $FILES ]; do sha256sum "$SLUICE_DIR/data/f$k" > "$SLUICE_DIR/sums/s$k"; k=$((k+SLUICE_REPLICAS)); done`
				return workflow("b-1ton",
					step("produce", 1, produce, env, []v1alpha1.Output{onClose("data/*", fire)}, nil),
					step("consume", 4, `mkdir -p "$SLUICE_DIR/sums"; `+split, env, []v1alpha1.Output{onClose("sums/*", v1alpha1.FireUpdate)}, []string{"data/*"}))
			},
		},
		{
			Name: "1toN-sparse", CrossNode: true,
			Describe: fmt.Sprintf("1-to-many on one large file: %d MiB written in 1 MiB blocks, 4 consumers each checksum a disjoint quarter with dd skip", p.Files*p.FileMiB),
			Build: func(fire v1alpha1.FireRule) *v1alpha1.Workflow {
				total := p.Files * p.FileMiB
				prod := fmt.Sprintf(`set -eu; dd if=/dev/zero of="$SLUICE_DIR/big" bs=1M count=%d status=none`, total)
				cons := fmt.Sprintf(`set -eu; q=$((%d / SLUICE_REPLICAS)); dd if="$SLUICE_DIR/big" bs=1M skip=$((q * SLUICE_INSTANCE)) count=$q status=none | sha256sum > "$SLUICE_DIR/q$SLUICE_INSTANCE"`, total)
				return workflow("b-1ton-sparse",
					step("produce", 1, prod, env, []v1alpha1.Output{onClose("big", fire)}, nil),
					step("consume", 4, cons, env, []v1alpha1.Output{onClose("q*", v1alpha1.FireUpdate)}, []string{"big"}))
			},
		},
		{
			Name:     "mapreduce",
			Describe: "MapReduce: examples/wordcount (split the Go sources into 16 chunks, 4 counters, a reducer)",
			Build: func(fire v1alpha1.FireRule) *v1alpha1.Workflow {
				wf := wordcount.DeepCopy()
				for i := range wf.Spec.Steps {
					for j := range wf.Spec.Steps[i].Outputs {
						if wf.Spec.Steps[i].Outputs[j].Type != v1alpha1.FileTypeDirectory {
							wf.Spec.Steps[i].Outputs[j].Fire = fire
						}
					}
				}
				return wf
			},
		},
		{
			Name:     "genomes",
			Describe: fmt.Sprintf("1000-Genomes-shaped: %d instances each write a directory of %d small files, a merge concatenates them, two analyses read the merge", p.GenomeInsts, p.GenomeFiles),
			Build:    func(fire v1alpha1.FireRule) *v1alpha1.Workflow { return genomes(p, fire) },
		},
		{
			Name:     "genomes-4x-store",
			Describe: "the genomes pattern through a node store whose memory tier holds a quarter of its data (sizeLimit): the merge, half the data in one file, is in tiers.fs, and the individuals' committed files spill to the disk tier",
			Build: func(fire v1alpha1.FireRule) *v1alpha1.Workflow {
				wf := genomes(p, fire)
				wf.Name = "b-genomes-4x"
				// Each individual file is 77 bytes; the merge holds them all again.
				limit := resource.MustParse(fmt.Sprintf("%d", 2*77*p.GenomeInsts*p.GenomeFiles/4))
				wf.Spec.Volume.SizeLimit = &limit
				wf.Spec.Volume.Disk = &v1alpha1.DiskSpec{}
				wf.Spec.Tiers = &v1alpha1.TierSpec{FS: []string{"merged"}}
				return wf
			},
		},
		{
			Name:     "onterm-4x-store",
			Describe: fmt.Sprintf("larger than the node store's memory, nothing committed while it is written: %d files x %d MiB written with dd under OnTermination (all commit when the producer exits), one consumer checksums them, through a %d MiB memory tier (sizeLimit) with volume.disk set and no tiers.fs: the files being written go to the disk tier (docs/semantics.md, \"Tiers: memory and disk\")", p.Files, p.FileMiB, p.Files*p.FileMiB/4),
			Build: func(fire v1alpha1.FireRule) *v1alpha1.Workflow {
				data := v1alpha1.Output{Path: "data/*", Commit: v1alpha1.CommitSpec{Rule: v1alpha1.CommitOnTermination}, Fire: fire}
				wf := workflow("b-onterm-4x",
					step("produce", 1, produce, env, []v1alpha1.Output{data}, nil),
					step("consume", 1, consume, env, []v1alpha1.Output{{Path: "sums", Commit: v1alpha1.CommitSpec{Rule: v1alpha1.CommitOnClose, Count: int32p(int32(p.Files))}}}, []string{"data/*"}))
				limit := resource.MustParse(fmt.Sprintf("%dMi", p.Files*p.FileMiB/4))
				wf.Spec.Volume.SizeLimit = &limit
				wf.Spec.Volume.Disk = &v1alpha1.DiskSpec{}
				return wf
			},
		},
		{
			Name: "Nto1", CrossNode: true,
			Describe: fmt.Sprintf("many-to-1: %d producers each write %d MiB, one consumer checksums every file as it commits", p.Producers, p.FileMiB),
			Build: func(fire v1alpha1.FireRule) *v1alpha1.Workflow {
				prod := `set -eu; mkdir -p "$SLUICE_DIR/parts"; dd if=/dev/zero of="$SLUICE_DIR/parts/p$SLUICE_INSTANCE" bs=1M count=$MIB status=none`
				cons := `set -eu; p=0; while [ $p -lt $PRODUCERS ]; do sha256sum "$SLUICE_DIR/parts/p$p" >> "$SLUICE_DIR/sums"; p=$((p+1)); done`
				return workflow("b-nto1",
					step("produce", int32(p.Producers), prod, env, []v1alpha1.Output{onClose("parts/*", fire)}, nil),
					step("consume", 1, cons, env, []v1alpha1.Output{{Path: "sums", Commit: v1alpha1.CommitSpec{Rule: v1alpha1.CommitOnClose, Count: int32p(int32(p.Producers))}}}, []string{"parts/*"}))
			},
		},
		{
			Name:     "Nto1-small",
			Describe: fmt.Sprintf("many-to-1 small files: %d producers write %d files of 4 KiB in all, one consumer reads them as they commit", p.Producers, p.SmallFiles),
			Build: func(fire v1alpha1.FireRule) *v1alpha1.Workflow {
				prod := `set -eu; mkdir -p "$SLUICE_DIR/small"; per=$((SMALL / SLUICE_REPLICAS)); i=0; while [ $i -lt $per ]; do head -c 4096 /dev/zero > "$SLUICE_DIR/small/p$SLUICE_INSTANCE-$i"; i=$((i+1)); done`
				cons := `set -eu; per=$((SMALL / PRODUCERS)); p=0; while [ $p -lt $PRODUCERS ]; do i=0; while [ $i -lt $per ]; do cat "$SLUICE_DIR/small/p$p-$i"; i=$((i+1)); done; p=$((p+1)); done | wc -c > "$SLUICE_DIR/total"`
				return workflow("b-nto1-small",
					step("produce", int32(p.Producers), prod, env, []v1alpha1.Output{onClose("small/*", fire)}, nil),
					step("consume", 1, cons, env, []v1alpha1.Output{onClose("total", v1alpha1.FireUpdate)}, []string{"small/*"}))
			},
		},
		{
			Name: "stream-4x-store", StreamOnly: true,
			Describe: fmt.Sprintf("larger than the node store: one file of %d MiB written with dd and checksummed as it is written, NoUpdate, lifetime Consumed, through a %d MiB node store (sizeLimit); the batch modes need the whole file on tmpfs", p.Files*p.FileMiB, p.Files*p.FileMiB/4),
			Build: func(v1alpha1.FireRule) *v1alpha1.Workflow {
				total := p.Files * p.FileMiB
				prod := fmt.Sprintf(`set -eu; dd if=/dev/zero of="$SLUICE_DIR/big" bs=1M count=%d status=none`, total)
				cons := `set -eu; sha256sum "$SLUICE_DIR/big" > "$SLUICE_DIR/sum"`
				big := onClose("big", v1alpha1.FireNoUpdate)
				big.Lifetime = v1alpha1.LifetimeConsumed
				wf := workflow("b-stream-4x",
					step("produce", 1, prod, env, []v1alpha1.Output{big}, nil),
					step("consume", 1, cons, env, []v1alpha1.Output{onClose("sum", v1alpha1.FireUpdate)}, []string{"big"}))
				limit := resource.MustParse(fmt.Sprintf("%dMi", total/4))
				wf.Spec.Volume.SizeLimit = &limit
				return wf
			},
		},
		{
			Name:     "small-py",
			Describe: fmt.Sprintf("the small-file probe: one python writes %d files of 1 KiB, another opens and reads each as it commits", p.SmallPy),
			Build:    func(fire v1alpha1.FireRule) *v1alpha1.Workflow { return smallPyWorkflow(p.SmallPy, fire) },
		},
		{
			Name:     "small-read",
			Describe: fmt.Sprintf("small files, one process each side: one awk writes %d files of 4 KiB, one awk reads each as it commits (no process start per file)", p.SmallFiles),
			Build: func(fire v1alpha1.FireRule) *v1alpha1.Workflow {
				prod := `set -eu; mkdir -p "$SLUICE_DIR/small"; awk -v n="$SMALL" -v d="$SLUICE_DIR/small" 'BEGIN { s = sprintf("%4096s", ""); for (i = 0; i < n; i++) { f = d "/f" i; printf "%s", s > f; close(f) } }'`
				cons := `set -eu; awk -v n="$SMALL" -v d="$SLUICE_DIR/small" 'BEGIN { for (i = 0; i < n; i++) { f = d "/f" i; while ((getline l < f) > 0) c += length(l); close(f) } print c }' > "$SLUICE_DIR/total"`
				return workflow("b-small-read",
					step("produce", 1, prod, env, []v1alpha1.Output{onClose("small/*", fire)}, nil),
					step("consume", 1, cons, env, []v1alpha1.Output{onClose("total", v1alpha1.FireUpdate)}, []string{"small/*"}))
			},
		},
	}
}
