// Package handoff is how the CSI node plugin hands a pod's mounted /dev/fuse descriptor
// to the pod's sidecar: over a unix socket in a directory only that pod's sidecar sees,
// one JSON line per request, the descriptor attached to the reply with SCM_RIGHTS.
//
// The plugin mounts the FUSE filesystem at NodePublishVolume, before any container of the
// pod starts, and keeps a duplicate of the descriptor for as long as the volume is
// published: the mount never loses its server (no ENOTCONN for the app), and a restarted
// sidecar gets the same descriptor again. The kernel sends the FUSE INIT request only
// once per mount; the first sidecar reads it and gives its bytes to the plugin to keep,
// so that every later sidecar of the pod can set up its FUSE server from them.
package handoff

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// SocketName is the socket's file name in the pod's control directory.
const SocketName = "sluice.sock"

// DirectDir returns the directory of a pod's direct-mode volume inside its workflow's
// directory (the node store's parent): what the CSI node plugin bind-mounts for the app
// containers, and where the sidecar finds it under its own view of the workflow
// directory. podUID is the pod's UID.
func DirectDir(workflowDir, podUID string) string {
	return filepath.Join(workflowDir, "direct", podUID)
}

// Ops a sidecar sends.
const (
	// OpAttach asks for the volume's descriptor and what is known of it.
	OpAttach = "attach"
	// OpInit gives the plugin the INIT request read from a fresh descriptor, to keep.
	OpInit = "init"
)

// MaxRequest is the longest request line the plugin reads from a sidecar, in bytes.
const MaxRequest = 1 << 20

// Request is what a sidecar sends.
type Request struct {
	// Op is OpAttach or OpInit.
	Op string `json:"op"`
	// Init is the raw FUSE INIT request (OpInit).
	Init []byte `json:"init,omitempty"`
}

// Volume is what the plugin knows of the pod's streaming volume, from the volume's
// attributes and the pod information the kubelet passed to NodePublishVolume.
type Volume struct {
	// Namespace and Pod name the pod; PodUID is its UID.
	Namespace string `json:"namespace"`
	Pod       string `json:"pod"`
	PodUID    string `json:"podUID"`
	// Workflow, Step and Instance are the step instance the pod runs.
	Workflow string `json:"workflow"`
	Step     string `json:"step"`
	Instance int    `json:"instance"`
	// Mode is "fuse" or "direct".
	Mode string `json:"mode"`
	// Node is the Kubernetes node.
	Node string `json:"node"`
	// WorkflowUID is the UID of the Workflow the plugin found in the API server when it
	// published the volume (empty when it publishes without checking the API).
	WorkflowUID string `json:"workflowUID,omitempty"`
	// MemoryLimit is the most bytes the workflow's node store may hold in its memory tier
	// on this node: the part of the workflow's tmpfs the plugin leaves to the store (0: the
	// plugin mounted none; spec.volume.sizeLimit alone bounds it). The sidecar's store
	// waits for space and spills at it, before the kernel refuses a write.
	MemoryLimit int64 `json:"memoryLimit,omitempty"`
	// DiskLimit is the most bytes the workflow's disk tier may hold on this node, the
	// installation's bound (0: none): the sidecar's store applies it when
	// spec.volume.disk.sizeLimit is unset or larger.
	DiskLimit int64 `json:"diskLimit,omitempty"`
}

// Reply is what the plugin answers.
type Reply struct {
	// Error is set when the request failed (for OpAttach: the volume is not published).
	Error string `json:"error,omitempty"`
	// Volume describes the volume (OpAttach).
	Volume *Volume `json:"volume,omitempty"`
	// Init is the INIT request kept from the first sidecar; empty when this sidecar is the
	// first and must read it from the descriptor (OpAttach).
	Init []byte `json:"init,omitempty"`
}

// Attached is what a sidecar gets.
type Attached struct {
	// Volume describes the pod's streaming volume.
	Volume Volume
	// FUSE is the mounted /dev/fuse descriptor (close-on-exec); nil in direct mode.
	FUSE *os.File
	// Init is the kept INIT request, or nil when this is the mount's first server.
	Init []byte
}

// Attach asks the plugin at socket for the pod's volume. It retries for up to wait while
// the socket does not answer or the volume is not published yet (the kubelet publishes
// volumes before it starts containers, so this is short), and returns the last error
// after that. It returns at once when ctx is done, with an error wrapping ctx's.
func Attach(ctx context.Context, socket string, wait time.Duration) (*Attached, error) {
	deadline := time.Now().Add(wait)
	backoff := 50 * time.Millisecond
	for {
		a, err := attachOnce(ctx, socket)
		if err == nil {
			return a, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("attaching to the CSI node plugin at %s: %w", socket, ctx.Err())
		}
		if time.Now().After(deadline) {
			return nil, err
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("attaching to the CSI node plugin at %s: %w (last attempt: %w)", socket, ctx.Err(), err)
		case <-t.C:
		}
		if backoff < time.Second {
			backoff *= 2
		}
	}
}

