package storeserver

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"

	"github.com/sluice-io/sluice/internal/store"
)

// The CSI node plugin runs privileged, as root; a store server reads and writes
// directories the workflow's pods write. So each store server runs in a child process of
// the plugin (Children) that holds no privilege: the sidecars' user and group, no
// supplementary groups, no capabilities in any set (the bounding set included) and
// no_new_privs, so that nothing it executes gains any. The child is the plugin's own
// binary (Command, a hidden subcommand that calls RunChild); it reads its Config on its
// standard input (its command line and environment, which other users of the node may
// read in /proc, hold no credential), answers "ready" on its standard output once it
// serves, and writes its logs on its standard error, which the plugin relays to its own
// log. The plugin restarts a child that ends with a growing pause, and stops it with the
// workflow's store (Servers.Stop).

// startedLine is what a child writes on its standard output first, once its program
// runs (the dynamic loader, if any, has done with the plugin's root): the plugin then
// makes the child's root (isolate) and writes its configuration.
const startedLine = "started"

// readyLine is what a child writes on its standard output once it serves.
const readyLine = "ready"

// maxConfig bounds a child's configuration: the NATS connection and the Workflow.
const maxConfig = 4 << 20

// Restart pauses: the first after a child ended, doubled at each end up to the longest,
// and back to the first once a child served for the longest.
const (
	firstRestartPause = time.Second
	longestPause      = time.Minute
)

// startTimeout bounds the wait for a child's first readiness (Children.Start).
const startTimeout = 2 * time.Minute

// ChildOptions say how the CSI plugin starts its store servers' child processes.
type ChildOptions struct {
	// Command is the child's argv: Command[0] (the plugin's own binary,
	// "/proc/self/exe"), with the subcommand that calls RunChild. What is executed is a
	// copy of Command[0] that only root may read (privateCopy), so that every child is
	// not dumpable from its execve on.
	Command []string
	// UID and GID are the user and group a child runs as whose workflow has no user of
	// its own (Config.User): the sidecars' default (65532), which owns such a workflow's
	// directories. Neither may be 0.
	UID, GID int
	// RootDir is an empty directory of the plugin's (root's, mode 0700): in each child's
	// mount namespace the child's own root is mounted there before it becomes the
	// child's root (isolate).
	RootDir string
	// Log receives the children's logs, with their process IDs.
	Log logr.Logger
	// Started, when set, is called with the process ID of each child once it serves (the
	// first and every restart).
	Started func(dir string, pid int)
}

// Children starts store servers as unprivileged child processes (Options.Start).
type Children struct {
	opts ChildOptions
	exe  *os.File // the private copy of the executable (privateCopy), executed as exeFd
}

// exeFd is the descriptor a child inherits of its own executable, executed as
// /proc/self/fd/3 (the copy's directory need not be searchable by the child's user); the
// child closes it first thing (RunChild).
const exeFd = 3

// NewChildren returns the starter of store server processes with opts.
func NewChildren(opts ChildOptions) (*Children, error) {
	if len(opts.Command) == 0 {
		return nil, errors.New("store server children: no command")
	}
	if opts.UID <= 0 || opts.GID <= 0 {
		return nil, fmt.Errorf("store server children: user %d, group %d: must not be root's", opts.UID, opts.GID)
	}
	if opts.RootDir == "" {
		return nil, errors.New("store server children: no root directory")
	}
	if err := CheckIsolation(); err != nil {
		return nil, fmt.Errorf("store server children: %w", err)
	}
	if err := os.MkdirAll(opts.RootDir, 0o700); err != nil {
		return nil, fmt.Errorf("store server children: %w", err)
	}
	exe, err := privateCopy(opts.Command[0], opts.RootDir+".exe")
	if err != nil {
		return nil, fmt.Errorf("store server children: %w", err)
	}
	f, err := os.OpenFile(exe, os.O_RDONLY|unix.O_PATH, 0)
	if err != nil {
		return nil, fmt.Errorf("store server children: %w", err)
	}
	if opts.Log.GetSink() == nil {
		opts.Log = logr.Discard()
	}
	return &Children{opts: opts, exe: f}, nil
}

