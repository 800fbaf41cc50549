package streamfs

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"sigs.k8s.io/yaml"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/store"
)

// fsprobe is the path of the helper built by TestMain.
var fsprobe string

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "streamfs tests mount FUSE filesystems and need root and /dev/fuse")
		os.Exit(1)
	}
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
	os.RemoveAll(dir)
	if left := leftoverMounts(); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "tests left FUSE mounts behind: %v\n", left)
		code = 1
	}
	os.Exit(code)
}

// leftoverMounts lists sluice FUSE mounts of this process's tests still mounted.
func leftoverMounts() []string {
	data, _ := os.ReadFile("/proc/self/mounts")
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 2 && f[2] == "fuse.sluice" && strings.Contains(f[1], os.TempDir()) && strings.Contains(f[1], "/Test") {
			out = append(out, f[1])
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
	logMu  sync.Mutex
	logs   []string
}

type harnessOpts struct {
	limit       int64
	spaceWait   time.Duration
	waitTimeout time.Duration
}

func newHarness(t *testing.T, spec string, o harnessOpts) *harness {
	t.Helper()
	var s v1alpha1.WorkflowSpec
	if err := yaml.UnmarshalStrict([]byte(spec), &s); err != nil {
		t.Fatalf("bad spec: %v", err)
	}
	rs, errs, _ := semantics.Compile(&s)
	if len(errs) > 0 {
		t.Fatalf("Compile: %v", errs.ToAggregate())
	}
	dir := t.TempDir()
	st, err := store.New(filepath.Join(dir, "store"), store.Options{Limit: o.limit, SpaceWait: o.spaceWait})
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, dir: dir, store: st, engine: semantics.NewEngine(rs), views: map[string]*View{}}
	if o.waitTimeout == 0 {
		o.waitTimeout = time.Minute
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
		v, err := Mount(mnt, st, h.engine, Options{Step: step.Name, WaitTimeout: o.waitTimeout, Log: log})
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
		if ee, ok := p.err.(*exec.ExitError); ok {
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

func (h *harness) logged() string {
	h.logMu.Lock()
	defer h.logMu.Unlock()
	return strings.Join(h.logs, "\n")
}
