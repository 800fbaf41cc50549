// Package podconfig is what the controller gives a workflow's sidecars: one Secret per
// workflow, in the workflow's namespace, mounted read-only into every sidecar of the
// workflow. It holds the workflow's spec, the NATS credentials limited to the workflow's
// subjects, the object storage that receives permanent outputs and, when the
// installation's servers serve TLS, the CA certificate that verifies them.
package podconfig

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/objstore"
	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/store"
	"github.com/sluice-io/sluice/internal/trust"
)

// SecretName is the name of workflow wf's Secret.
func SecretName(wf string) string { return "sluice-" + wf }

// Storage is where permanent outputs go.
type Storage struct {
	// Endpoint is host:port of the S3 endpoint.
	Endpoint string `json:"endpoint"`
	// Secure says whether to use TLS.
	Secure bool `json:"secure,omitempty"`
	// Bucket and Prefix locate the objects: s3://Bucket/Prefix<path>.
	Bucket string `json:"bucket"`
	Prefix string `json:"prefix,omitempty"`
	// AccessKey and SecretKey are the S3 credentials.
	AccessKey string `json:"accessKey"`
	SecretKey string `json:"secretKey"`
}

// Config is the content of the Secret.
type Config struct {
	// Workflow is the workflow.
	Workflow *v1alpha1.Workflow
	// NATSURL, NATSCreds and NATSInbox are the NATS connection (see the keys).
	NATSURL   string
	NATSCreds []byte
	NATSInbox string
	// Storage is the object storage of permanent outputs; nil if none is configured.
	Storage *Storage
	// CA is the installation's CA certificate (PEM) its NATS and object storage serve TLS
	// with (trust.Config); empty when they do not.
	CA []byte
}

// Data returns the Secret's data.
func (c *Config) Data() (map[string][]byte, error) {
	wf, err := yaml.Marshal(c.Workflow)
	if err != nil {
		return nil, fmt.Errorf("encoding the workflow: %w", err)
	}
	data := map[string][]byte{
		v1alpha1.SecretKeyWorkflow:  wf,
		v1alpha1.SecretKeyNATSURL:   []byte(c.NATSURL),
		v1alpha1.SecretKeyNATSCreds: c.NATSCreds,
		v1alpha1.SecretKeyNATSInbox: []byte(c.NATSInbox),
	}
	if len(c.CA) > 0 {
		data[v1alpha1.SecretKeyInstallationCA] = c.CA
	}
	if c.Storage != nil {
		b, err := json.Marshal(c.Storage)
		if err != nil {
			return nil, err
		}
		data[v1alpha1.SecretKeyStorage] = b
	}
	return data, nil
}

// Load reads the Secret as mounted in dir. Errors name the file.
func Load(dir string) (*Config, error) {
	read := func(key string, required bool) ([]byte, error) {
		b, err := os.ReadFile(filepath.Join(dir, key))
		if errors.Is(err, os.ErrNotExist) && !required {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("sidecar configuration: %w", err)
		}
		return b, nil
	}
	c := &Config{}
	b, err := read(v1alpha1.SecretKeyWorkflow, true)
	if err != nil {
		return nil, err
	}
	c.Workflow = &v1alpha1.Workflow{}
	if err := yaml.Unmarshal(b, c.Workflow); err != nil {
		return nil, fmt.Errorf("sidecar configuration %s: %w", filepath.Join(dir, v1alpha1.SecretKeyWorkflow), err)
	}
	if b, err = read(v1alpha1.SecretKeyNATSURL, true); err != nil {
		return nil, err
	}
	c.NATSURL = strings.TrimSpace(string(b))
	if c.NATSCreds, err = read(v1alpha1.SecretKeyNATSCreds, false); err != nil {
		return nil, err
	}
	if b, err = read(v1alpha1.SecretKeyNATSInbox, false); err != nil {
		return nil, err
	}
	c.NATSInbox = strings.TrimSpace(string(b))
	if c.CA, err = read(v1alpha1.SecretKeyInstallationCA, false); err != nil {
		return nil, err
	}
	if len(c.CA) > trust.MaxCA {
		return nil, fmt.Errorf("sidecar configuration %s: %d bytes, more than %d", filepath.Join(dir, v1alpha1.SecretKeyInstallationCA), len(c.CA), trust.MaxCA)
	}
	if b, err = read(v1alpha1.SecretKeyStorage, false); err != nil {
		return nil, err
	}
	if b != nil {
		c.Storage = &Storage{}
		if err := json.Unmarshal(b, c.Storage); err != nil {
			return nil, fmt.Errorf("sidecar configuration %s: %w", filepath.Join(dir, v1alpha1.SecretKeyStorage), err)
		}
	}
	return c, nil
}

