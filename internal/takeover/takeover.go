// Package takeover lets a restarted sidecar take over the FUSE mount of its pod from the
// server before it, without the pod's programs noticing more than a stall.
//
// The CSI node plugin mounts the view and keeps the /dev/fuse descriptor (package
// handoff); each sidecar gets it handed over and serves it. The kernel sends its INIT
// request only once per mount: the first server reads it (and has it kept), later
// servers are set up from the kept bytes and ask the kernel to resend what the dead one
// read but did not answer (NewServer). The kernel still holds the node IDs and file
// handles of the earlier server: a resumer between the kernel and go-fuse's bridge
// revives those nodes by their store paths and reopens those handles. Node IDs of names
// not visible yet (placeholders, whose IDs are no store inode) are recorded in a node log
// that outlives the sidecar and replayed by the next server (NodeLog).
//
// Package streamfs uses it when it serves a handed-over descriptor (streamfs.Options.Device).
package takeover

import (
	"fmt"
	"os"

	"github.com/go-logr/logr"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// Files lists the files of a node store with their inode numbers, both tiers
// (*store.Store is one): what revives the nodes of an earlier server.
type Files interface {
	// WalkFiles calls fn with each file's inode number and its cleaned relative path.
	WalkFiles(fn func(ino uint64, rel string) error) error
}

// Options configure a server on a handed-over descriptor.
type Options struct {
	// Init is the descriptor's INIT request when an earlier server answered it already (a
	// restarted sidecar). Nil means the descriptor is fresh: its INIT is read from it and
	// given to SaveInit, to keep for the servers after this one, before it is answered.
	Init []byte
	// SaveInit keeps a fresh descriptor's INIT request (see Init); nil: not kept.
	SaveInit func(init []byte) error
	// Files are the store whose inode numbers are the view's node IDs
	// (fs.Options.ExternalNodeID).
	Files Files
	// Log receives what could not be taken over (a node or handle the kernel names that
	// cannot be revived, which then fails with EIO).
	Log logr.Logger
}

// NewServer sets up a go-fuse server of inner on the already mounted /dev/fuse descriptor
// dev, serving also the node IDs and file handles the kernel got from earlier servers of
// the mount (see the package comment). inner must use the store's inode numbers as node
// IDs and answer a LOOKUP of "." on the root by node ID for the placeholders in its node
// log (fs.NodeLookupNoder). READDIRPLUS is turned off in mo: its entries would carry node
// IDs the takeover does not see. The caller starts server.Serve.
func NewServer(inner fuse.RawFileSystem, dev *os.File, mo fuse.MountOptions, opts Options) (*fuse.Server, error) {
	if opts.Log.GetSink() == nil {
		opts.Log = logr.Discard()
	}
	init, forward := opts.Init, false
	if init == nil {
		var err error
		if init, err = readInit(dev); err != nil {
			return nil, err
		}
		if opts.SaveInit != nil {
			if err := opts.SaveInit(init); err != nil {
				return nil, fmt.Errorf("keeping the FUSE INIT request: %w", err)
			}
		}
		forward = true
	}
	// A later server must serve the node IDs and handles this one gives the kernel.
	paths := &inodePaths{files: opts.Files}
	raw := newResumer(inner, paths.lookup, opts.Log)
	mo.DisableReadDirPlus = true // its entries would carry node IDs the resumer does not see
	return newServerOnFD(raw, dev, init, forward, mo)
}
