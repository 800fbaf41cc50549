package objstore

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// PartSize is the multipart part size of S3 uploads: explicit and bounded, so an upload
// buffers at most PartSize × PartThreads bytes (minio-go's unknown-size default buffers
// about 0.5 GiB).
const (
	PartSize    = 16 << 20
	PartThreads = 4
)

// S3 is a Store in an S3 bucket under a key prefix.
type S3 struct {
	client *minio.Client
	bucket string
	prefix string
	// RetryFor bounds how long a Put keeps retrying while the endpoint is unreachable or
	// failing; 0 means 5 minutes.
	RetryFor time.Duration
	// RetryUnknownKeys makes a Put refused for an access key the store does not know
	// (InvalidAccessKeyId) retry within RetryFor too: set where whoever made the keys
	// makes a missing account again (the controller, for a workflow's own keys).
	RetryUnknownKeys bool
	// OnRetry, if set, is called with each error a Put is about to retry (a sidecar
	// reports an unknown key at once, so that the controller checks its account).
	OnRetry func(err error)
}

// IsUnknownKey reports whether err is an S3 refusal of an access key the store does not
// know (InvalidAccessKeyId).
func IsUnknownKey(err error) bool {
	var resp minio.ErrorResponse
	return errors.As(err, &resp) && resp.Code == "InvalidAccessKeyId"
}

func openS3(ctx context.Context, u *url.URL, creds Credentials) (*S3, error) {
	q := u.Query()
	endpoint := q.Get("endpoint")
	if endpoint == "" {
		return nil, fmt.Errorf("object store URL %s: the endpoint parameter is required (s3://bucket/prefix?endpoint=host:port)", u.Redacted())
	}
	if u.Host == "" {
		return nil, fmt.Errorf("object store URL %s: no bucket", u.Redacted())
	}
	secure := q.Get("secure") == "true"
	if strings.HasPrefix(endpoint, "https://") {
		secure, endpoint = true, strings.TrimPrefix(endpoint, "https://")
	}
	endpoint = strings.TrimPrefix(endpoint, "http://")
	tr, err := Transport(endpoint, secure, creds.CA)
	if err != nil {
		return nil, err
	}
	client, err := minio.New(endpoint, &minio.Options{
		Creds:           credentials.NewStaticV4(creds.AccessKey, creds.SecretKey, ""),
		Secure:          secure,
		Transport:       tr,
		Region:          q.Get("region"),
		TrailingHeaders: true,
	})
	if err != nil {
		return nil, fmt.Errorf("object store %s: %w", endpoint, err)
	}
	prefix := strings.Trim(u.Path, "/")
	if prefix != "" {
		prefix += "/"
	}
	return &S3{client: client, bucket: u.Host, prefix: prefix}, nil
}

// URI returns s3://bucket/prefix/key.
func (s *S3) URI(key string) string { return "s3://" + s.bucket + "/" + s.prefix + key }

// Remove deletes bucket/prefix/key (a withdrawn permanent output), retrying while the
// endpoint is down as Put does; a missing object is not an error (S3 DeleteObject).
func (s *S3) Remove(ctx context.Context, key string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	err := s.retry(ctx, func() error {
		return s.client.RemoveObject(ctx, s.bucket, s.prefix+key, minio.RemoveObjectOptions{})
	})
	if err != nil {
		return fmt.Errorf("removing %s: %w", s.URI(key), err)
	}
	return nil
}

// Put uploads src as bucket/prefix/key: a multipart upload with PartSize parts,
// PartThreads in parallel, each part's SHA-256 checked by the server, and the file's
// SHA-256 recorded in the object's metadata (x-amz-meta-sha256). After the upload it reads
// the object's attributes back and fails with ErrIntegrity unless size and digest match.
// While the endpoint is down it retries with exponential backoff for up to RetryFor.
func (s *S3) Put(ctx context.Context, key, src string) (Object, error) {
	if err := checkKey(key); err != nil {
		return Object{}, err
	}
	size, sum, err := FileSHA256(ctx, src)
	if err != nil {
		return Object{}, fmt.Errorf("uploading %s: %w", key, err)
	}
	obj := Object{Key: key, URI: s.URI(key), Size: size, SHA256: sum}
	err = s.retry(ctx, func() error {
		err := s.putOnce(ctx, obj, src)
		if errors.Is(err, ErrIntegrity) {
			return &permanentError{err}
		}
		return err
	})
	var pe *permanentError
	if errors.As(err, &pe) {
		err = pe.err
	}
	if err != nil {
		return Object{}, fmt.Errorf("uploading %s to %s: %w", key, obj.URI, err)
	}
	return obj, nil
}

// permanentError stops retry: the error will not go away.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }

func (s *S3) putOnce(ctx context.Context, obj Object, src string) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = s.client.PutObject(ctx, s.bucket, s.prefix+obj.Key, f, obj.Size, minio.PutObjectOptions{
		PartSize:     PartSize,
		NumThreads:   PartThreads,
		Checksum:     minio.ChecksumSHA256,
		UserMetadata: map[string]string{"sha256": obj.SHA256},
		ContentType:  "application/octet-stream",
	})
	if err != nil {
		return err
	}
	info, err := s.client.StatObject(ctx, s.bucket, s.prefix+obj.Key, minio.StatObjectOptions{})
	if err != nil {
		return err
	}
	if info.Size != obj.Size || info.UserMetadata["Sha256"] != obj.SHA256 {
		return fmt.Errorf("%w: stored %d bytes with sha256 %q, the file has %d bytes with sha256 %s",
			ErrIntegrity, info.Size, info.UserMetadata["Sha256"], obj.Size, obj.SHA256)
	}
	return nil
}

// retryable reports whether an upload error may go away: the endpoint unreachable, a 5xx,
// a throttle. Access and bucket errors are not retried, nor a TLS certificate the client
// does not trust (a configuration error: the installation's CA is missing or another).
func retryable(err error) bool {
	var pe *permanentError
	var cert *tls.CertificateVerificationError
	if errors.As(err, &pe) || errors.As(err, &cert) {
		return false
	}
	resp := minio.ToErrorResponse(err)
	switch resp.Code {
	case "AccessDenied", "NoSuchBucket", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidBucketName":
		return false
	}
	return resp.StatusCode == 0 || resp.StatusCode >= 500 || resp.StatusCode == 429
}
