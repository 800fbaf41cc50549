package takeover

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// opInit is the opcode of the FUSE INIT request (linux/fuse.h FUSE_INIT).
const opInit = 26

// notifyResend is FUSE_NOTIFY_RESEND (linux/fuse.h, protocol 7.40, Linux 6.9): the kernel
// puts every request a server read but did not answer back in the queue, to be read again.
const notifyResend = 7

// fuseInHeaderSize is sizeof(struct fuse_in_header): len, opcode, unique, nodeid, uid,
// gid, pid, total_extlen+padding.
const fuseInHeaderSize = 40

// readInit reads the INIT request the kernel sends first on a freshly mounted /dev/fuse
// descriptor and returns its raw bytes (header and body). It fails if the first request
// is not INIT: the descriptor was served before, and its INIT must come from whoever
// kept it.
func readInit(dev *os.File) ([]byte, error) {
	buf := make([]byte, 1<<20+64<<10) // at least the kernel's minimum read buffer
	for {
		n, err := unix.Read(int(dev.Fd()), buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading the FUSE INIT request: %w", err)
		}
		if n < fuseInHeaderSize {
			return nil, fmt.Errorf("reading the FUSE INIT request: %d bytes", n)
		}
		if op := binary.LittleEndian.Uint32(buf[4:8]); op != opInit {
			return nil, fmt.Errorf("the first FUSE request is opcode %d, not INIT: the descriptor was served before", op)
		}
		return append([]byte(nil), buf[:n]...), nil
	}
}

// newServerOnFD sets up a go-fuse server on an already mounted /dev/fuse descriptor dev
// whose INIT request is init. go-fuse answers INIT synchronously while it sets up, from
// the descriptor it is given, and keeps the negotiated settings it needs to parse every
// later request. So it is given a socket that holds init; once set up, the socket's
// descriptor number is made to refer to dev (dup3), before the server reads anything
// else. When forward is true the kernel has not had its answer yet (this is the mount's
// first server) and go-fuse's answer is passed on to it; otherwise the kernel negotiated
// with an earlier server, of the same code and options, and the answer is dropped.
//
// The caller starts server.Serve.
func newServerOnFD(raw fuse.RawFileSystem, dev *os.File, init []byte, forward bool, opts fuse.MountOptions) (*fuse.Server, error) {
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socketpair: %w", err)
	}
	ours, theirs := pair[0], pair[1]
	defer unix.Close(ours)
	if _, err := unix.Write(ours, init); err != nil {
		unix.Close(theirs)
		return nil, fmt.Errorf("queueing the FUSE INIT request: %w", err)
	}
	opts.DirectMount = false // the magic /dev/fd/N mountpoint: nothing to mount
	server, err := fuse.NewServer(raw, "/dev/fd/"+strconv.Itoa(theirs), &opts)
	if err != nil {
		unix.Close(theirs)
		return nil, fmt.Errorf("starting the FUSE server on the handed-over descriptor: %w", err)
	}
	reply := make([]byte, 64<<10)
	n, err := unix.Read(ours, reply)
	if err != nil {
		return nil, fmt.Errorf("reading the FUSE INIT answer: %w", err)
	}
	if forward {
		if _, err := unix.Write(int(dev.Fd()), reply[:n]); err != nil {
			return nil, fmt.Errorf("answering the kernel's FUSE INIT: %w", err)
		}
	}
	// From here on the server reads and answers the real device.
	if err := unix.Dup3(int(dev.Fd()), theirs, unix.O_CLOEXEC); err != nil {
		return nil, fmt.Errorf("switching the FUSE server to the device: %w", err)
	}
	if !forward {
		// The previous server may have died holding requests (a reader parked in read()):
		// have the kernel send them again, to this server.
		if err := resend(dev); err != nil {
			return nil, err
		}
	}
	return server, nil
}

// resend asks the kernel to queue again the requests read but not answered on dev.
func resend(dev *os.File) error {
	var hdr [16]byte // struct fuse_out_header: len, error (the notify code), unique (0)
	binary.LittleEndian.PutUint32(hdr[0:4], uint32(len(hdr)))
	binary.LittleEndian.PutUint32(hdr[4:8], notifyResend)
	if _, err := unix.Write(int(dev.Fd()), hdr[:]); err != nil {
		return fmt.Errorf("asking the kernel to resend unanswered FUSE requests (needs Linux 6.9): %w", err)
	}
	return nil
}
