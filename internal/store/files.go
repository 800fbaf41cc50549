package store

import (
	"context"
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// Events is what Files tells of the changes it makes to the store: the workflow's file
// state (semantics.Engine on one node, transport.Peer across nodes; filestate.Events is
// the whole of what they take). Paths are cleaned volume paths. Files ignores their
// answers but Rename's: the bytes and names are in the store whatever the rules say.
type Events interface {
	Create(p string, dir bool) error
	Write(p string, off, n int64) error
	Truncate(p string, size int64) error
	Rename(oldPath, newPath string, size int64) error
	Remove(p string) error
}

// Sink receives the bytes Files wrote, after Events heard of them: the transport
// publishes them to other nodes (filestate.DataSink is the same interface). data is only
// valid during the call.
type Sink interface {
	Wrote(p string, off int64, data []byte)
}

// Files is the one way a writer changes the store: each method makes the whole of one
// change — the bytes or the name in the store, the byte accounting that holds the store
// to its limits, the events (Events) and the bytes to the sink (Sink) — so that none is
// made without the others. The FUSE views (streamfs), the direct views (directview), the
// stage-in of `sluice run` and the transport's materialiser write through it. Safe for
// concurrent use; it allocates nothing on a write that succeeds.
type Files struct {
	s    *Store
	ev   Events // nil: nothing is told (the materialiser applies its replica itself)
	sink Sink   // ev as a Sink, nil when it is not one
}

// Files returns the writer of s that tells ev (nil: nobody, for bytes and names the
// file state knows already) and, when ev is also a Sink, sends it the bytes.
func (s *Store) Files(ev Events) *Files {
	f := &Files{s: s, ev: ev}
	f.sink, _ = ev.(Sink)
	return f
}

// ReserveError is the error of a write Files refused before writing anything: the store
// could not reserve its bytes (Err wraps ErrNoSpace, naming the tier, or the context's
// error when it ended the wait for space). Nothing was written, nothing was told.
type ReserveError struct {
	// Err is why the bytes could not be reserved.
	Err error
}

// Error returns the reservation's error message.
func (e *ReserveError) Error() string { return e.Err.Error() }

// Unwrap returns the reservation's error.
func (e *ReserveError) Unwrap() error { return e.Err }

// WriteAt writes data at off of p, whose store file the caller has open as fd: it
// reserves the range (the bytes of it p has not allocated count against its tier's
// limit; the store may spill files to its disk tier, or wait up to its SpaceWait and at
// most until ctx is done, then fail with a *ReserveError), writes it with one pwrite(2),
// then tells Events (Write) and the sink (Wrote). It returns the bytes written. A pwrite
// that fails, or writes less than data (EIO: the rest would be missing), returns an
// *os.PathError naming p and tells nothing; the range stays reserved.
func (f *Files) WriteAt(ctx context.Context, p string, fd int, data []byte, off int64) (int, error) {
	if _, err := f.s.reserve(ctx, p, off, off+int64(len(data)), true); err != nil {
		return 0, &ReserveError{Err: err}
	}
	k, err := unix.Pwrite(fd, data, off)
	if err == nil && k < len(data) {
		err = unix.EIO
	}
	if err != nil {
		return max(k, 0), &os.PathError{Op: "write", Path: p, Err: err}
	}
	if f.ev != nil {
		_ = f.ev.Write(p, off, int64(k))
	}
	if f.sink != nil {
		f.sink.Wrote(p, off, data[:k])
	}
	return k, nil
}

// Create creates the regular file p for writing (O_CREAT|O_TRUNC, mode 0644: a file that
// exists is emptied), its accounting at 0 bytes, and tells Events (Create). A file that
// existed is a truncation to 0 bytes too (Truncate, after Create): the events may know
// bytes of it (a restarted direct view creates again the files an earlier one wrote), and
// those bytes are gone. Its directory must exist. The caller closes the file.
func (f *Files) Create(p string) (*os.File, error) {
	file, err := f.s.OpenFile(p, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY, 0o644)
	existed := errors.Is(err, os.ErrExist)
	if existed {
		file, err = f.s.OpenFile(p, unix.O_WRONLY|unix.O_TRUNC, 0)
	}
	if err != nil {
		return nil, err
	}
	f.s.resize(p, 0)
	if f.ev != nil {
		_ = f.ev.Create(p, false)
		if existed {
			_ = f.ev.Truncate(p, 0)
		}
	}
	return file, nil
}

// Open opens p as Store.Open does (flags and mode as open(2)'s). An open that truncates
// (O_TRUNC) is a truncation to 0 bytes: the accounting frees the file's bytes and Events
// hears of it (Truncate). The caller closes the descriptor.
func (f *Files) Open(p string, flags int, mode uint32) (int, error) {
	fd, err := f.s.Open(p, flags, mode)
	if err == nil && flags&unix.O_TRUNC != 0 {
		f.truncated(p, 0)
	}
	return fd, err
}

// Truncate sets the size of the regular file p to size bytes: through fd when the caller
// has p's store file open (fd >= 0), else by name. A file that shrinks frees what it had
// allocated past its new end; one that grows allocates nothing (the new bytes are a hole
// until written). Events hears of it (Truncate) once the store file has its size.
func (f *Files) Truncate(p string, fd int, size int64) error {
	var err error
	if fd >= 0 {
		if err = unix.Ftruncate(fd, size); err != nil {
			err = &os.PathError{Op: "truncate", Path: p, Err: err}
		}
	} else {
		err = f.s.truncate(p, size)
	}
	if err != nil {
		return err
	}
	f.truncated(p, size)
	return nil
}

// truncated records that p was truncated to size bytes: accounting, then Events.
func (f *Files) truncated(p string, size int64) {
	f.s.resize(p, size)
	if f.ev != nil {
		_ = f.ev.Truncate(p, size)
	}
}

// Rename renames oldP to newP with renameat2(2) flags (0, RENAME_NOREPLACE or
// RENAME_EXCHANGE), moving their accounting with the names, then tells Events that newP
// appeared with the size it has now (Rename). If the events refuse newP (no rule governs
// it, or it is committed), they hear that oldP was removed: it is gone from the store
// either way. RENAME_EXCHANGE swaps the two names' accounting and tells nothing: no event
// describes it (streamfs allows it for ungoverned names only). When the store refuses the
// rename, nothing changes and nothing is told. A directory's name takes with it the
// accounting of the files beneath it.
func (f *Files) Rename(oldP, newP string, flags uint) error {
	size, err := f.moveName(oldP, newP, flags)
	if err != nil {
		return err
	}
	if flags&unix.RENAME_EXCHANGE != 0 || f.ev == nil {
		return nil
	}
	if err := f.ev.Rename(oldP, newP, size); err != nil {
		_ = f.ev.Remove(oldP)
	}
	return nil
}

// moveName is Rename's change to the store: the name, then its accounting, one step for
// Store.Remove (Store.renameMu). It returns newP's size after the rename (0 when it
// cannot be read).
func (f *Files) moveName(oldP, newP string, flags uint) (int64, error) {
	f.s.renameMu.Lock()
	defer f.s.renameMu.Unlock()
	if err := f.s.renameAt(oldP, newP, flags); err != nil {
		return 0, err
	}
	if f.s.renamed != nil {
		f.s.renamed()
	}
	st, err := f.s.Lstat(newP)
	if err != nil {
		st.Size = 0
	}
	dir := err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR
	if flags&unix.RENAME_EXCHANGE != 0 {
		if !dir {
			old, err := f.s.Lstat(oldP)
			dir = err == nil && old.Mode&unix.S_IFMT == unix.S_IFDIR
		}
		f.s.exchangeAccounting(oldP, newP, dir)
		return st.Size, nil
	}
	if dir {
		f.s.moveTreeAccounting(oldP, newP)
	} else {
		f.s.moveAccounting(oldP, newP)
	}
	return st.Size, nil
}

// Remove unlinks the file (or symlink) p from the store, stops counting its bytes and
// tells Events (Remove). When the store cannot unlink it, the error is returned and
// nothing is told; when it was gone already (an error wrapping os.ErrNotExist) its
// accounting is dropped all the same (Store.Remove), never that of a file a rename has
// just moved away from p.
func (f *Files) Remove(p string) error {
	if _, err := f.s.Remove(p); err != nil {
		return err
	}
	if f.ev != nil {
		_ = f.ev.Remove(p)
	}
	return nil
}

// Forget records that the file p is gone for its writer although Remove could not unlink
// it from the store (it was gone already, or the store refused): the store stops counting
// it and Events hears that it was removed (Remove), so that no rule waits on, or commits,
// a file its writer deleted. A store file still there is nobody's from then on.
func (f *Files) Forget(p string) {
	f.s.renameMu.RLock() // as Store.Remove: not what a rename is moving
	f.s.forget(p)
	f.s.renameMu.RUnlock()
	if f.ev != nil {
		_ = f.ev.Remove(p)
	}
}

// LinkFd gives the file open as fd, which has no name in the store (an O_TMPFILE file)
// and is counted under key, the name p (Store.LinkFd), its accounting with it. Events
// hears nothing: the file is not p's until the caller says it appeared.
func (f *Files) LinkFd(fd int, key, p string) error {
	if err := f.s.LinkFd(fd, p); err != nil {
		return err
	}
	f.s.moveAccounting(key, p)
	return nil
}

// Drop stops counting the bytes of key, a file that left the store without ever having a
// name (an O_TMPFILE file never linked: its bytes are freed with its last descriptor).
func (f *Files) Drop(key string) { f.s.forget(key) }

// Recount counts what the store file of p open as fd holds, for bytes written to it
// without a reservation: a passthrough write, which the kernel makes by itself and no
// rule sees (see Store.recount).
func (f *Files) Recount(p string, fd int) error { return f.s.recount(p, fd) }
