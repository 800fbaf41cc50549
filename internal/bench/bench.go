package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/runner"
	"github.com/sluice-io/sluice/internal/validation"
)

// Mode is a way of running a pattern.
type Mode string

// The modes, each on the same data in the same run.
const (
	BatchLocal      Mode = "batch-local"            // steps one after another on a local tmpfs directory
	BatchS3         Mode = "batch-s3"               // as batch-local, outputs uploaded to S3 after a step and downloaded before the next
	BatchRclone     Mode = "batch-rclone"           // as batch-s3, the files moved with rclone copy (needs rclone on PATH)
	SluiceUpdate    Mode = "sluice-update"          // sluice run, OnClose + Update
	SluiceNoUpdate  Mode = "sluice-noupdate"        // sluice run, OnClose + NoUpdate
	SluiceUpdate2   Mode = "sluice-update-2nodes"   // sluice run --nodes 2, OnClose + Update
	SluiceNoUpdate2 Mode = "sluice-noupdate-2nodes" // sluice run --nodes 2, OnClose + NoUpdate
	SluiceNoUpdate4 Mode = "sluice-noupdate-4nodes" // sluice run --nodes 4, OnClose + NoUpdate (Pattern.FourNodes)
)

// Modes is every mode, in the order the tables and the plot show them.
var Modes = []Mode{BatchLocal, BatchS3, BatchRclone, SluiceUpdate, SluiceNoUpdate, SluiceUpdate2, SluiceNoUpdate2, SluiceNoUpdate4}

// Config configures a benchmark run.
type Config struct {
	// Profile sizes the patterns and the repetitions.
	Profile Profile
	// Dir is a tmpfs directory for the stores and batch directories.
	Dir string
	// S3 is the MinIO endpoint for batch-s3 (host:port) with its keys; empty skips batch-s3.
	S3Endpoint, S3AccessKey, S3SecretKey string
	// Log receives one line per measurement.
	Log io.Writer
	// Only names the patterns Makespans runs (Pattern.Name); empty runs them all.
	Only []string
	// Modes names the modes Makespans runs, of those a pattern has; empty runs them all.
	Modes []Mode
}

// Result is one pattern in one mode.
type Result struct {
	Pattern, Mode string          // which pattern, in which mode
	Runs          []time.Duration // the makespan of every repetition
	// CPU is the CPU time of every repetition: this process's (the views, the transport,
	// the NATS server and MinIO client it embeds) and its steps', user and system.
	CPU []time.Duration
}

// MedianCPU is the median CPU time of the runs.
func (r Result) MedianCPU() time.Duration { return stat(r.CPU, 0.5) }

// Median is the median run; Median, Min and Max summarise the runs.
func (r Result) Median() time.Duration { return stat(r.Runs, 0.5) }

// Min is the fastest run.
func (r Result) Min() time.Duration { return stat(r.Runs, 0) }

// Max is the slowest run.
func (r Result) Max() time.Duration { return stat(r.Runs, 1) }

func stat(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[int(q*float64(len(s)-1)+0.5)]
}

// Makespans runs every pattern (or those of Config.Only) in every mode, Profile.Reps
// times each, interleaving the modes in each repetition so that drift of the machine hits
// them alike.
func Makespans(ctx context.Context, cfg Config) ([]Result, error) {
	var results []Result
	for _, pat := range Patterns(cfg.Profile) {
		if len(cfg.Only) > 0 && !slices.Contains(cfg.Only, pat.Name) {
			continue
		}
		modes := []Mode{BatchLocal}
		if cfg.S3Endpoint != "" {
			modes = append(modes, BatchS3)
			if _, err := exec.LookPath("rclone"); err == nil {
				modes = append(modes, BatchRclone)
			}
		}
		if !pat.StreamOnly {
			modes = append(modes, SluiceUpdate)
		}
		modes = append(modes, SluiceNoUpdate)
		if pat.CrossNode {
			modes = append(modes, SluiceUpdate2, SluiceNoUpdate2)
		}
		if pat.FourNodes {
			modes = append(modes, SluiceNoUpdate4)
		}
		if len(cfg.Modes) > 0 {
			modes = slices.DeleteFunc(modes, func(m Mode) bool { return !slices.Contains(cfg.Modes, m) })
		}
		byMode := map[Mode]*Result{}
		for _, m := range modes {
			byMode[m] = &Result{Pattern: pat.Name, Mode: string(m)}
		}
		for rep := 0; rep < cfg.Profile.Reps; rep++ {
			for _, m := range modes {
				cpu0 := cpuTime()
				d, err := runOnce(ctx, cfg, pat, m)
				if err != nil {
					return results, fmt.Errorf("%s in mode %s: %w", pat.Name, m, err)
				}
				cpu := cpuTime() - cpu0
				byMode[m].Runs = append(byMode[m].Runs, d)
				byMode[m].CPU = append(byMode[m].CPU, cpu)
				if cfg.Log != nil {
					fmt.Fprintf(cfg.Log, "bench: %-12s %-24s run %d: %.3fs, CPU %.3fs\n", pat.Name, m, rep+1, d.Seconds(), cpu.Seconds())
				}
			}
		}
		for _, m := range modes {
			results = append(results, *byMode[m])
		}
	}
	return results, nil
}

