package streamfs

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"sigs.k8s.io/yaml"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/filestate"
	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/store"
	"github.com/sluice-io/sluice/internal/testenv"
)

// fsprobe is the path of the helper built by TestMain.
var fsprobe string

// passthroughMode is the mode every view of the suite is mounted with: `go test
// ./internal/streamfs -args -passthrough=off` runs the contract suite with the server
// serving every read and write, as a view does where the kernel lacks FUSE passthrough
// (make integration runs the package both ways).
var passthroughMode = PassthroughAuto

func init() {
	flag.Var(&passthroughMode, "passthrough", "FUSE passthrough mode of the views the tests mount: auto, on or off")
}

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() || os.Geteuid() != 0 {
		// Every test here mounts views: each skips (testenv.Root), and fsprobe is not
		// needed.
		os.Exit(m.Run())
	}
	// Everything the tests mount lives under a temp root of this package's own, so the
	// leftover check below cannot confuse other packages' mounts with ours.
	root, err := os.MkdirTemp("", "streamfs-test-")
	if err != nil {
		panic(err)
	}
	os.Setenv("TMPDIR", root)
	dir, err := os.MkdirTemp("", "fsprobe-")
	if err != nil {
		panic(err)
	}
	fsprobe = filepath.Join(dir, "fsprobe")
	build := exec.Command("go", "build", "-o", fsprobe, "./testdata/fsprobe")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building fsprobe: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	if left := leftoverMounts(root); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "tests left FUSE mounts behind: %v\n", left)
		code = 1
	}
	if kids := leftoverChildren(); len(kids) > 0 {
		fmt.Fprintf(os.Stderr, "tests left processes behind: %v\n", kids)
		code = 1
	}
	os.RemoveAll(root)
	os.Exit(code)
}

// leftoverMounts lists FUSE mounts under root still mounted.
func leftoverMounts(root string) []string {
	data, _ := os.ReadFile("/proc/self/mounts")
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 2 && strings.HasPrefix(f[2], "fuse") && strings.HasPrefix(f[1], root) {
			out = append(out, f[1])
		}
	}
	return out
}

// leftoverChildren lists this process's child processes that are still alive.
func leftoverChildren() []string {
	self := fmt.Sprint(os.Getpid())
	entries, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range entries {
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		s := string(stat)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) > 1 && f[1] == self && f[0] != "Z" {
			out = append(out, e.Name()+" "+s[:i+1])
		}
	}
	return out
}

// harness is one workflow's node: a store, an engine and views mounted in a temp dir.
type harness struct {
	t      *testing.T
	dir    string
	store  *store.Store
	engine *semantics.Engine
	views  map[string]*View
	// requests counts each view's FUSE requests, by step (harnessOpts.countRequests).
	requests map[string]*RequestCounter
	logMu    sync.Mutex
	logs     []string
}

type harnessOpts struct {
	limit       int64
	spaceWait   time.Duration
	waitTimeout time.Duration
	owners      *store.Owners // nil: probed
	// tmpfs puts the store on a tmpfs of its own, as in production (a file there may be
	// as large as 999999999999999 bytes, which the test machine's ext4 refuses).
	tmpfs bool
	// inodes, with tmpfs, is the tmpfs's nr_inodes (0: the kernel's default).
	inodes int
	// sem, when set, is what the views get instead of the engine (which it wraps).
	sem func(*semantics.Engine) filestate.Semantics
	// countRequests gives each view a RequestCounter (harness.requests).
	countRequests bool
	// entryBudget is each view's Options.EntryBudget.
	entryBudget int
}

