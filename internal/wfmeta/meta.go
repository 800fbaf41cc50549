package wfmeta

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// FileMeta is a committed file's metadata in the workflow's KV bucket (key
// "file.<hex of the path>"), written by the file's home node.
type FileMeta struct {
	Path   string `json:"path"`             // volume path
	Size   int64  `json:"size"`             // final size in bytes
	Closes int    `json:"closes"`           // closes counted at commit
	Home   string `json:"home"`             // the home node
	SHA256 string `json:"sha256,omitempty"` // hex digest of the committed bytes
	URI    string `json:"uri,omitempty"`    // where a permanent file was stored
	// Holders are the nodes (transport hosts) whose stores hold bytes of the file as
	// written there, sorted; a fetcher reaches a holder's peers on Names.Serve(holder).
	Holders []string `json:"holders,omitempty"`
}

// Termination is a step instance's exit in the KV bucket (key "term.<step>.<instance>").
type Termination struct {
	Step     string `json:"step"`     // the step
	Instance int    `json:"instance"` // 0-based instance
	Node     string `json:"node"`     // the node it ran on
	// Failed says how the instance failed, with no retries left; "" for a success.
	Failed string `json:"failed,omitempty"`
}

// FileKey is the KV key of a file's metadata.
func FileKey(p string) string { return "file." + hex.EncodeToString([]byte(p)) }

// TerminationKey is the KV key of the termination of instance (0-based) of step.
func TerminationKey(step string, instance int) string {
	return "term." + step + "." + strconv.Itoa(instance)
}

// AdoptKey is the KV key of the claim on file p by the peer that adopted it as its home
// node in place of a creator that departed; its value is the peer's name.
func AdoptKey(p string) string { return "adopt." + hex.EncodeToString([]byte(p)) }

// PodStats are the transport counters of one pod's peer, in the KV bucket (key
// "stats.<pod UID>"), written by its sidecar while it runs and when it drains.
type PodStats struct {
	Pod  string `json:"pod"`  // the pod's name
	Host string `json:"host"` // the node it runs on
	// BytesReceived are data bytes its peer applied from other hosts' peers: bytes that
	// crossed between nodes, counted once per receiving host (only a host's materialiser
	// receives them).
	BytesReceived int64 `json:"bytesReceived"`
	// MemoryBytes and DiskBytes are the bytes the pod's sidecar accounts in the node
	// store's memory and disk tiers now; SpilledBytes those it moved from memory to disk
	// and ReleasedBytes those of Consumed files it deleted, so far.
	MemoryBytes   int64 `json:"memoryBytes,omitempty"`
	DiskBytes     int64 `json:"diskBytes,omitempty"`
	SpilledBytes  int64 `json:"spilledBytes,omitempty"`
	ReleasedBytes int64 `json:"releasedBytes,omitempty"`
	// Waits are the pod's requests waiting on the rules now, oldest first.
	Waits []WaitStat `json:"waits,omitempty"`
	// Problems are the pod's recent failed waits and uploads, oldest first.
	Problems []PodProblem `json:"problems,omitempty"`
}

// WaitStat is one request waiting on the rules.
type WaitStat struct {
	// What names the request, the file and its rule, e.g.
	// `open of "late.txt" (OnClose:1, Update)`.
	What string `json:"what"`
	// Since is when it started waiting.
	Since time.Time `json:"since"`
}

// Problem kinds of PodProblem.
const (
	// ProblemWaitFailed: a wait on the rules ended in an error (timed out, or the file can
	// never be complete).
	ProblemWaitFailed = "WaitFailed"
	// ProblemUploadFailed: a permanent output could not be stored.
	ProblemUploadFailed = "UploadFailed"
)

// PodProblem is one failure in a pod the Workflow's Events report.
type PodProblem struct {
	Kind    string    `json:"kind"`    // ProblemWaitFailed or ProblemUploadFailed
	Message string    `json:"message"` // what failed and why
	At      time.Time `json:"at"`      // when
}

// StatsKey is the KV key of the stats of the pod whose metadata.uid is podUID.
func StatsKey(podUID string) string { return "stats." + podUID }

// Meta is what a workflow's KV bucket records.
type Meta struct {
	Files        []FileMeta         // committed files, recorded by their home node
	Terminations []Termination      // step instances that exited (successfully, on a cluster)
	Pods         []PodStats         // pods' transport counters (on a cluster)
	Reads        []Reads            // what each pod's app read (on a cluster)
	Withdrawals  []Withdrawal       // the last withdrawal of each withdrawn path
	Lost         []LostFile         // files whose bytes went with a lost node (on a cluster)
	Outcomes     map[string]Outcome // how each pod's app containers ended, by pod UID (on a cluster)
}

// Metadata reads everything recorded in the workflow's bucket. Entries that do not decode
// are skipped; errors are the bucket's, wrapped.
func Metadata(ctx context.Context, js jetstream.JetStream, names Names) (Meta, error) {
	var m Meta
	kv, err := js.KeyValue(ctx, names.Bucket)
	if err != nil {
		return m, fmt.Errorf("KV bucket %s: %w", names.Bucket, err)
	}
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		return m, fmt.Errorf("listing KV bucket %s: %w", names.Bucket, err)
	}
	for key := range lister.Keys() {
		e, err := kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return m, fmt.Errorf("reading %s in KV bucket %s: %w", key, names.Bucket, err)
		}
		prefix, _, _ := strings.Cut(key, ".")
		switch prefix {
		case "file":
			var f FileMeta
			if err := json.Unmarshal(e.Value(), &f); err == nil {
				m.Files = append(m.Files, f)
			}
		case "term":
			var t Termination
			if err := json.Unmarshal(e.Value(), &t); err == nil {
				m.Terminations = append(m.Terminations, t)
			}
		case "stats":
			var p PodStats
			if err := json.Unmarshal(e.Value(), &p); err == nil {
				m.Pods = append(m.Pods, p)
			}
		case "reads":
			var r Reads
			if err := json.Unmarshal(e.Value(), &r); err == nil {
				r.Revision = e.Revision()
				m.Reads = append(m.Reads, r)
			}
		case "withdrawn":
			var w Withdrawal
			if err := json.Unmarshal(e.Value(), &w); err == nil {
				w.Revision = e.Revision()
				m.Withdrawals = append(m.Withdrawals, w)
			}
		case "lost":
			var l LostFile
			if err := json.Unmarshal(e.Value(), &l); err == nil {
				m.Lost = append(m.Lost, l)
			}
		case "outcome":
			var o Outcome
			if err := json.Unmarshal(e.Value(), &o); err == nil {
				if m.Outcomes == nil {
					m.Outcomes = map[string]Outcome{}
				}
				m.Outcomes[strings.TrimPrefix(key, "outcome.")] = o
			}
		}
	}
	return m, nil
}
