// Package servers runs the real server processes that integration and failure tests need
// — MinIO (S3) and nats-server — on free loopback ports, from the pinned builds that
// hack/servers.sh caches. A test can stop a server and start it again on the same port and
// data directory, to exercise an outage.
package servers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/sluice-io/sluice/internal/trust"
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

// MinIO is a MinIO server on loopback.
type MinIO struct {
	// Endpoint is host:port of the S3 API.
	Endpoint string
	// AccessKey and SecretKey are the root credentials.
	AccessKey, SecretKey string
	// CA is the CA of the server's certificate when it serves TLS (StartMinIOTLS).
	CA   []byte
	proc *process
}

// StartMinIO starts MinIO with its data in dir/data and its log in dir/minio.log.
func StartMinIO(dir string) (*MinIO, error) {
	return startMinIO(dir, nil)
}

// ServerCert is a TLS serving certificate and key (PEM) and the CA that signed it.
type ServerCert struct {
	// Cert is the serving certificate (PEM), for 127.0.0.1.
	Cert []byte
	// Key is Cert's private key (PEM).
	Key []byte
	// CA is the certificate (PEM) of the CA that signed Cert, which clients trust.
	CA []byte
}

// StartMinIOTLS starts MinIO as StartMinIO does, serving TLS only with cert (for
// 127.0.0.1), as the bundled MinIO does with the Secret the controller issues: its
// certificates directory holds public.crt, private.key and CAs/ca.crt.
func StartMinIOTLS(dir string, cert ServerCert) (*MinIO, error) {
	return startMinIO(dir, &cert)
}

func startMinIO(dir string, cert *ServerCert) (*MinIO, error) {
	bin, err := Binary("minio")
	if err != nil {
		return nil, err
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	console, err := FreePort()
	if err != nil {
		return nil, err
	}
	m := &MinIO{Endpoint: "127.0.0.1:" + strconv.Itoa(port), AccessKey: "sluice-test", SecretKey: "sluice-test-secret"}
	m.proc = &process{
		name: "minio",
		args: []string{bin, "server", filepath.Join(dir, "data"), "--address", m.Endpoint, "--console-address", "127.0.0.1:" + strconv.Itoa(console), "--quiet"},
		env:  []string{"MINIO_ROOT_USER=" + m.AccessKey, "MINIO_ROOT_PASSWORD=" + m.SecretKey, "MINIO_BROWSER=off"},
		log:  filepath.Join(dir, "minio.log"),
	}
	if cert != nil {
		certs := filepath.Join(dir, "certs")
		if err := os.MkdirAll(filepath.Join(certs, "CAs"), 0o700); err != nil {
			return nil, err
		}
		for name, b := range map[string][]byte{"public.crt": cert.Cert, "private.key": cert.Key, "CAs/ca.crt": cert.CA} {
			if err := os.WriteFile(filepath.Join(certs, name), b, 0o600); err != nil {
				return nil, err
			}
		}
		m.CA = cert.CA
		m.proc.args = append(m.proc.args, "--certs-dir", certs)
	}
	if err := m.Start(); err != nil {
		return nil, err
	}
	return m, nil
}

// Start starts (or restarts) the server on its port and data, and waits until it is live.
func (m *MinIO) Start() error {
	if err := m.proc.start(); err != nil {
		return err
	}
	hc, scheme, err := m.httpClient()
	if err != nil {
		return err
	}
	return m.proc.waitReady(func() error {
		resp, err := hc.Get(scheme + "://" + m.Endpoint + "/minio/health/ready")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("health: %s", resp.Status)
		}
		return nil
	})
}

// Stop stops the server by pid and waits for it to exit.
func (m *MinIO) Stop() { m.proc.stop() }

// httpClient is an HTTP client of the server and the scheme it serves: https trusting CA
// when it has one.
func (m *MinIO) httpClient() (*http.Client, string, error) {
	if len(m.CA) == 0 {
		return http.DefaultClient, "http", nil
	}
	tc, err := trust.Config(m.CA)
	if err != nil {
		return nil, "", err
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: tc}, Timeout: 10 * time.Second}, "https", nil
}

// Client returns an S3 client of the server with its root keys (over TLS, trusting CA,
// when the server serves TLS).
func (m *MinIO) Client() (*minio.Client, error) {
	o := &minio.Options{Creds: credentials.NewStaticV4(m.AccessKey, m.SecretKey, "")}
	if len(m.CA) > 0 {
		hc, _, err := m.httpClient()
		if err != nil {
			return nil, err
		}
		o.Secure, o.Transport = true, hc.Transport
	}
	return minio.New(m.Endpoint, o)
}

// Bucket creates bucket and returns a client of the server.
func (m *MinIO) Bucket(ctx context.Context, bucket string) (*minio.Client, error) {
	c, err := m.Client()
	if err != nil {
		return nil, err
	}
	if err := c.MakeBucket(ctx, bucket, minio.MakeBucketOptions{}); err != nil {
		return nil, fmt.Errorf("creating bucket %s: %w", bucket, err)
	}
	return c, nil
}

// Object returns the bytes of bucket/key.
func (m *MinIO) Object(ctx context.Context, bucket, key string) ([]byte, error) {
	c, err := m.Client()
	if err != nil {
		return nil, err
	}
	o, err := c.GetObject(ctx, bucket, key, minio.GetObjectOptions{})
	if err != nil {
		return nil, err
	}
	defer o.Close()
	return io.ReadAll(o)
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