// privateCopy copies the executable src to dst (replacing it), owned by root with mode
// 0711, and returns dst; the children execute it through the descriptor they inherit
// (exeFd). The kernel makes a process whose executable its user may not
// read not dumpable at its execve (would_dump): no other process of the sidecars' user
// (another workflow's store server) can then reach a starting child's memory,
// descriptors or root through /proc or ptrace, not even before it reads its
// configuration and its root is made (isolate).
func privateCopy(src, dst string) (string, error) {
	in, err := os.Open(src)
	if err != nil {
		return "", fmt.Errorf("the store server's executable: %w", err)
	}
	defer in.Close()
	tmp, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+"-")
	if err != nil {
		return "", fmt.Errorf("copying the store server's executable: %w", err)
	}
	defer os.Remove(tmp.Name()) // after the rename: nothing
	if _, err := io.Copy(tmp, in); err != nil {
		tmp.Close()
		return "", fmt.Errorf("copying the store server's executable: %w", err)
	}
	if err := tmp.Chmod(0o711); err != nil {
		tmp.Close()
		return "", fmt.Errorf("copying the store server's executable: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return "", fmt.Errorf("copying the store server's executable: %w", err)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return "", fmt.Errorf("copying the store server's executable: %w", err)
	}
	return dst, nil
}

// Child is a store server running as a child process, restarted when it ends until Stop.
type Child struct {
	c    *Children
	cfg  Config
	dirs []*os.File // the workflow's directory and its disk tier's, bound into the child's root
	log  logr.Logger
	stop chan struct{}
	done chan struct{}

	mu   sync.Mutex
	proc *os.Process // the running child, nil between two
}

// Start hands the workflow's directories (cfg.Dir's data/ and state/, and cfg.DiskDir) to
// the child's user, each reached without following a symlink, and starts the child with
// cfg; it returns once the child serves, or with the error of its first start (the child
// ended, or ctx ended or startTimeout passed first: the child is stopped). Later ends are
// restarted.
func (c *Children) Start(ctx context.Context, cfg Config) (Instance, error) {
	if cfg.User < 0 || cfg.User >= 1<<31 {
		return nil, fmt.Errorf("store server: user %d: must be above 0 and below 2^31", cfg.User)
	}
	dirs, err := c.handOver(cfg)
	if err != nil {
		return nil, err
	}
	body, err := json.Marshal(cfg)
	if err != nil {
		closeAll(dirs)
		return nil, fmt.Errorf("encoding the store server's configuration: %w", err)
	}
	ch := &Child{c: c, cfg: cfg, dirs: dirs, stop: make(chan struct{}), done: make(chan struct{}),
		log: c.opts.Log.WithValues("dir", cfg.Dir)}
	first := make(chan error, 1)
	go ch.supervise(body, first)
	select {
	case err := <-first:
		if err != nil {
			<-ch.done
			return nil, err
		}
		return ch, nil
	case <-ctx.Done():
		ch.Stop()
		return nil, fmt.Errorf("starting the store server process: %w", ctx.Err())
	case <-time.After(startTimeout):
		ch.Stop()
		return nil, fmt.Errorf("starting the store server process: not serving after %s", startTimeout)
	}
}