func runOnce(ctx context.Context, cfg Config, pat Pattern, m Mode) (time.Duration, error) {
	dir, err := os.MkdirTemp(cfg.Dir, "run-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	fire := v1alpha1.FireNoUpdate
	if m == SluiceUpdate || m == SluiceUpdate2 {
		fire = v1alpha1.FireUpdate
	}
	wf := pat.Build(fire)
	switch m {
	case BatchLocal:
		return runner.RunBatch(ctx, wf, filepath.Join(dir, "vol"), filepath.Join(dir, "logs"), nil)
	case BatchS3:
		return batchS3(ctx, cfg, wf, dir)
	case BatchRclone:
		return batchRclone(ctx, cfg, wf, dir)
	}
	res, err := validation.ValidateWorkflow(ctx, pat.Name, wf)
	if err != nil {
		return 0, err
	}
	nodes := 1
	switch m {
	case SluiceUpdate2, SluiceNoUpdate2:
		nodes = 2
	case SluiceNoUpdate4:
		nodes = 4
	}
	rep, err := runner.Run(ctx, res.Workflow, res.Rules, runner.Options{WorkDir: filepath.Join(dir, "work"), OutDir: filepath.Join(dir, "out"), Nodes: nodes})
	if err != nil {
		return 0, err
	}
	return rep.Makespan.Duration(), nil
}

// batchS3 runs the steps one after another as Argo-style artifacts do: before a step, every
// object of the workflow is downloaded into a fresh directory; after it, every file the step
// wrote is uploaded.
func batchS3(ctx context.Context, cfg Config, wf *v1alpha1.Workflow, dir string) (time.Duration, error) {
	client, bucket, done, err := tempBucket(ctx, cfg, dir)
	if err != nil {
		return 0, err
	}
	defer done()
	stageIn := func(vol string) error {
		for obj := range client.ListObjects(ctx, bucket, minio.ListObjectsOptions{Recursive: true}) {
			if obj.Err != nil {
				return obj.Err
			}
			if err := client.FGetObject(ctx, bucket, obj.Key, filepath.Join(vol, obj.Key), minio.GetObjectOptions{}); err != nil {
				return err
			}
		}
		return nil
	}
	stageOut := func(vol string, before map[string]bool) error {
		return filepath.WalkDir(vol, func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || before[p] {
				return err
			}
			key, _ := filepath.Rel(vol, p)
			_, err = client.FPutObject(ctx, bucket, filepath.ToSlash(key), p, minio.PutObjectOptions{PartSize: 16 << 20})
			return err
		})
	}
	return batchThrough(ctx, wf, dir, stageIn, stageOut)
}

