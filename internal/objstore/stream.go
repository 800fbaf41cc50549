package objstore

import (
	"bytes"
	"context"
	"crypto/md5"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/minio/minio-go/v7"
)

// Growing is a local file still being written, read as its bytes become final.
type Growing interface {
	// Path is the local file holding the bytes.
	Path() string
	// Wait blocks until at least one byte at offset off is final (returns how many are,
	// contiguous from off) or off is the file's final size (eof).
	Wait(ctx context.Context, off int64) (n int64, eof bool, err error)
}

// Streamer is a Store that can upload a file while it is being written.
type Streamer interface {
	Store
	// PutGrowing stores src under key as its bytes become final and returns the object
	// once src reached its final size.
	PutGrowing(ctx context.Context, key string, src Growing) (Object, error)
}

// PutGrowing waits for the whole file, then stores it like Put (a local copy gains nothing
// from starting early).
func (d *Dir) PutGrowing(ctx context.Context, key string, src Growing) (Object, error) {
	if err := waitEOF(ctx, src); err != nil {
		return Object{}, fmt.Errorf("storing %s: %w", key, err)
	}
	return d.Put(ctx, key, src.Path())
}

func waitEOF(ctx context.Context, src Growing) error {
	var off int64
	for {
		n, eof, err := src.Wait(ctx, off)
		if err != nil {
			return err
		}
		if eof {
			return nil
		}
		off += n
	}
}

// PutGrowing uploads src as a multipart upload while it is written: each PartSize part is
// sent as soon as its bytes are final, with its MD5 and SHA-256 checked by the server, and
// retried with backoff while the endpoint is down; the upload completes at the file's
// final size. The completed object's ETag must equal the one computed from the parts
// (MD5 of the parts' MD5s), else ErrIntegrity. A file smaller than one part is stored with
// Put. The object carries no sha256 metadata (it is known only at the end); the returned
// Object has the SHA-256 of the bytes sent.
func (s *S3) PutGrowing(ctx context.Context, key string, src Growing) (Object, error) {
	if err := checkKey(key); err != nil {
		return Object{}, err
	}
	// Wait for a first full part; a file that ends before is uploaded in one piece.
	avail, eof, err := waitFor(ctx, src, 0, PartSize)
	if err != nil {
		return Object{}, fmt.Errorf("uploading %s: %w", key, err)
	}
	if eof && avail < PartSize {
		return s.Put(ctx, key, src.Path())
	}
	f, err := os.Open(src.Path())
	if err != nil {
		return Object{}, fmt.Errorf("uploading %s: %w", key, err)
	}
	defer f.Close()
	core := minio.Core{Client: s.client}
	object := s.prefix + key
	var uploadID string
	err = s.retry(ctx, func() error {
		var err error
		uploadID, err = core.NewMultipartUpload(ctx, s.bucket, object, minio.PutObjectOptions{ContentType: "application/octet-stream"})
		return err
	})
	if err != nil {
		return Object{}, fmt.Errorf("starting multipart upload of %s: %w", key, err)
	}
	obj, err := s.streamParts(ctx, core, object, uploadID, f, src)
	if err != nil {
		actx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_ = core.AbortMultipartUpload(actx, s.bucket, object, uploadID)
		cancel()
		return Object{}, fmt.Errorf("uploading %s to %s: %w", key, s.URI(key), err)
	}
	obj.Key, obj.URI = key, s.URI(key)
	return obj, nil
}

func (s *S3) streamParts(ctx context.Context, core minio.Core, object, uploadID string, f *os.File, src Growing) (Object, error) {
	full := sha256.New()
	var parts []minio.CompletePart
	var partMD5s [][md5.Size]byte
	buf := make([]byte, PartSize)
	var off int64
	for part := 1; ; part++ {
		avail, _, err := waitFor(ctx, src, off, PartSize)
		if err != nil {
			return Object{}, err
		}
		n := min(avail, PartSize)
		if n == 0 {
			break // the file ends at off
		}
		if _, err := f.ReadAt(buf[:n], off); err != nil && !errors.Is(err, io.EOF) {
			return Object{}, err
		}
		data := buf[:n]
		sum, md5b64, shaHex := partSums(data)
		var up minio.ObjectPart
		err = s.retry(ctx, func() error {
			var err error
			up, err = core.PutObjectPart(ctx, s.bucket, object, uploadID, part, bytes.NewReader(data), n,
				minio.PutObjectPartOptions{Md5Base64: md5b64, Sha256Hex: shaHex})
			return err
		})
		if err != nil {
			return Object{}, fmt.Errorf("part %d: %w", part, err)
		}
		full.Write(data)
		partMD5s = append(partMD5s, sum)
		parts = append(parts, minio.CompletePart{PartNumber: part, ETag: up.ETag})
		off += n
	}
	var info minio.UploadInfo
	err := s.retry(ctx, func() error {
		var err error
		info, err = core.CompleteMultipartUpload(ctx, s.bucket, object, uploadID, parts, minio.PutObjectOptions{})
		return err
	})
	if err != nil {
		return Object{}, fmt.Errorf("completing: %w", err)
	}
	if err := checkMultipartETag(info.ETag, partMD5s); err != nil {
		return Object{}, err
	}
	return Object{Size: off, SHA256: hex.EncodeToString(full.Sum(nil))}, nil
}

// waitFor waits until want bytes from off are final or the file ends; it returns how many
// are final from off.
func waitFor(ctx context.Context, src Growing, off, want int64) (int64, bool, error) {
	var got int64
	for got < want {
		n, eof, err := src.Wait(ctx, off+got)
		if err != nil {
			return got, false, err
		}
		if eof {
			return got, true, nil
		}
		got += n
	}
	return got, false, nil
}

// retry runs op until it succeeds, fails with an error that cannot go away (an unknown
// key can, with RetryUnknownKeys), or RetryFor passes, backing off exponentially, telling
// OnRetry of each error it retries.
func (s *S3) retry(ctx context.Context, op func() error) error {
	retryFor := s.RetryFor
	if retryFor <= 0 {
		retryFor = 5 * time.Minute
	}
	deadline := time.Now().Add(retryFor)
	backoff := 200 * time.Millisecond
	for {
		err := op()
		again := retryable(err) || s.RetryUnknownKeys && IsUnknownKey(err)
		if err == nil || ctx.Err() != nil || !again || time.Now().After(deadline) {
			return err
		}
		if s.OnRetry != nil {
			s.OnRetry(err)
		}
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return ctx.Err()
		}
		if backoff < 5*time.Second {
			backoff *= 2
		}
	}
}
