package runner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/streamfs"
)

type instanceState int

const (
	statePending instanceState = iota
	stateRunning
	stateSucceeded
	stateFailed
)

// instance is one step instance: its view of the volume and its processes.
type instance struct {
	r        *run
	step     string
	index    int
	replicas int
	node     int // index of the node it runs on
	spec     v1alpha1.Step
	view     *streamfs.View
	plainDir string // the volume for a batch run without a view
	logPath  string
	requests *streamfs.RequestCounter // its view's FUSE requests (Options.CountRequests)

	mu       sync.Mutex
	st       instanceState
	start    time.Time
	end      time.Time
	exitCode int
	err      string
	final    streamfs.Stats
	// attempts counts the runs started; withdrawn lists what failed ones took back.
	attempts  int
	withdrawn []string
	// stop ends the running attempt's processes; aborted says why it was stopped (an
	// input it opened was withdrawn), "" while it was not.
	stop    context.CancelFunc
	aborted string
}

// abortAttempt stops the running attempt, which fails with reason: it opened a file that
// was withdrawn, so what it makes may rest on bytes of a failed attempt. It does nothing
// to an instance that is not running.
func (in *instance) abortAttempt(reason string) bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.st != stateRunning || in.stop == nil || in.aborted != "" {
		return false
	}
	in.aborted = reason
	in.stop()
	return true
}

func (in *instance) state() (instanceState, int) {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.st, in.exitCode
}

// volume returns the directory the instance's processes see as the volume.
func (in *instance) volume() string {
	if in.view != nil {
		return in.view.Mountpoint()
	}
	return in.plainDir
}

func (in *instance) exit() (int, string) {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.exitCode, in.err
}

// failure says how the instance's last attempt failed, for the record of its termination
// (node.terminate), e.g. "exit code 2, in attempt 1"; "" when it succeeded.
func (in *instance) failure() string {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.exitCode == 0 && in.err == "" {
		return ""
	}
	why := in.err
	if why == "" {
		why = fmt.Sprintf("exit code %d", in.exitCode)
	}
	return fmt.Sprintf("%s, in attempt %d", why, in.attempts)
}

func (in *instance) name() string { return fmt.Sprintf("%s[%d]", in.step, in.index) }

// env is the environment of the instance's processes: the base environment, the SLUICE_*
// variables the controller also injects into pods, then the container's own env with
// Kubernetes $(VAR) expansion.
func (in *instance) env(c corev1.Container) ([]string, map[string]string) {
	vars := map[string]string{}
	var order []string
	set := func(k, v string) {
		if _, ok := vars[k]; !ok {
			order = append(order, k)
		}
		vars[k] = v
	}
	for _, kv := range in.r.opts.Env {
		if k, v, ok := strings.Cut(kv, "="); ok && !strings.HasPrefix(k, "SLUICE_") {
			set(k, v)
		}
	}
	set("SLUICE_DIR", in.volume())
	set("SLUICE_WORKFLOW", in.r.wf.Name)
	set("SLUICE_STEP", in.step)
	set("SLUICE_INSTANCE", strconv.Itoa(in.index))
	set("SLUICE_REPLICAS", strconv.Itoa(in.replicas))
	lookup := func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
	for _, e := range c.Env {
		if e.ValueFrom != nil {
			continue // left unset, as Warnings says before the run
		}
		set(e.Name, expand(e.Value, lookup))
	}
	out := make([]string, 0, len(order))
	for _, k := range order {
		out = append(out, k+"="+vars[k])
	}
	return out, vars
}

