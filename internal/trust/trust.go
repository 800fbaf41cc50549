// Package trust is how Sluice's clients verify the servers of an installation over TLS:
// the system's roots and, when the installation runs its own CA (the one the controller
// makes for the bundled NATS and MinIO, or the ca.crt another issuer writes), that CA.
// The controller, the minio-setup container, the sidecars and the store servers all build
// their TLS configuration here, so they verify alike.
package trust

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
)

// MaxCA bounds the CA certificates a process is handed (a workflow's configuration Secret,
// a store server's deposit, a file): a bundle of a few certificates, never megabytes.
const MaxCA = 64 << 10

// Config returns a client TLS configuration (TLS 1.2 or later) that verifies a server's
// certificate, and its name, against the system's roots and the PEM certificates in ca.
// It is an error for ca to hold no certificate or more than MaxCA bytes.
func Config(ca []byte) (*tls.Config, error) {
	if len(ca) > MaxCA {
		return nil, fmt.Errorf("CA certificates: %d bytes, more than %d", len(ca), MaxCA)
	}
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool() // an image without roots: the installation's CA only
	}
	if !pool.AppendCertsFromPEM(ca) {
		return nil, errors.New("CA certificates: no PEM certificate in them")
	}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}

// ReadFile reads the CA certificates at path (at most MaxCA bytes) and checks them as
// Config does. Errors name the file.
func ReadFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("CA file: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxCA+1))
	if err != nil {
		return nil, fmt.Errorf("CA file %s: %w", path, err)
	}
	if _, err := Config(b); err != nil {
		return nil, fmt.Errorf("CA file %s: %w", path, err)
	}
	return b, nil
}
