// Package objstore stores a workflow's permanent files: in a local directory (file://)
// or in any S3-compatible object storage (s3://, through minio-go). Every Put reports the
// object's size and SHA-256, and an S3 Put checks that the stored object has them.
package objstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/minio/minio-go/v7"

	"github.com/sluice-io/sluice/internal/trust"
)

// Object is a stored file.
type Object struct {
	Key    string // the key under the store's prefix
	URI    string // file:///dir/key or s3://bucket/prefix/key
	Size   int64  // bytes
	SHA256 string // hex digest of the stored bytes
}

// Store stores permanent files. Implementations are safe for concurrent use.
type Store interface {
	// Put stores the size bytes of the local file at src under key (a volume path, "/"
	// separated) and returns the stored object. A Put that fails leaves no object under
	// key, or an earlier complete one: never a partial object.
	Put(ctx context.Context, key, src string) (Object, error)
	// URI returns where key is (or would be) stored.
	URI(key string) string
}

// Credentials are the S3 access keys, and the CA the client trusts. They are never
// logged.
type Credentials struct {
	// AccessKey and SecretKey are the S3 access key pair.
	AccessKey, SecretKey string
	// CA is the installation's CA certificate (PEM), which a TLS endpoint's certificate
	// may chain to besides the system's roots (trust.Config): the bundled MinIO's. Empty:
	// the system's roots only. It is not a secret.
	CA []byte
}

// Transport is the HTTP transport of an S3 or MinIO admin client of endpoint with TLS
// (secure) that trusts the installation's CA ca besides the system's roots; nil (the
// client's default) when ca is empty. A CA on a plain endpoint is an error: the
// installation's storage serves TLS, so the client must speak it.
func Transport(endpoint string, secure bool, ca []byte) (http.RoundTripper, error) {
	if len(ca) == 0 {
		return nil, nil
	}
	if !secure {
		return nil, fmt.Errorf("object storage %s: a CA is given but TLS is off (secure=false)", endpoint)
	}
	tc, err := trust.Config(ca)
	if err != nil {
		return nil, fmt.Errorf("object storage %s: %w", endpoint, err)
	}
	tr, err := minio.DefaultTransport(true)
	if err != nil {
		return nil, fmt.Errorf("object storage %s: %w", endpoint, err)
	}
	tr.TLSClientConfig = tc
	return tr, nil
}

// CredentialsFromEnv reads AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (the usual S3 client
// variables), falling back to MINIO_ROOT_USER and MINIO_ROOT_PASSWORD.
func CredentialsFromEnv() Credentials {
	c := Credentials{AccessKey: os.Getenv("AWS_ACCESS_KEY_ID"), SecretKey: os.Getenv("AWS_SECRET_ACCESS_KEY")}
	if c.AccessKey == "" {
		c.AccessKey, c.SecretKey = os.Getenv("MINIO_ROOT_USER"), os.Getenv("MINIO_ROOT_PASSWORD")
	}
	return c
}

// Open returns the store a URL names:
//
//	file:///abs/dir                                   a local directory
//	s3://bucket[/prefix]?endpoint=host:port[&secure=true][&region=r]
//
// The bucket must exist (it is not created: it holds the workflow's results, whose
// lifecycle is the user's). Errors name the URL's bad part.
func Open(ctx context.Context, rawURL string, creds Credentials) (Store, error) {
	u, err := parseURL(rawURL)
	if err != nil {
		return nil, err
	}
	if u.Scheme == "file" {
		return NewDir(u.Path)
	}
	return openS3(ctx, u, creds)
}

// CheckURL reports whether rawURL has the form Open takes (file:///dir or
// s3://bucket/prefix?...), without creating or contacting anything: an error names what
// is wrong, e.g. a bare path that lacks its file:// scheme.
func CheckURL(rawURL string) error {
	_, err := parseURL(rawURL)
	return err
}