// workingDir maps a container's workingDir: inside the volume's mount path it becomes the
// same place in the view (inVolume), which runContainer creates when it does not exist, as
// a container runtime does; elsewhere it is used as is when it exists.
func (in *instance) workingDir(c corev1.Container) (dir string, inVolume bool) {
	wd := c.WorkingDir
	mp := in.r.wf.Spec.Volume.MountPath
	if mp == "" {
		mp = "/data"
	}
	switch {
	case wd == "":
		return in.volume(), false
	case wd == mp || strings.HasPrefix(wd, strings.TrimSuffix(mp, "/")+"/"):
		return filepath.Join(in.volume(), strings.TrimPrefix(wd, mp)), true
	}
	if st, err := os.Stat(wd); err == nil && st.IsDir() {
		return wd, false
	}
	in.r.log.Info("workingDir does not exist here; using the volume", "step", in.step, "container", c.Name, "workingDir", wd)
	return in.volume(), false
}

// command builds a container's argv: command then args, with $(VAR) expansion.
func (in *instance) command(c corev1.Container, vars map[string]string) ([]string, error) {
	if len(c.Command) == 0 {
		return nil, fmt.Errorf("container %s has no command: sluice run cannot use the image's entrypoint", c.Name)
	}
	lookup := func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
	argv := make([]string, 0, len(c.Command)+len(c.Args))
	for _, a := range append(append([]string{}, c.Command...), c.Args...) {
		argv = append(argv, expand(a, lookup))
	}
	return argv, nil
}

// run runs the instance's init containers one after another, then its containers
// together, and records the outcome. It returns when every process has exited.
func (in *instance) run(ctx context.Context) {
	logf, err := os.OpenFile(in.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	in.mu.Lock()
	in.st = stateRunning
	if in.attempts == 0 {
		in.start = time.Now()
	}
	in.attempts++
	in.mu.Unlock()
	finish := func(code int, msg string) {
		in.mu.Lock()
		defer in.mu.Unlock()
		in.end, in.exitCode, in.err = time.Now(), code, msg
		in.st = stateSucceeded
		if code != 0 || msg != "" {
			in.st = stateFailed
		}
		in.final = in.viewStats()
	}
	if err != nil {
		finish(-1, fmt.Sprintf("opening log: %v", err))
		return
	}
	defer logf.Close()
	tmpl := in.spec.Template.Spec
	for _, c := range tmpl.InitContainers {
		if code, err := in.runContainer(ctx, c, logf); code != 0 || err != nil {
			finish(code, errString(err, "init container "+c.Name))
			return
		}
	}
	type result struct {
		code int
		err  error
		name string
	}
	results := make(chan result, len(tmpl.Containers))
	for _, c := range tmpl.Containers {
		go func(c corev1.Container) {
			code, err := in.runContainer(ctx, c, logf)
			results <- result{code, err, c.Name}
		}(c)
	}
	code, msg := 0, ""
	for range tmpl.Containers {
		res := <-results
		if (res.code != 0 || res.err != nil) && code == 0 && msg == "" {
			code, msg = res.code, errString(res.err, "container "+res.name)
		}
	}
	finish(code, msg)
}

func errString(err error, where string) string {
	if err == nil {
		return ""
	}
	return where + ": " + err.Error()
}

// runScript is the sh script that starts a container's command: $0 names the container,
// $1 is the working directory, the rest is the command line.
const runScript = `cd -- "$1" || exit; shift
command -v -- "$1" >/dev/null 2>&1 || { printf '%s: %s: command not found (PATH=%s)\n' "$0" "$1" "$PATH" >&2; exit 127; }
exec "$@"`

// runContainer runs one container's command as a process group, stopping the whole group
// when ctx ends (SIGTERM, then SIGKILL after the grace period) and when the main process
// exits (as a container's processes end with it).
func (in *instance) runContainer(ctx context.Context, c corev1.Container, log io.Writer) (int, error) {
	env, vars := in.env(c)
	argv, err := in.command(c, vars)
	if err != nil {
		return -1, err
	}
	wd, inVolume := in.workingDir(c)
	if inVolume {
		if err := os.MkdirAll(wd, 0o755); err != nil {
			return -1, fmt.Errorf("creating its workingDir %s in the volume: %w", c.WorkingDir, err)
		}
	}
	// The process must not touch the FUSE mount between fork and exec: the forked child
	// shares this process's memory and a runtime thread until it execs, and a FUSE request
	// it made there could need that thread to be answered. So sh changes into the working
	// directory after the exec, then execs the command. sh's $0 names the step instance
	// and the container in its own messages, and a program not found says so (exec's
	// message names neither the instance nor PATH).
	label := fmt.Sprintf("sluice run: step %s instance %d container %s", in.step, in.index, c.Name)
	shArgs := append([]string{"-c", runScript, label, wd}, argv...)
	cmd := exec.Command("/bin/sh", shArgs...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return -1, fmt.Errorf("starting %q: %w", argv[0], err)
	}
	pgid := cmd.Process.Pid
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			_ = syscall.Kill(-pgid, syscall.SIGTERM)
			select {
			case <-done:
			case <-time.After(in.r.opts.StopGrace):
				_ = syscall.Kill(-pgid, syscall.SIGKILL)
			}
		case <-done:
		}
	}()
	err = cmd.Wait()
	close(done)
	// Whatever the main process left running in its group ends with it, as a container's
	// processes end with its main process. One still writing a declared output would leave
	// it short of what it meant to write: that fails the container, naming the file.
	left, writers := in.groupLeft(pgid)
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	if len(left) > 0 && ctx.Err() == nil {
		in.r.log.Info("killed what the main process left running, as a container's processes end with it",
			"step", in.step, "instance", in.index, "container", c.Name, "processes", strings.Join(left, ", "))
	}
	var ee *exec.ExitError
	switch {
	case err == nil && len(writers) > 0:
		return 0, fmt.Errorf("its main process exited while %s: killed with it, so that output may lack what it would have written; "+
			"wait for background writers before exiting (the shell's `wait`)", strings.Join(writers, "; "))
	case err == nil:
		return 0, nil
	case errors.As(err, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal()), fmt.Errorf("killed by %s", ws.Signal())
		}
		return ee.ExitCode(), nil
	default:
		return -1, err
	}
}