// handOver opens the directories the child serves, without following a symlink, and
// makes the child's user own data/ and state/ (created if missing) beneath cfg.Dir. It
// changes nothing below them (the sidecars, which run as the same user, made what is
// there), and nothing of the disk tier cfg.DiskDir, which the CSI plugin made at the
// workflow's first publish on the node as the workflow asks (its sidecars' user's, or
// root's when the workflow has none; with --disk-tier=filesystem the root of its own file
// system, entered by its path through the plugin's root-owned directories). It returns
// the workflow's directory and the disk tier's, which isolate binds into the child's
// root.
func (c *Children) handOver(cfg Config) ([]*os.File, error) {
	if cfg.DiskDir == "" {
		return nil, errors.New("store server: no disk tier directory")
	}
	wfd, err := store.OpenDirNoFollow(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("the workflow's directory: %w", err)
	}
	dirs := []*os.File{os.NewFile(uintptr(wfd), cfg.Dir)}
	for _, name := range []string{"data", "state"} {
		if err := c.ownedBeneath(wfd, name, cfg); err != nil {
			closeAll(dirs)
			return nil, fmt.Errorf("handing %s to the store server's user: %w", name, err)
		}
	}
	dfd, err := unix.Open(cfg.DiskDir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		closeAll(dirs)
		return nil, fmt.Errorf("the workflow's disk tier: %w", &os.PathError{Op: "open", Path: cfg.DiskDir, Err: err})
	}
	return append(dirs, os.NewFile(uintptr(dfd), cfg.DiskDir)), nil
}

// ownedBeneath creates (when missing) the directory name beneath the directory open as
// dirfd and hands it to the user of cfg's child, unless it is theirs already.
func (c *Children) ownedBeneath(dirfd int, name string, cfg Config) error {
	if err := store.MkdirBeneath(dirfd, name, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
		return err
	}
	fd, err := store.OpenBeneath(dirfd, name, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstatat(fd, "", &st, unix.AT_EMPTY_PATH); err != nil {
		return err
	}
	uid, gid := c.ids(cfg)
	if int(st.Uid) == uid && int(st.Gid) == gid {
		return nil
	}
	return unix.Fchownat(fd, "", uid, gid, unix.AT_EMPTY_PATH)
}

// ids returns the user and group the child of cfg runs as: the workflow's user
// (Config.User, its group the same number), else ChildOptions.UID and GID.
func (c *Children) ids(cfg Config) (uid, gid int) {
	if cfg.User > 0 {
		return int(cfg.User), int(cfg.User)
	}
	return c.opts.UID, c.opts.GID
}

func closeAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// supervise runs the child until Stop, restarting it when it ends; the result of the
// first start goes to first. It runs on an OS thread of its own, which it drops its
// privileges on (dropThreadPrivileges) and which ends with it: Linux keeps capabilities
// and no_new_privs per thread, a forked child inherits its forking thread's, and the
// child's parent-death signal fires when that thread ends, so the thread must outlive
// the children it forks.
func (ch *Child) supervise(body []byte, first chan<- error) {
	defer close(ch.done)
	defer closeAll(ch.dirs)
	var once sync.Once
	report := func(err error) { once.Do(func() { first <- err }) }
	runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
	if err := dropThreadPrivileges(); err != nil {
		report(fmt.Errorf("dropping privileges for the store server process: %w", err))
		return
	}
	everServed := false
	pause := firstRestartPause
	for {
		began := time.Now()
		served, err := ch.run(body, func() { report(nil) })
		if !everServed && !served {
			report(err)
			return
		}
		everServed = true
		select {
		case <-ch.stop:
			return
		default:
		}
		if time.Since(began) >= longestPause {
			pause = firstRestartPause
		}
		ch.log.Error(err, "the store server process ended; starting it again", "pause", pause.String())
		select {
		case <-ch.stop:
			return
		case <-time.After(pause):
		}
		pause = min(2*pause, longestPause)
	}
}

// run starts the child and waits for it to end; it calls ready once the child serves.
// It reports whether the child served, and why it ended.
func (ch *Child) run(body []byte, ready func()) (bool, error) {
	uid, gid := ch.c.ids(ch.cfg)
	cmd := exec.Command("/proc/self/fd/"+strconv.Itoa(exeFd), ch.c.opts.Command[1:]...)
	cmd.Args[0] = ch.c.opts.Command[0]
	cmd.ExtraFiles = []*os.File{ch.c.exe} // exeFd
	cmd.Env = []string{}                  // nothing of the plugin's environment
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}},
		Pdeathsig:  syscall.SIGKILL,
		Setpgid:    true,
		Cloneflags: syscall.CLONE_NEWNS, // made its own root by isolate
	}
	var files []*os.File // the pipes' ends: stdin, config, out, outW, logs, logsW
	for range 3 {
		r, w, err := os.Pipe()
		if err != nil {
			for _, f := range files {
				f.Close()
			}
			return false, fmt.Errorf("store server process: %w", err)
		}
		files = append(files, r, w)
	}
	stdin, config, out, outW, logs, logsW := files[0], files[1], files[2], files[3], files[4], files[5]
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, outW, logsW
	ch.mu.Lock()
	var err error
	select {
	case <-ch.stop:
		err = errors.New("stopped")
	default:
		if err = cmd.Start(); err == nil {
			ch.proc = cmd.Process
		}
	}
	ch.mu.Unlock()
	stdin.Close()
	outW.Close()
	logsW.Close()
	if err != nil {
		config.Close()
		out.Close()
		logs.Close()
		return false, fmt.Errorf("starting the store server process: %w", err)
	}
	pid := cmd.Process.Pid
	log := ch.log.WithValues("pid", pid)
	relayed := make(chan string, 1)
	go func() { relayed <- relay(logs, log) }()
	sc := bufio.NewScanner(out)
	if err := awaitLine(sc, startedLine, startTimeout); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		config.Close()
		out.Close()
		return false, fmt.Errorf("store server process %d: %w (last words: %s)", pid, err, <-relayed)
	}
	if err := isolate(pid, ch.c.opts.RootDir, ch.dirs[0], ch.dirs[1]); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		config.Close()
		out.Close()
		<-relayed
		return false, fmt.Errorf("store server process %d: making its root: %w", pid, err)
	}
	log.Info("started the store server process", "uid", uid, "gid", gid)
	go func() {
		_, _ = config.Write(body) // a child that ended early leaves EPIPE: its end says why
		config.Close()
	}()
	served := make(chan bool, 1)
	go func() {
		defer out.Close()
		ok := sc.Scan() && sc.Text() == readyLine
		if ok {
			log.Info("the store server process serves")
			if ch.c.opts.Started != nil {
				ch.c.opts.Started(ch.cfg.Dir, pid)
			}
			ready()
		}
		served <- ok
		_, _ = io.Copy(io.Discard, out)
	}()
	werr := cmd.Wait()
	last := <-relayed
	ok := <-served
	ch.mu.Lock()
	ch.proc = nil
	ch.mu.Unlock()
	if werr == nil {
		werr = errors.New("exited")
	}
	if last != "" {
		werr = fmt.Errorf("%w (last words: %s)", werr, last)
	}
	return ok, fmt.Errorf("store server process %d: %w", pid, werr)
}