func newHarness(t *testing.T, spec string, o harnessOpts) *harness {
	t.Helper()
	testenv.Root(t, "mounts FUSE views")
	var s v1alpha1.WorkflowSpec
	if err := yaml.UnmarshalStrict([]byte(spec), &s); err != nil {
		t.Fatalf("bad spec: %v", err)
	}
	rs, errs, _ := semantics.Compile(context.Background(), &s)
	if len(errs) > 0 {
		t.Fatalf("Compile: %v", errs.ToAggregate())
	}
	dir := t.TempDir()
	if o.tmpfs {
		mnt := filepath.Join(dir, "store")
		if err := os.Mkdir(mnt, 0o777); err != nil {
			t.Fatal(err)
		}
		opts := "size=64m,mode=0777"
		if o.inodes > 0 {
			opts += ",nr_inodes=" + strconv.Itoa(o.inodes)
		}
		if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, opts); err != nil {
			t.Fatalf("mounting a tmpfs for the store: %v", err)
		}
		t.Cleanup(func() { _ = syscall.Unmount(mnt, syscall.MNT_DETACH) })
	}
	st, err := store.New(filepath.Join(dir, "store"), store.Options{Limit: o.limit, SpaceWait: o.spaceWait, Owners: o.owners})
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, dir: dir, store: st, engine: semantics.NewEngine(rs), views: map[string]*View{}, requests: map[string]*RequestCounter{}}
	if o.waitTimeout == 0 {
		o.waitTimeout = time.Minute
	}
	var sem filestate.Semantics = h.engine
	if o.sem != nil {
		sem = o.sem(h.engine)
	}
	for _, step := range rs.Steps() {
		mnt := filepath.Join(dir, step.Name)
		if err := os.Mkdir(mnt, 0o755); err != nil {
			t.Fatal(err)
		}
		log := funcr.New(func(prefix, args string) {
			h.logMu.Lock()
			h.logs = append(h.logs, args)
			h.logMu.Unlock()
		}, funcr.Options{})
		mo := Options{Step: step.Name, WaitTimeout: o.waitTimeout, Log: log, Passthrough: passthroughMode, EntryBudget: o.entryBudget}
		if o.countRequests {
			c := &RequestCounter{}
			h.requests[step.Name], mo.RequestLog = c, c
		}
		v, err := Mount(mnt, st, sem, mo)
		if err != nil {
			t.Fatal(err)
		}
		h.views[step.Name] = v
		t.Cleanup(func() {
			if err := v.Unmount(); err != nil {
				t.Errorf("unmount %s: %v", mnt, err)
			}
		})
	}
	return h
}

// path returns the absolute path of volume path p in step's view.
func (h *harness) path(step, p string) string { return filepath.Join(h.dir, step, p) }

// proc is a process started by a test.
type proc struct {
	cmd  *exec.Cmd
	out  bytes.Buffer
	done chan struct{}
	err  error
}

// start runs a shell script (absolute paths only: no working directory inside FUSE) with
// $V set to step's view.
func (h *harness) start(step, script string) *proc {
	h.t.Helper()
	p := &proc{done: make(chan struct{})}
	p.cmd = exec.Command("/bin/sh", "-c", script)
	p.cmd.Env = append(os.Environ(), "V="+filepath.Join(h.dir, step), "PROBE="+fsprobe)
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		h.t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	h.t.Cleanup(func() {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	})
	return p
}

// sh runs a script to completion and returns its output and exit code.
func (h *harness) sh(step, script string) (string, int) {
	h.t.Helper()
	p := h.start(step, script)
	return p.wait(h.t)
}

// wait returns the process's output and exit code; the bound only catches a hang.
func (p *proc) wait(t *testing.T) (string, int) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("process still running: %v\n%s", p.cmd.Args, p.out.String())
	}
	code := 0
	if p.err != nil {
		code = -1
		if ee := (*exec.ExitError)(nil); errors.As(p.err, &ee) {
			code = ee.ExitCode()
		}
	}
	return p.out.String(), code
}

// running reports whether the process has not exited.
func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// blocked waits until n requests of step's view wait on the rules.
func (h *harness) blocked(step string, n int64) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := h.views[step].WaitBlocked(ctx, n); err != nil {
		h.t.Fatal(err)
	}
}

// fifo makes a named pipe outside the volume, used to hold a producer at a known point.
func (h *harness) fifo(name string) string {
	h.t.Helper()
	p := filepath.Join(h.dir, name)
	if err := syscall.Mkfifo(p, 0o600); err != nil {
		h.t.Fatal(err)
	}
	return p
}

// release writes a line to a fifo, letting the process reading it go on.
func (h *harness) release(fifo string) {
	h.t.Helper()
	f, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	if err != nil {
		h.t.Fatal(err)
	}
	f.WriteString("go\n")
	f.Close()
}

// until waits for the state of volume path p to satisfy cond, woken by the engine's
// change notifications (a producer's write or create is an event the test cannot order
// otherwise).
func (h *harness) until(p string, cond func(semantics.FileStatus) bool) {
	h.t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		ch := h.engine.Changed(p)
		if cond(h.engine.Status(p)) {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			h.t.Fatalf("%s never reached the expected state: %+v", p, h.engine.Status(p))
		}
	}
}

func (h *harness) logged() string {
	h.logMu.Lock()
	defer h.logMu.Unlock()
	return strings.Join(h.logs, "\n")
}