// StoreOptions are the options of workflow wf's node store on a node: its memory tier
// bounded by spec.volume.sizeLimit (bytes; none when unset), and, when spec.tiers.fs lists
// files (rules.HasDiskTier) or spec.volume.disk is set, its disk tier in the directory
// disk, bounded by spec.volume.disk.sizeLimit. A write beyond a limit waits up to wait for
// space. See Spillable for what may move to the disk tier.
func StoreOptions(wf *v1alpha1.Workflow, rules *semantics.RuleSet, wait time.Duration, disk string) store.Options {
	opts := store.Options{SpaceWait: wait}
	if q := wf.Spec.Volume.SizeLimit; q != nil {
		opts.Limit = q.Value()
	}
	if rules.HasDiskTier() || wf.Spec.Volume.Disk != nil {
		opts.Disk, opts.OnDisk = disk, rules.OnDisk
		if d := wf.Spec.Volume.Disk; d != nil && d.SizeLimit != nil {
			opts.DiskLimit = d.SizeLimit.Value()
		}
	}
	return opts
}

// Spillable is what may move from a node store's memory tier to its disk tier when the
// memory tier is full (store.Store.SetSpillable): a committed file that a rule governs and
// spec.tiers.memory does not pin. Its bytes never change any more, so a move is a copy.
func Spillable(e *semantics.Engine, rules *semantics.RuleSet) func(rel string) bool {
	return func(rel string) bool {
		st := e.Status(rel)
		return st.Governed() && st.Committed && !st.IsDir && !rules.PinnedToMemory(rel)
	}
}

// SpillWritten is what may live in a node store's disk tier while it is being written
// (store.Store.SetSpillWritten): a file that a rule governs and spec.tiers.memory does not
// pin. It is created there while the memory tier's uncommitted files take half its limit,
// and moved there, when the memory tier is full, while no descriptor has it open.
func SpillWritten(rules *semantics.RuleSet) func(rel string) bool {
	return func(rel string) bool {
		return rules.Resolve(rel).Governed() && !rules.PinnedToMemory(rel)
	}
}

// Open returns the object store st names (s3://Bucket/Prefix at Endpoint, with its keys),
// trusting the installation's CA ca (PEM; empty: the system's roots only) when it serves
// TLS. Errors are objstore.Open's.
func (st *Storage) Open(ctx context.Context, ca []byte) (*objstore.S3, error) {
	u := url.URL{Scheme: "s3", Host: st.Bucket, Path: "/" + st.Prefix}
	q := url.Values{"endpoint": {st.Endpoint}}
	if st.Secure {
		q.Set("secure", "true")
	}
	u.RawQuery = q.Encode()
	creds := objstore.Credentials{AccessKey: st.AccessKey, SecretKey: st.SecretKey}
	if st.Secure {
		creds.CA = ca
	}
	obj, err := objstore.Open(ctx, u.String(), creds)
	if err != nil {
		return nil, err
	}
	s3, ok := obj.(*objstore.S3)
	if !ok {
		return nil, fmt.Errorf("object storage %s: not an S3 store", u.Redacted())
	}
	return s3, nil
}

// FromSecret reads the object storage and the installation's CA of a workflow's
// configuration Secret's data (Data); nil storage when it configures none. Errors name
// the key.
func FromSecret(data map[string][]byte) (*Storage, []byte, error) {
	b, ok := data[v1alpha1.SecretKeyStorage]
	if !ok {
		return nil, nil, nil
	}
	st := &Storage{}
	if err := json.Unmarshal(b, st); err != nil {
		return nil, nil, fmt.Errorf("configuration Secret key %s: %w", v1alpha1.SecretKeyStorage, err)
	}
	return st, data[v1alpha1.SecretKeyInstallationCA], nil
}