// batchRclone is batchS3 with rclone (Debian's package, the tool csi-s3 mounts buckets
// with) moving the files: `rclone copy` of the bucket into a fresh directory before each
// step, and of the directory into the bucket after it (rclone skips the files it has).
func batchRclone(ctx context.Context, cfg Config, wf *v1alpha1.Workflow, dir string) (time.Duration, error) {
	_, bucket, done, err := tempBucket(ctx, cfg, dir)
	if err != nil {
		return 0, err
	}
	defer done()
	// The endpoint is plain HTTP; rclone 1.60's AWS SDK refuses to start with
	// AWS_CA_BUNDLE set ("unable to load custom CA bundle").
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "AWS_CA_BUNDLE=") })
	env = append(env, "RCLONE_CONFIG=/dev/null", "RCLONE_CONFIG_BENCH_TYPE=s3", "RCLONE_CONFIG_BENCH_PROVIDER=Minio",
		"RCLONE_CONFIG_BENCH_ACCESS_KEY_ID="+cfg.S3AccessKey, "RCLONE_CONFIG_BENCH_SECRET_ACCESS_KEY="+cfg.S3SecretKey,
		"RCLONE_CONFIG_BENCH_ENDPOINT=http://"+cfg.S3Endpoint)
	rclone := func(from, to string) error {
		cmd := exec.CommandContext(ctx, "rclone", "copy", "--s3-chunk-size", "16M", from, to)
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("rclone copy %s %s: %w: %s", from, to, err, out)
		}
		return nil
	}
	remote := "bench:" + bucket
	return batchThrough(ctx, wf, dir,
		func(vol string) error { return rclone(remote, vol) },
		func(vol string, _ map[string]bool) error { return rclone(vol, remote) })
}

// tempBucket creates a bucket for one run of a batch mode through object storage, and
// returns the function that empties and removes it.
func tempBucket(ctx context.Context, cfg Config, dir string) (*minio.Client, string, func(), error) {
	client, err := minio.New(cfg.S3Endpoint, &minio.Options{Creds: credentials.NewStaticV4(cfg.S3AccessKey, cfg.S3SecretKey, "")})
	if err != nil {
		return nil, "", nil, err
	}
	bucket := "bench-" + strings.ToLower(strings.TrimPrefix(filepath.Base(dir), "run-"))
	if err := client.MakeBucket(ctx, bucket, minio.MakeBucketOptions{}); err != nil {
		return nil, "", nil, err
	}
	return client, bucket, func() {
		for obj := range client.ListObjects(context.Background(), bucket, minio.ListObjectsOptions{Recursive: true}) {
			client.RemoveObject(context.Background(), bucket, obj.Key, minio.RemoveObjectOptions{})
		}
		client.RemoveBucket(context.Background(), bucket)
	}, nil
}

// batchThrough runs the steps one after another, each in a fresh directory under dir
// that stageIn fills before it runs; stageOut is given the directory and the files it
// held before the step (the ones stageIn brought).
func batchThrough(ctx context.Context, wf *v1alpha1.Workflow, dir string, stageIn func(vol string) error, stageOut func(vol string, before map[string]bool) error) (time.Duration, error) {
	start := time.Now()
	for i, s := range wf.Spec.Steps {
		vol := filepath.Join(dir, fmt.Sprintf("step-%d", i))
		if err := os.MkdirAll(vol, 0o755); err != nil {
			return 0, err
		}
		if err := stageIn(vol); err != nil {
			return 0, err
		}
		before := map[string]bool{}
		filepath.WalkDir(vol, func(p string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				before[p] = true
			}
			return nil
		})
		one := wf.DeepCopy()
		one.Spec.Steps = []v1alpha1.Step{s}
		if _, err := runner.RunBatch(ctx, one, vol, filepath.Join(dir, "logs"), nil); err != nil {
			return 0, err
		}
		if err := stageOut(vol, before); err != nil {
			return 0, err
		}
	}
	return time.Since(start), nil
}

func runBatchStep(ctx context.Context, wf *v1alpha1.Workflow, dir string) (time.Duration, error) {
	return runner.RunBatch(ctx, wf, filepath.Join(dir, "vol"), filepath.Join(dir, "logs"), nil)
}

// cpuTime is the user and system CPU time of this process and of its children that
// ended (the steps it ran and waited for).
func cpuTime() time.Duration {
	var total time.Duration
	for _, who := range []int{syscall.RUSAGE_SELF, syscall.RUSAGE_CHILDREN} {
		var ru syscall.Rusage
		if err := syscall.Getrusage(who, &ru); err != nil {
			continue
		}
		total += time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	return total
}
