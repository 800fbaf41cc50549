// Package servers runs the real server processes that integration and failure tests need
// — the S3 servers MinIO and versitygw, and nats-server — on free loopback ports, from
// the pinned builds that hack/servers.sh caches. A test can stop a server and start it again on the same port and
// data directory, to exercise an outage.
package servers

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// ErrNotBuilt is returned when a server binary is missing: run `make servers`.
var ErrNotBuilt = errors.New("server binary not built: run `make servers` (hack/servers.sh build)")

// Binary returns the path of a server binary: $SLUICE_<NAME>_BIN if set, else
// $SLUICE_CACHE/bin/<name> (default cache ~/.cache/sluice).
func Binary(name string) (string, error) {
	env := "SLUICE_" + envName(name) + "_BIN"
	if p := os.Getenv(env); p != "" {
		return p, nil
	}
	cache := os.Getenv("SLUICE_CACHE")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", err
		}
		cache = filepath.Join(home, ".cache", "sluice")
	}
	p := filepath.Join(cache, "bin", name)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%s: %w", p, ErrNotBuilt)
	}
	return p, nil
}

func envName(name string) string {
	out := []byte(name)
	for i, c := range out {
		switch {
		case c >= 'a' && c <= 'z':
			out[i] = c - 'a' + 'A'
		case c == '-':
			out[i] = '_'
		}
	}
	return string(out)
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// process is a server process started by this package.
type process struct {
	name string
	args []string
	env  []string
	log  string
	cmd  *exec.Cmd
	done chan struct{}
}

func (p *process) start() error {
	if err := os.MkdirAll(filepath.Dir(p.log), 0o755); err != nil {
		return err
	}
	logf, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(p.args[0], p.args[1:]...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("starting %s: %w", p.name, err)
	}
	p.cmd, p.done = cmd, make(chan struct{})
	go func() { cmd.Wait(); logf.Close(); close(p.done) }()
	return nil
}

// stop ends the process by pid (SIGTERM, then SIGKILL after 10 s) and waits for it.
func (p *process) stop() {
	if p.cmd == nil {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
	p.cmd = nil
}

// kill ends the process with SIGKILL at once.
func (p *process) kill() {
	if p.cmd == nil {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
	p.cmd = nil
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// waitReady polls check until it succeeds, the process exits, or 60 s pass.
func (p *process) waitReady(check func() error) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := check()
		if err == nil {
			return nil
		}
		if p.exited() {
			return fmt.Errorf("%s exited while starting; see %s", p.name, p.log)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after 60s (%w); see %s", p.name, err, p.log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// NATS is a nats-server with JetStream on disk, on loopback.
type NATS struct {
	// URL is the client URL, nats://127.0.0.1:port.
	URL  string
	proc *process
}

// StartNATS starts nats-server with JetStream storing in dir/jetstream, its log in
// dir/nats.log.
func StartNATS(dir string) (*NATS, error) {
	bin, err := Binary("nats-server")
	if err != nil {
		return nil, err
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	n := &NATS{URL: "nats://127.0.0.1:" + strconv.Itoa(port)}
	n.proc = &process{
		name: "nats-server",
		args: []string{bin, "-a", "127.0.0.1", "-p", strconv.Itoa(port), "-js", "-sd", filepath.Join(dir, "jetstream")},
		log:  filepath.Join(dir, "nats.log"),
	}
	if err := n.Start(); err != nil {
		return nil, err
	}
	return n, nil
}

// Start starts (or restarts) the server and waits until it accepts connections.
func (n *NATS) Start() error {
	if err := n.proc.start(); err != nil {
		return err
	}
	addr := n.URL[len("nats://"):]
	return n.proc.waitReady(func() error {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return err
		}
		return c.Close()
	})
}

// Stop stops the server by pid and waits for it to exit.
func (n *NATS) Stop() { n.proc.stop() }

// Kill ends the server with SIGKILL, as a crash would.
func (n *NATS) Kill() { n.proc.kill() }
