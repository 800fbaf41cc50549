package wfmeta

import (
	"encoding/hex"
	"time"
)

// LostFile records that a committed file's bytes went with a lost node (docs/kubernetes.md,
// "Losing a node"), in the workflow's KV bucket (key "lost.<hex of the path>"), written
// by the controller: every node that held the file's bytes as written there was lost, the
// file was not replicated through the stream (`replicate: Stream`) and no permanent copy
// of it was stored. A file once recorded lost stays lost for the workflow.
type LostFile struct {
	Path   string    `json:"path"`   // volume path
	Node   string    `json:"node"`   // the lost node that held its bytes
	Reason string    `json:"reason"` // why the node counts as lost
	At     time.Time `json:"at"`     // when the controller recorded it
}

// LostKey is the KV key of the record that file p was lost.
func LostKey(p string) string { return "lost." + hex.EncodeToString([]byte(p)) }
