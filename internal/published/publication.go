// Package published is the CSI node plugin's record that it published a volume of a
// workflow on the node: what the node's store server of the workflow starts from.
//
// The record lives in a directory of the workflow that no pod can write (the plugin's,
// csidriver.Driver.RecordDir), and holds only the workflow's UID as the plugin found it in
// the API when it published the pod. A store server (internal/storeserver) is started only
// for a workflow so recorded, and only while the API's Workflow has that UID; the plugin
// removes the record before it retires the workflow's directory, so no store server starts
// for what is being removed. The package is apart from the store server's so that the
// privileged plugin's code (csi-driver) does not link the store server's NATS data plane.
package published

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Dir is the directory, in a workflow's record directory on a node, where the plugin
// records a publication (Record), readable by root only.
const Dir = "published"

// UIDFile is the file of a record that holds the workflow's UID.
const UIDFile = "workflow.uid"

// maxUID bounds a recorded UID in bytes (a Kubernetes UID is 36).
const maxUID = 128

// Record records in dir/Dir (dir is created, mode 0700) that a volume of the workflow with
// UID uid was published on the node. It replaces an earlier record at once (a new
// directory renamed over the old one), so a store server's start never reads half of one.
// The CSI plugin calls it with a directory no pod can write. Errors name the directory; an
// empty UID or one of more than 128 bytes is refused.
func Record(dir, uid string) error {
	if uid == "" || len(uid) > maxUID {
		return fmt.Errorf("recording the publication: workflow UID %q", uid)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("recording the publication for the node's store server: %w", err)
	}
	dst := filepath.Join(dir, Dir)
	if b, err := os.ReadFile(filepath.Join(dst, UIDFile)); err == nil && string(b) == uid {
		return nil // recorded already (every publish of the workflow's pods records it)
	}
	tmp, err := os.MkdirTemp(dir, "."+Dir+"-")
	if err != nil {
		return fmt.Errorf("recording the publication for the node's store server: %w", err)
	}
	defer os.RemoveAll(tmp)
	if err := os.WriteFile(filepath.Join(tmp, UIDFile), []byte(uid), 0o600); err != nil {
		return fmt.Errorf("recording the publication for the node's store server: %w", err)
	}
	// rename(2) replaces an empty directory only: move the old record aside first.
	old := tmp + ".old"
	if err := os.Rename(dst, old); err == nil {
		defer os.RemoveAll(old)
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("replacing the record in %s: %w", dst, err)
	}
	if err := os.Rename(tmp, dst); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("recording the publication in %s: %w", dst, err)
	}
	return nil
}

// Load returns the workflow UID of the record in dir (its UIDFile), read bounded to 128
// bytes, without following a symbolic link; ok is false when there is none. Errors name
// the file.
func Load(dir string) (uid string, ok bool, err error) {
	f, err := os.OpenFile(filepath.Join(dir, UIDFile), os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if errors.Is(err, os.ErrNotExist) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("publication record: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxUID+1))
	if err != nil {
		return "", false, fmt.Errorf("publication record: reading %s: %w", f.Name(), err)
	}
	if len(b) > maxUID {
		return "", false, fmt.Errorf("publication record: %s is more than %d bytes", f.Name(), maxUID)
	}
	return string(b), true, nil
}