// awaitLine waits at most timeout for the next line of sc to be want; the error says
// what came instead (another line, the end of the child's output, or nothing in time).
// After a timeout sc must not be read again.
func awaitLine(sc *bufio.Scanner, want string, timeout time.Duration) error {
	got := make(chan error, 1)
	go func() {
		switch {
		case !sc.Scan():
			got <- fmt.Errorf("ended before it wrote %q", want)
		case sc.Text() != want:
			got <- fmt.Errorf("wrote %q where %q was due", sc.Text(), want)
		default:
			got <- nil
		}
	}()
	select {
	case err := <-got:
		return err
	case <-time.After(timeout):
		return fmt.Errorf("wrote no %q within %s", want, timeout)
	}
}

// relay logs each line the child writes on its standard error and returns the last.
func relay(r *os.File, log logr.Logger) string {
	defer r.Close()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	last := ""
	for sc.Scan() {
		last = sc.Text()
		log.Info("store server process", "stderr", last)
	}
	return last
}

// Stop stops the child (SIGTERM, then SIGKILL after 10 seconds) and returns once it
// ended; it is not restarted.
func (ch *Child) Stop() {
	ch.mu.Lock()
	select {
	case <-ch.stop:
	default:
		close(ch.stop)
	}
	p := ch.proc
	ch.mu.Unlock()
	if p != nil {
		_ = p.Signal(syscall.SIGTERM)
	}
	select {
	case <-ch.done:
		return
	case <-time.After(10 * time.Second):
	}
	ch.mu.Lock()
	p = ch.proc
	ch.mu.Unlock()
	if p != nil {
		_ = p.Kill()
	}
	<-ch.done
}

