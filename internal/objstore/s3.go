package objstore

import (
	"bytes"
	"context"
	"crypto/md5"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"golang.org/x/sync/errgroup"
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
	// trailing is the same client with aws-chunked trailers on: Put's faster path, which
	// streams each part once and has the server check its SHA-256 from the trailer.
	trailing *minio.Client
	// noTrailers is set once the server refused a trailer's checksum (BadDigest; versitygw
	// 1.8 refuses the trailers minio-go writes, MinIO takes them): Put then uploads
	// without them, each request with its signed SHA-256 and Content-MD5.
	noTrailers atomic.Bool
	bucket     string
	prefix     string
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
	opts := minio.Options{
		Creds:     credentials.NewStaticV4(creds.AccessKey, creds.SecretKey, ""),
		Secure:    secure,
		Transport: tr,
		Region:    q.Get("region"),
	}
	client, err := minio.New(endpoint, &opts)
	if err != nil {
		return nil, fmt.Errorf("object store %s: %w", endpoint, err)
	}
	opts.TrailingHeaders = true
	trailing, err := minio.New(endpoint, &opts)
	if err != nil {
		return nil, fmt.Errorf("object store %s: %w", endpoint, err)
	}
	prefix := strings.Trim(u.Path, "/")
	if prefix != "" {
		prefix += "/"
	}
	return &S3{client: client, trailing: trailing, bucket: u.Host, prefix: prefix}, nil
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

// Put uploads src as bucket/prefix/key with the file's SHA-256 in the object's metadata
// (x-amz-meta-sha256), as a multipart upload of PartSize parts, PartThreads at a time,
// each part's SHA-256 sent as an aws-chunked trailer that the server checks. A server
// that refuses those trailers (BadDigest: versitygw 1.8 refuses the ones minio-go writes)
// gets the upload again at once without them, and every later Put of this store too: a
// file smaller than PartSize in one request, a larger one in PartSize parts, every request
// with its bytes' SHA-256 (x-amz-content-sha256, signed) and MD5 (Content-MD5), which the
// server checks, and a multipart upload's ETag must be the one its parts give. The
// trailers are kept where they are taken because they cost half: the plain requests hash
// each part before sending it, and the server checks two digests (BenchmarkPut, 64 MiB to
// MinIO on 2 cores: 219 MB/s with trailers, 117 MB/s without). After the upload Put reads
// the object's attributes back and fails with ErrIntegrity unless size and digest match.
// While the endpoint is down it retries the whole upload with exponential backoff for up
// to RetryFor.
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
	object := s.prefix + obj.Key
	opts := minio.PutObjectOptions{UserMetadata: map[string]string{"sha256": obj.SHA256}, ContentType: "application/octet-stream"}
	if !s.noTrailers.Load() {
		topts := opts
		topts.PartSize, topts.NumThreads, topts.Checksum = PartSize, PartThreads, minio.ChecksumSHA256
		_, err := s.trailing.PutObject(ctx, s.bucket, object, f, obj.Size, topts)
		if minio.ToErrorResponse(err).Code != "BadDigest" {
			if err != nil {
				return err
			}
			return s.checkStored(ctx, obj, object)
		}
		// A digest mismatch is the server's reading of the trailers, or bytes changed on
		// the way: the plain requests below check the bytes again either way.
		s.noTrailers.Store(true)
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return err
		}
	}
	core := minio.Core{Client: s.client}
	if obj.Size < PartSize {
		data := make([]byte, obj.Size)
		if _, err := io.ReadFull(f, data); err != nil {
			return err
		}
		_, md5b64, shaHex := partSums(data)
		if _, err := core.PutObject(ctx, s.bucket, object, bytes.NewReader(data), obj.Size, md5b64, shaHex, opts); err != nil {
			return err
		}
	} else if err := s.putMultipart(ctx, core, object, f, obj.Size, opts); err != nil {
		return err
	}
	return s.checkStored(ctx, obj, object)
}

