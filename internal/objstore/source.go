package objstore

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/minio/minio-go/v7"
)

// SourceObject is one object a stage-in source yields.
type SourceObject struct {
	// Rel is its path below the source ("" for a single-file source), "/" separated.
	Rel string
	// Size is its size in bytes.
	Size int64
	open func(ctx context.Context) (io.ReadCloser, error)
}

// Open opens the object for reading.
func (o SourceObject) Open(ctx context.Context) (io.ReadCloser, error) { return o.open(ctx) }

// ListSource lists what a stage-in source URL names: file:///path (a file, or every file
// under a directory) or s3://bucket/key (one object) and s3://bucket/prefix/ (every
// object under the prefix; also when dir is true). For S3 the endpoint is the URL's
// endpoint parameter, as for Open. Objects come sorted by Rel.
func ListSource(ctx context.Context, rawURL string, dir bool, creds Credentials) ([]SourceObject, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("source %q: %w", rawURL, err)
	}
	switch u.Scheme {
	case "file":
		return listFiles(u.Path)
	case "s3":
		st, err := openS3(ctx, &url.URL{Scheme: "s3", Host: u.Host, RawQuery: u.RawQuery}, creds)
		if err != nil {
			return nil, err
		}
		key := strings.TrimPrefix(u.Path, "/")
		return st.list(ctx, key, dir || strings.HasSuffix(key, "/") || key == "")
	}
	return nil, fmt.Errorf("source %q: scheme must be file or s3", rawURL)
}

func listFiles(root string) ([]SourceObject, error) {
	st, err := os.Stat(root)
	if err != nil {
		return nil, fmt.Errorf("source: %w", err)
	}
	opener := func(p string) func(context.Context) (io.ReadCloser, error) {
		return func(context.Context) (io.ReadCloser, error) { return os.Open(p) }
	}
	if !st.IsDir() {
		return []SourceObject{{Rel: "", Size: st.Size(), open: opener(root)}}, nil
	}
	var out []SourceObject
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		out = append(out, SourceObject{Rel: filepath.ToSlash(rel), Size: info.Size(), open: opener(p)})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("source %s: %w", root, err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Rel < out[j].Rel })
	return out, nil
}

func (s *S3) list(ctx context.Context, key string, prefix bool) ([]SourceObject, error) {
	opener := func(k string) func(context.Context) (io.ReadCloser, error) {
		return func(ctx context.Context) (io.ReadCloser, error) {
			return s.client.GetObject(ctx, s.bucket, k, minio.GetObjectOptions{})
		}
	}
	if !prefix {
		info, err := s.client.StatObject(ctx, s.bucket, key, minio.StatObjectOptions{})
		if err != nil {
			return nil, fmt.Errorf("source s3://%s/%s: %w", s.bucket, key, err)
		}
		return []SourceObject{{Rel: "", Size: info.Size, open: opener(key)}}, nil
	}
	if key != "" && !strings.HasSuffix(key, "/") {
		key += "/"
	}
	var out []SourceObject
	for obj := range s.client.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: key, Recursive: true}) {
		if obj.Err != nil {
			return nil, fmt.Errorf("listing s3://%s/%s: %w", s.bucket, key, obj.Err)
		}
		if strings.HasSuffix(obj.Key, "/") {
			continue
		}
		rel := strings.TrimPrefix(obj.Key, key)
		if checkKey(rel) != nil {
			return nil, fmt.Errorf("source s3://%s/%s: object key %q is not a safe path", s.bucket, key, obj.Key)
		}
		out = append(out, SourceObject{Rel: rel, Size: obj.Size, open: opener(obj.Key)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Rel < out[j].Rel })
	return out, nil
}