// groupLeft lists the processes of process group pgid, each as "123 (sleep)", and those
// of them holding a governed file of the instance's view open for writing, each as
// `process 123 (sleep) had "log.txt" open for writing`: what killing the group cuts
// short. It reads /proc; a process gone meanwhile is skipped.
func (in *instance) groupLeft(pgid int) (left, writers []string) {
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return nil, nil
	}
	mnt := in.volume() + "/"
	for _, pe := range procs {
		pid, err := strconv.Atoi(pe.Name())
		if err != nil {
			continue
		}
		if g, err := syscall.Getpgid(pid); err != nil || g != pgid {
			continue
		}
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		name := strings.TrimSpace(string(comm))
		left = append(left, fmt.Sprintf("%d (%s)", pid, name))
		fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		if err != nil || in.view == nil {
			continue
		}
		for _, fe := range fds {
			target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fe.Name()))
			if err != nil || !strings.HasPrefix(target, mnt) {
				continue
			}
			rel := strings.TrimPrefix(target, mnt)
			if !in.r.rules.Resolve(rel).Governed() || !fdWritable(pid, fe.Name()) {
				continue
			}
			writers = append(writers, fmt.Sprintf("process %d (%s) had %q open for writing", pid, name, rel))
		}
	}
	sort.Strings(writers)
	return left, slices.Compact(writers)
}

// fdWritable reports whether descriptor fd of process pid was opened for writing
// (O_WRONLY or O_RDWR in the flags of /proc/PID/fdinfo/FD).
func fdWritable(pid int, fd string) bool {
	info, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%s", pid, fd))
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(info), "\n") {
		if v, ok := strings.CutPrefix(line, "flags:"); ok {
			flags, err := strconv.ParseUint(strings.TrimSpace(v), 8, 64)
			return err == nil && flags&(syscall.O_WRONLY|syscall.O_RDWR) != 0
		}
	}
	return false
}
