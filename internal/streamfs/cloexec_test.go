package streamfs

import (
	"os"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// TestCloseOnExecWhileAnotherViewCloses marks the process's /dev/fuse descriptors while
// others are opened and closed beside it, as when one view of a multi-node run unmounts
// while another mounts: a descriptor gone between the listing and the mark is not an
// error (a run once failed with "setting close-on-exec on /dev/fuse descriptor 20: bad
// file descriptor").
func TestCloseOnExecWhileAnotherViewCloses(t *testing.T) {
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("no /dev/fuse: %v", err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			fd, err := unix.Open("/dev/fuse", unix.O_RDWR, 0)
			if err != nil {
				t.Errorf("opening /dev/fuse: %v", err)
				return
			}
			_ = unix.Close(fd)
		}
	}()
	defer func() { close(stop); wg.Wait() }()
	for i := 0; i < 3000; i++ {
		if err := closeOnExecFUSE(); err != nil {
			t.Fatalf("pass %d: %v", i, err)
		}
	}
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR, 0)
	if err != nil {
		t.Fatalf("opening /dev/fuse: %v", err)
	}
	defer unix.Close(fd)
	if err := closeOnExecFUSE(); err != nil {
		t.Fatal(err)
	}
	flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	if err != nil {
		t.Fatal(err)
	}
	if flags&unix.FD_CLOEXEC == 0 {
		t.Fatalf("descriptor %d of /dev/fuse is not close-on-exec", fd)
	}
}