// checkStored reads the attributes of object back and fails with ErrIntegrity unless its
// size and recorded SHA-256 are obj's.
func (s *S3) checkStored(ctx context.Context, obj Object, object string) error {
	info, err := s.client.StatObject(ctx, s.bucket, object, minio.StatObjectOptions{})
	if err != nil {
		return err
	}
	if info.Size != obj.Size || info.UserMetadata["Sha256"] != obj.SHA256 {
		return fmt.Errorf("%w: stored %d bytes with sha256 %q, the file has %d bytes with sha256 %s",
			ErrIntegrity, info.Size, info.UserMetadata["Sha256"], obj.Size, obj.SHA256)
	}
	return nil
}

// putMultipart uploads the size bytes of f as object in PartSize parts, PartThreads at a
// time (each with its own PartSize buffer), and completes the upload if its ETag is the
// one the parts give (else ErrIntegrity); on any error it aborts the upload.
func (s *S3) putMultipart(ctx context.Context, core minio.Core, object string, f *os.File, size int64, opts minio.PutObjectOptions) error {
	uploadID, err := core.NewMultipartUpload(ctx, s.bucket, object, opts)
	if err != nil {
		return err
	}
	n := int((size + PartSize - 1) / PartSize)
	parts := make([]minio.CompletePart, n)
	md5s := make([][md5.Size]byte, n)
	g, gctx := errgroup.WithContext(ctx)
	next := make(chan int)
	for range min(PartThreads, n) {
		g.Go(func() error {
			buf := make([]byte, PartSize)
			for i := range next {
				off := int64(i) * PartSize
				data := buf[:min(PartSize, size-off)]
				if _, err := f.ReadAt(data, off); err != nil && !errors.Is(err, io.EOF) {
					return err
				}
				var md5b64, shaHex string
				md5s[i], md5b64, shaHex = partSums(data)
				up, err := core.PutObjectPart(gctx, s.bucket, object, uploadID, i+1, bytes.NewReader(data), int64(len(data)),
					minio.PutObjectPartOptions{Md5Base64: md5b64, Sha256Hex: shaHex})
				if err != nil {
					return fmt.Errorf("part %d: %w", i+1, err)
				}
				parts[i] = minio.CompletePart{PartNumber: i + 1, ETag: up.ETag}
			}
			return nil
		})
	}
	g.Go(func() error {
		defer close(next)
		for i := range n {
			select {
			case next <- i:
			case <-gctx.Done():
				return nil
			}
		}
		return nil
	})
	err = g.Wait()
	if err == nil {
		var info minio.UploadInfo
		info, err = core.CompleteMultipartUpload(ctx, s.bucket, object, uploadID, parts, minio.PutObjectOptions{})
		if err == nil {
			err = checkMultipartETag(info.ETag, md5s)
		}
	}
	if err != nil {
		actx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_ = core.AbortMultipartUpload(actx, s.bucket, object, uploadID)
		cancel()
	}
	return err
}

// partSums are data's MD5 (raw, and base64 for Content-MD5) and SHA-256 (hex, for
// x-amz-content-sha256).
func partSums(data []byte) (sum [md5.Size]byte, md5Base64, sha256Hex string) {
	sum = md5.Sum(data)
	h := sha256.Sum256(data)
	return sum, base64.StdEncoding.EncodeToString(sum[:]), hex.EncodeToString(h[:])
}

// checkMultipartETag returns ErrIntegrity unless etag is a multipart upload's ETag of
// parts with these MD5s: the MD5 of their MD5s, "-" and their number.
func checkMultipartETag(etag string, md5s [][md5.Size]byte) error {
	all := make([]byte, 0, len(md5s)*md5.Size)
	for _, m := range md5s {
		all = append(all, m[:]...)
	}
	want := fmt.Sprintf("%x-%d", md5.Sum(all), len(md5s))
	if strings.Trim(etag, `"`) != want {
		return fmt.Errorf("%w: object ETag %s, parts give %s", ErrIntegrity, etag, want)
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
