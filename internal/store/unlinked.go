package store

import (
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// A view may keep the kernel's registration of a committed store file after its last
// close, to give the next open the same backing file (FUSE passthrough); the kernel then
// holds the file, and its pages stay allocated after the store unlinks it. The store tells
// whoever keeps such references when a regular file leaves its name (removed, replaced by
// a rename, moved to the disk tier), so that they let it go and the tier's space is free
// when the store's accounting says so.

// unlinkHooks are the functions told of files leaving their names (OnUnlink).
type unlinkHooks struct {
	mu  sync.RWMutex
	fns []func(ino uint64)
}

// OnUnlink registers fn, called with the inode number (as Lstat reports it) of each
// regular file about to leave its name in the store: removed, replaced by a rename onto
// its name, or moved from the memory tier to the disk tier. fn must not call the store.
func (s *Store) OnUnlink(fn func(ino uint64)) {
	s.unlinked.mu.Lock()
	defer s.unlinked.mu.Unlock()
	s.unlinked.fns = append(s.unlinked.fns, fn)
}

// leaving tells the OnUnlink functions that rel, if it is a regular file of tier t, is
// about to leave its name there. It costs a stat only when someone listens.
func (s *Store) leaving(t *tier, rel string) {
	s.unlinked.mu.RLock()
	fns := s.unlinked.fns
	s.unlinked.mu.RUnlock()
	if len(fns) == 0 {
		return
	}
	var st unix.Stat_t
	err := s.atIn(t, "lstat", rel, func(dirfd int, name string) error {
		return unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	})
	if err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return
	}
	ino := st.Ino
	if t.disk {
		ino = diskIno(rel, ino)
	}
	for _, fn := range fns {
		fn(ino)
	}
}
