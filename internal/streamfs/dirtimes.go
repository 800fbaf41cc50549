package streamfs

import (
	"sync"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// dirTimes keeps a governed directory's times and size as a consumer's view first showed
// them, for as long as the view runs. A governed directory gets entries while consumers
// read it (its listing streams, and ends at its commit), and its modification and change
// times and its size move with each entry: GNU tar, which compares a directory's change
// time and size before and after reading it, archived the whole tree of a Directory
// output and exited 1 ("file changed as we read it") when the producer took longer than
// the kernel's attribute cache of the directory (a second) between entries. A consumer's
// view therefore shows, for each governed directory (a Directory output, or a
// subdirectory in one), the times and size it showed first, with the change time equal
// to the modification time (as for a committed file); its entries, link count, mode and
// owner stay the directory's own. A directory made again (another inode) starts afresh.
type dirTimes struct {
	mu    sync.Mutex
	shown map[dirKey]dirShown
}

// dirKey is a directory by volume path and store inode.
type dirKey struct {
	path string
	ino  uint64
}

// dirShown is what dirTimes keeps of a directory.
type dirShown struct {
	mtime     uint64
	mtimensec uint32
	size      uint64
}

// stable replaces out's times and size, the attributes of directory p (store inode ino),
// with those shown first.
func (d *dirTimes) stable(p string, ino uint64, out *fuse.Attr) {
	d.mu.Lock()
	defer d.mu.Unlock()
	k := dirKey{path: p, ino: ino}
	s, ok := d.shown[k]
	if !ok {
		if d.shown == nil {
			d.shown = map[dirKey]dirShown{}
		}
		s = dirShown{mtime: out.Mtime, mtimensec: out.Mtimensec, size: out.Size}
		d.shown[k] = s
	}
	out.Mtime, out.Mtimensec, out.Size = s.mtime, s.mtimensec, s.size
	out.Ctime, out.Ctimensec = s.mtime, s.mtimensec
}
