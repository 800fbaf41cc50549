package streamfs

import (
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// openNames is what a view knows of the names of its open handles, so that a rename
// carries them along: a file renamed while it is open (log rotation, `mv` of a file a
// program still writes, a journal renamed into place) is written, closed and read under
// its new name, as on a local file system. Were the handle to keep the name it was opened
// by, its writes would be counted and told under a name that no longer exists: the bytes
// would stay counted after the file is removed, and the rules would see a phantom file,
// complete under a name that holds none of its bytes.
//
// Renames hold ns, the view's namespace lock; an open holds it shared from the path it
// opens to its handle's registration, so that a handle is never registered under a name
// a rename has just moved. A rename also waits for the writes in flight through the
// handles it moves (handle.moving), and holds new ones back until their names are moved.
type openNames struct {
	ns sync.RWMutex
	mu sync.Mutex                      // guards at
	at map[string]map[*handle]struct{} // the open handles of each name
}

// register records h, opened as p, under p. Call it with ns held (shared).
func (o *openNames) register(h *handle, p string) {
	h.at.Store(&p)
	o.mu.Lock()
	defer o.mu.Unlock()
	o.addLocked(p, h)
}

// unregister forgets h, released, under the name it has now. Call it with h.moving held
// (shared): its name cannot change meanwhile.
func (o *openNames) unregister(h *handle) {
	p := h.path()
	o.mu.Lock()
	defer o.mu.Unlock()
	o.removeLocked(p, h)
}

// addLocked records h under p, with o.mu held.
func (o *openNames) addLocked(p string, h *handle) {
	if o.at == nil {
		o.at = map[string]map[*handle]struct{}{}
	}
	hs := o.at[p]
	if hs == nil {
		hs = map[*handle]struct{}{}
		o.at[p] = hs
	}
	hs[h] = struct{}{}
}

// removeLocked forgets h under p, with o.mu held.
func (o *openNames) removeLocked(p string, h *handle) {
	if hs := o.at[p]; hs != nil {
		delete(hs, h)
		if len(hs) == 0 {
			delete(o.at, p)
		}
	}
}

// beneath returns the handles open under p and, p being a directory, beneath it.
func (o *openNames) beneath(p string) []*handle {
	o.mu.Lock()
	defer o.mu.Unlock()
	var hs []*handle
	prefix := p + "/"
	for name, set := range o.at {
		if name == p || strings.HasPrefix(name, prefix) {
			for h := range set {
				hs = append(hs, h)
			}
		}
	}
	return hs
}

// move gives the handles hs, open under from or beneath it, the same names under to.
func (o *openNames) move(hs []*handle, from, to string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, h := range hs {
		old := h.path()
		np := to + old[len(from):]
		o.removeLocked(old, h)
		o.addLocked(np, h)
		h.at.Store(&np)
	}
}

// rename renames oldP to newP in the store (store.Files.Rename, with renameat2(2) flags)
// and carries the view's open handles along: those of oldP and of every file beneath it
// take the new names, and with RENAME_EXCHANGE those of newP take the old. The writes in
// flight through them end first, and new ones wait until the names are moved, so that no
// byte is counted or told under a name the file no longer has.
func (v *View) rename(oldP, newP string, flags uint) error {
	o := &v.names
	o.ns.Lock()
	defer o.ns.Unlock()
	moved := o.beneath(oldP)
	var swapped []*handle
	if flags&unix.RENAME_EXCHANGE != 0 {
		swapped = o.beneath(newP)
	}
	for _, hs := range [][]*handle{moved, swapped} {
		for _, h := range hs {
			h.moving.Lock()
			defer h.moving.Unlock()
		}
	}
	if err := v.files.Rename(oldP, newP, flags); err != nil {
		return err
	}
	o.move(moved, oldP, newP)
	o.move(swapped, newP, oldP)
	return nil
}