// parseURL parses an object store URL and checks its scheme and, for file://, that it
// names a local directory.
func parseURL(rawURL string) (*url.URL, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("object store URL %q: %w", rawURL, err)
	}
	switch u.Scheme {
	case "file":
		if u.Host != "" && u.Host != "localhost" {
			return nil, fmt.Errorf("object store URL %q: file URLs name a local path (file:///dir)", rawURL)
		}
		if u.Path == "" {
			return nil, fmt.Errorf("object store URL %q: no directory", rawURL)
		}
		return u, nil
	case "s3":
		return u, nil
	case "":
		return nil, fmt.Errorf("object store URL %q: no scheme: write file://%s for a local directory (or use --out), s3://bucket/prefix?endpoint=host:port for S3", rawURL, absOrSame(rawURL))
	}
	return nil, fmt.Errorf("object store URL %q: scheme must be file or s3", rawURL)
}

// absOrSame returns p made absolute, or p when that fails.
func absOrSame(p string) string {
	if abs, err := filepath.Abs(p); err == nil {
		return abs
	}
	return p
}

// Dir is a Store in a local directory.
type Dir struct {
	root string
}

// NewDir returns a Store writing under root (created if needed).
func NewDir(root string) (*Dir, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("object store directory %s: %w", root, err)
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return nil, fmt.Errorf("creating object store directory: %w", err)
	}
	return &Dir{root: abs}, nil
}

// URI returns file:///root/key.
func (d *Dir) URI(key string) string {
	return "file://" + filepath.Join(d.root, filepath.FromSlash(key))
}

// Put copies src to root/key through a temporary file renamed into place, with src's
// permission bits.
func (d *Dir) Put(ctx context.Context, key, src string) (Object, error) {
	if err := checkKey(key); err != nil {
		return Object{}, err
	}
	dest := filepath.Join(d.root, filepath.FromSlash(key))
	if err := os.MkdirAll(filepath.Dir(dest), 0o755); err != nil {
		return Object{}, fmt.Errorf("storing %s: %w", key, err)
	}
	in, err := os.Open(src)
	if err != nil {
		return Object{}, fmt.Errorf("storing %s: %w", key, err)
	}
	defer in.Close()
	tmp, err := os.CreateTemp(filepath.Dir(dest), ".sluice-"+filepath.Base(dest)+"-*")
	if err != nil {
		return Object{}, fmt.Errorf("storing %s: %w", key, err)
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), contextReader{ctx, in})
	if err == nil {
		// The stored copy has the file's permission bits (CreateTemp makes it 0600), as cp
		// -p would: a 0644 result stays readable to the other users of the directory.
		var fi os.FileInfo
		if fi, err = in.Stat(); err == nil {
			err = tmp.Chmod(fi.Mode().Perm())
		}
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), dest)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return Object{}, fmt.Errorf("storing %s: %w", key, err)
	}
	return Object{Key: key, URI: d.URI(key), Size: n, SHA256: hex.EncodeToString(h.Sum(nil))}, nil
}

// Remove deletes root/key (a withdrawn permanent output); a missing file is not an error.
func (d *Dir) Remove(ctx context.Context, key string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(d.root, filepath.FromSlash(key))); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing %s: %w", key, err)
	}
	return nil
}

// checkKey refuses keys that could leave the store's root.
func checkKey(key string) error {
	if key == "" || strings.HasPrefix(key, "/") || strings.ContainsRune(key, 0) {
		return fmt.Errorf("invalid object key %q", key)
	}
	for _, seg := range strings.Split(key, "/") {
		if seg == ".." || seg == "." || seg == "" {
			return fmt.Errorf("invalid object key %q", key)
		}
	}
	if path.Clean(key) != key {
		return fmt.Errorf("invalid object key %q", key)
	}
	return nil
}

// contextReader stops a copy when its context ends.
type contextReader struct {
	ctx context.Context
	r   io.Reader
}

func (c contextReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// FileSHA256 returns the size in bytes and the hex SHA-256 of the file at p, stopping
// when ctx ends.
func FileSHA256(ctx context.Context, p string) (int64, string, error) {
	f, err := os.Open(p)
	if err != nil {
		return 0, "", err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, contextReader{ctx, f})
	if err != nil {
		return 0, "", err
	}
	return n, hex.EncodeToString(h.Sum(nil)), nil
}

// ErrIntegrity is returned when a stored object does not match the file it came from.
var ErrIntegrity = errors.New("stored object does not match the committed file")