// dropThreadPrivileges makes what the calling OS thread forks unable to regain a
// privilege: no_new_privs, an empty capability bounding set and an empty inheritable
// set. The thread keeps its effective capabilities (it still switches the child to its
// user, SysProcAttr.Credential, which clears the rest at the child's execve).
func dropThreadPrivileges() error {
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	for c := 0; ; c++ {
		err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0)
		if errors.Is(err, unix.EINVAL) {
			break // past the last capability the kernel knows
		}
		if err != nil {
			return fmt.Errorf("dropping capability %d from the bounding set: %w", c, err)
		}
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("reading the thread's capabilities: %w", err)
	}
	data[0].Inheritable, data[1].Inheritable = 0, 0
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("clearing the inheritable capabilities: %w", err)
	}
	return nil
}

// RunChild is the store server child process (the plugin's hidden subcommand): it writes
// "started" on ready (its standard output), reads its Config from config (its standard
// input) to the end, which the plugin writes once it made the process's root, serves the
// workflow's node store, writes "ready" on ready once it serves, and serves until ctx
// ends. It refuses to run as root, and outside the root its plugin makes for it
// (isolate: errNotIsolated).
func RunChild(ctx context.Context, config io.Reader, ready io.Writer, log logr.Logger) error {
	if os.Geteuid() == 0 {
		return errors.New("the store server process runs as the sidecars' user, never as root")
	}
	// Its own executable, by which the plugin started it, is of no further use.
	_ = unix.Close(exeFd)
	// The plugin makes this process's root once it knows the process runs (its dynamic
	// loader, if any, is done with the plugin's root), then writes the configuration.
	if _, err := fmt.Fprintln(ready, startedLine); err != nil {
		return fmt.Errorf("reporting the start: %w", err)
	}
	// Not dumpable (already so from its execve, as its executable is unreadable to it:
	// privateCopy): no other process of the sidecars' user (another store server) may
	// read this one's memory, descriptors or root through /proc or ptrace.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("making the store server process not dumpable: %w", err)
	}
	body, err := io.ReadAll(io.LimitReader(config, maxConfig+1))
	if err != nil {
		return fmt.Errorf("reading the store server's configuration: %w", err)
	}
	if len(body) > maxConfig {
		return fmt.Errorf("the store server's configuration is larger than %d bytes", maxConfig)
	}
	var cfg Config
	if err := json.Unmarshal(body, &cfg); err != nil {
		return fmt.Errorf("decoding the store server's configuration: %w", err)
	}
	// The plugin made this process's root before it wrote the configuration (isolate).
	for _, d := range []string{rootWorkflow, rootDisk} {
		if st, err := os.Lstat(d); err != nil || !st.IsDir() {
			return fmt.Errorf("%w: no directory %s", errNotIsolated, d)
		}
	}
	dir := cfg.Dir
	cfg.Dir, cfg.DiskDir = rootWorkflow, rootDisk
	srv, err := Serve(ctx, cfg, log.WithValues("dir", dir))
	if err != nil {
		return fmt.Errorf("store server of %s: %w", dir, err)
	}
	defer srv.Stop()
	if _, err := fmt.Fprintln(ready, readyLine); err != nil {
		return fmt.Errorf("reporting readiness: %w", err)
	}
	<-ctx.Done()
	return nil
}
