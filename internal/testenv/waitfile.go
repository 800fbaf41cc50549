package testenv

import (
	"bytes"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// WaitFile waits until the file at path holds exactly want, or timeout passes, woken by
// inotify on the deepest existing directory above path (creations, renames, writes,
// attribute changes) instead of polling. It returns the last content read and error.
// It is for plain directories (a direct volume, a store); FUSE views send no inotify
// events for other views' changes.
func WaitFile(path string, want []byte, timeout time.Duration) ([]byte, error) {
	got, err := os.ReadFile(path)
	if err == nil && bytes.Equal(got, want) {
		return got, nil
	}
	fd, ierr := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if ierr != nil {
		return got, ierr
	}
	defer unix.Close(fd)
	const mask = unix.IN_CREATE | unix.IN_MOVED_TO | unix.IN_CLOSE_WRITE | unix.IN_MODIFY | unix.IN_ATTRIB
	deadline := time.Now().Add(timeout)
	buf := make([]byte, 64<<10)
	for {
		// Watch the file's directory, or the nearest ancestor that exists so far: its
		// next entry wakes the loop, which then watches one level deeper. Adding a watch
		// of a directory already watched changes nothing.
		for dir := filepath.Dir(path); ; dir = filepath.Dir(dir) {
			if _, werr := unix.InotifyAddWatch(fd, dir, mask); werr == nil || dir == "/" || dir == "." {
				break
			}
		}
		// Look again after the watch is in place, so a change in between is not missed.
		got, err = os.ReadFile(path)
		if err == nil && bytes.Equal(got, want) {
			return got, nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			return got, err
		}
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if _, perr := unix.Poll(pfd, int(left/time.Millisecond)+1); perr != nil && perr != unix.EINTR {
			return got, perr
		}
		for {
			if n, rerr := unix.Read(fd, buf); n <= 0 || rerr != nil {
				break
			}
		}
	}
}
