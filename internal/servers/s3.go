package servers

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/sluice-io/sluice/internal/trust"
)

// S3 is an S3 server on loopback with its root keys: MinIO (StartMinIO) or versitygw
// (StartVersityGW). Tests that are about S3 behaviour take an *S3 and run against each.
type S3 struct {
	// Name is the server's binary, "minio" or "versitygw".
	Name string
	// Endpoint is host:port of the S3 API.
	Endpoint string
	// AdminEndpoint is host:port of the server's admin API (accounts, policies): MinIO's
	// S3 port, versitygw's port of its own.
	AdminEndpoint string
	// AccessKey and SecretKey are the root credentials.
	AccessKey, SecretKey string
	// CA is the CA of the server's certificate when it serves TLS.
	CA []byte
	// health is the path that answers 200 once the server takes requests.
	health string
	proc   *process
}

// Start starts (or restarts) the server on its port and data, and waits until its health
// path answers 200 (60 s at most).
func (s *S3) Start() error {
	if err := s.proc.start(); err != nil {
		return err
	}
	hc, scheme, err := s.httpClient()
	if err != nil {
		return err
	}
	return s.proc.waitReady(func() error {
		resp, err := hc.Get(scheme + "://" + s.Endpoint + s.health)
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
func (s *S3) Stop() { s.proc.stop() }

// httpClient is an HTTP client of the server and the scheme it serves: https trusting CA
// when it has one.
func (s *S3) httpClient() (*http.Client, string, error) {
	if len(s.CA) == 0 {
		return &http.Client{Timeout: 10 * time.Second}, "http", nil
	}
	tc, err := trust.Config(s.CA)
	if err != nil {
		return nil, "", err
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: tc}, Timeout: 10 * time.Second}, "https", nil
}

// Client returns an S3 client of the server with its root keys (over TLS, trusting CA,
// when the server serves TLS).
func (s *S3) Client() (*minio.Client, error) {
	o := &minio.Options{Creds: credentials.NewStaticV4(s.AccessKey, s.SecretKey, "")}
	if len(s.CA) > 0 {
		hc, _, err := s.httpClient()
		if err != nil {
			return nil, err
		}
		o.Secure, o.Transport = true, hc.Transport
	}
	return minio.New(s.Endpoint, o)
}

// Bucket creates bucket with the root keys and returns a client of the server.
func (s *S3) Bucket(ctx context.Context, bucket string) (*minio.Client, error) {
	c, err := s.Client()
	if err != nil {
		return nil, err
	}
	if err := c.MakeBucket(ctx, bucket, minio.MakeBucketOptions{}); err != nil {
		return nil, fmt.Errorf("creating bucket %s on %s: %w", bucket, s.Name, err)
	}
	return c, nil
}

// Object returns the bytes of bucket/key, read with the root keys.
func (s *S3) Object(ctx context.Context, bucket, key string) ([]byte, error) {
	c, err := s.Client()
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

// ServerCert is a TLS serving certificate and key (PEM) and the CA that signed it.
type ServerCert struct {
	// Cert is the serving certificate (PEM), for 127.0.0.1.
	Cert []byte
	// Key is Cert's private key (PEM).
	Key []byte
	// CA is the certificate (PEM) of the CA that signed Cert, which clients trust.
	CA []byte
}

// MinIO is a MinIO server on loopback.
type MinIO struct {
	S3
}

// StartMinIO starts MinIO with its data in dir/data, its home (~/.minio) dir and its log in
// dir/minio.log.
func StartMinIO(dir string) (*MinIO, error) {
	return startMinIO(dir, nil)
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
	ep := "127.0.0.1:" + strconv.Itoa(port)
	m := &MinIO{S3{Name: "minio", Endpoint: ep, AdminEndpoint: ep, AccessKey: "sluice-test", SecretKey: "sluice-test-secret",
		health: "/minio/health/ready"}}
	m.proc = &process{
		name: "minio",
		args: []string{bin, "server", filepath.Join(dir, "data"), "--address", m.Endpoint, "--console-address", "127.0.0.1:" + strconv.Itoa(console), "--quiet"},
		// HOME: MinIO makes ~/.minio (its configuration and certificates directories) at
		// start; in dir, a test's MinIO writes nothing outside the test's directories.
		env: []string{"HOME=" + dir, "MINIO_ROOT_USER=" + m.AccessKey, "MINIO_ROOT_PASSWORD=" + m.SecretKey, "MINIO_BROWSER=off"},
		log: filepath.Join(dir, "minio.log"),
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

// VersityGW is a versitygw S3 gateway on loopback, storing objects in a POSIX directory
// and their metadata in files beside it (--sidecar: a bucket policy outgrows an extended
// attribute), with its internal IAM (accounts in a file) and its admin API on a port of
// its own.
type VersityGW struct {
	S3
}

// StartVersityGW starts versitygw with its objects in dir/data, their metadata in
// dir/meta, its accounts in dir/iam and its log in dir/versitygw.log, the S3 API and the admin API each on a free port.
func StartVersityGW(dir string) (*VersityGW, error) {
	return startVersityGW(dir, nil)
}

// StartVersityGWTLS starts versitygw as StartVersityGW does, its S3 and admin ports
// serving TLS only with cert (for 127.0.0.1).
func StartVersityGWTLS(dir string, cert ServerCert) (*VersityGW, error) {
	return startVersityGW(dir, &cert)
}

func startVersityGW(dir string, cert *ServerCert) (*VersityGW, error) {
	bin, err := Binary("versitygw")
	if err != nil {
		return nil, err
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	admin, err := FreePort()
	if err != nil {
		return nil, err
	}
	data, iam, meta := filepath.Join(dir, "data"), filepath.Join(dir, "iam"), filepath.Join(dir, "meta")
	for _, d := range []string{data, iam, meta} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	g := &VersityGW{S3: S3{Name: "versitygw", Endpoint: "127.0.0.1:" + strconv.Itoa(port),
		AdminEndpoint: "127.0.0.1:" + strconv.Itoa(admin), AccessKey: "sluice-test", SecretKey: "sluice-test-secret", health: "/health"}}
	g.proc = &process{
		name: "versitygw",
		args: []string{bin, "--port", g.Endpoint, "--admin-port", g.AdminEndpoint, "--iam-dir", iam,
			"--health", g.health, "--quiet", "posix", "--sidecar", meta, data},
		env: []string{"ROOT_ACCESS_KEY_ID=" + g.AccessKey, "ROOT_SECRET_ACCESS_KEY=" + g.SecretKey},
		log: filepath.Join(dir, "versitygw.log"),
	}
	if cert != nil {
		crt, key := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
		if err := os.WriteFile(crt, cert.Cert, 0o600); err != nil {
			return nil, err
		}
		if err := os.WriteFile(key, cert.Key, 0o600); err != nil {
			return nil, err
		}
		g.CA = cert.CA
		// Global flags, before the backend's name.
		g.proc.args = append(g.proc.args[:1], append([]string{"--cert", crt, "--key", key, "--admin-cert", crt, "--admin-cert-key", key}, g.proc.args[1:]...)...)
	}
	if err := g.Start(); err != nil {
		return nil, err
	}
	return g, nil
}

// S3Kind is a kind of S3 server the tests run against.
type S3Kind struct {
	// Name is the server's binary, as S3.Name.
	Name string
	// Start starts a server of this kind with its data in dir (StartMinIO,
	// StartVersityGW).
	Start func(dir string) (*S3, error)
}

// S3Kinds are the S3 servers hack/servers.sh builds, which every test about S3 behaviour
// runs against: MinIO (archived upstream) and versitygw (maintained).
var S3Kinds = []S3Kind{
	{Name: "minio", Start: func(dir string) (*S3, error) {
		m, err := StartMinIO(dir)
		if err != nil {
			return nil, err
		}
		return &m.S3, nil
	}},
	{Name: "versitygw", Start: func(dir string) (*S3, error) {
		g, err := StartVersityGW(dir)
		if err != nil {
			return nil, err
		}
		return &g.S3, nil
	}},
}