// attachOnce asks the plugin at socket for the pod's volume once; ctx being done closes
// the connection, ending a read the plugin does not answer.
func attachOnce(ctx context.Context, socket string) (*Attached, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, fmt.Errorf("connecting to the CSI node plugin at %s: %w", socket, err)
	}
	conn := c.(*net.UnixConn)
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	if err := writeJSON(conn, Request{Op: OpAttach}); err != nil {
		return nil, err
	}
	var rep Reply
	buf := make([]byte, 64<<10)
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := conn.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, fmt.Errorf("reading the CSI node plugin's reply: %w", err)
	}
	var fuseFile *os.File
	if oobn > 0 {
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return nil, fmt.Errorf("parsing the descriptor sent by the CSI node plugin: %w", err)
		}
		for _, m := range msgs {
			fds, err := unix.ParseUnixRights(&m)
			if err != nil {
				continue
			}
			for i, fd := range fds {
				unix.CloseOnExec(fd)
				if i == 0 && fuseFile == nil {
					fuseFile = os.NewFile(uintptr(fd), "/dev/fuse")
				} else {
					unix.Close(fd)
				}
			}
		}
	}
	line := buf[:n]
	for len(line) == 0 || line[len(line)-1] != '\n' {
		// The descriptor came with the first bytes; the rest of the line may follow.
		more, err := bufio.NewReader(conn).ReadBytes('\n')
		line = append(line, more...)
		if err != nil {
			break
		}
	}
	if err := json.Unmarshal(trimLine(line), &rep); err != nil {
		if fuseFile != nil {
			fuseFile.Close()
		}
		return nil, fmt.Errorf("decoding the CSI node plugin's reply: %w", err)
	}
	if rep.Error != "" || rep.Volume == nil {
		if fuseFile != nil {
			fuseFile.Close()
		}
		if rep.Error == "" {
			rep.Error = "no volume in reply"
		}
		return nil, fmt.Errorf("CSI node plugin: %s", rep.Error)
	}
	if rep.Volume.Mode != "direct" && fuseFile == nil {
		return nil, errors.New("CSI node plugin sent no /dev/fuse descriptor")
	}
	return &Attached{Volume: *rep.Volume, FUSE: fuseFile, Init: rep.Init}, nil
}

// SaveInit gives the plugin at socket the INIT request read from a fresh descriptor.
func SaveInit(socket string, init []byte) error {
	return request(socket, Request{Op: OpInit, Init: init})
}

// request sends req and returns the plugin's error, if any.
func request(socket string, req Request) error {
	conn, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		return fmt.Errorf("connecting to the CSI node plugin at %s: %w", socket, err)
	}
	defer conn.Close()
	if err := writeJSON(conn, req); err != nil {
		return err
	}
	line, err := bufio.NewReader(conn).ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("reading the CSI node plugin's reply: %w", err)
	}
	var rep Reply
	if err := json.Unmarshal(line, &rep); err != nil {
		return fmt.Errorf("decoding the CSI node plugin's reply: %w", err)
	}
	if rep.Error != "" {
		return fmt.Errorf("CSI node plugin: %s", rep.Error)
	}
	return nil
}

// Serve answers one connection: it reads one request and replies with what source
// says. source is called with the request; for OpAttach it returns the reply and the
// descriptor to attach (nil: none), which Serve closes once sent: source gives a
// duplicate of whatever it keeps.
func Serve(conn *net.UnixConn, source func(Request) (Reply, *os.File)) error {
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	line, err := bufio.NewReaderSize(io.LimitReader(conn, MaxRequest), 64<<10).ReadBytes('\n')
	if err != nil {
		if errors.Is(err, io.EOF) && len(line) == MaxRequest {
			_ = writeJSON(conn, Reply{Error: fmt.Sprintf("request longer than %d bytes", MaxRequest)})
		}
		return fmt.Errorf("reading a sidecar's request: %w", err)
	}
	var req Request
	if err := json.Unmarshal(line, &req); err != nil {
		rep := Reply{Error: "malformed request: " + err.Error()}
		_ = writeJSON(conn, rep)
		return fmt.Errorf("decoding a sidecar's request: %w", err)
	}
	rep, f := source(req)
	if f != nil {
		defer f.Close()
	}
	b, err := json.Marshal(rep)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	var oob []byte
	if f != nil {
		oob = unix.UnixRights(int(f.Fd()))
	}
	if _, _, err := conn.WriteMsgUnix(b, oob, nil); err != nil {
		return fmt.Errorf("replying to a sidecar: %w", err)
	}
	return nil
}

// Refuse answers conn with error reason, without reading its request, and closes it.
// The write is bounded by a short deadline, so a peer that reads nothing cannot hold
// the caller.
func Refuse(conn *net.UnixConn, reason string) {
	defer conn.Close()
	_ = conn.SetWriteDeadline(time.Now().Add(time.Second))
	_ = writeJSON(conn, Reply{Error: reason})
}

func writeJSON(conn *net.UnixConn, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if _, err := conn.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("writing to the CSI node plugin: %w", err)
	}
	return nil
}

func trimLine(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}
