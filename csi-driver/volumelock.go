package csidriver

import "sync"

// volumeLocks holds the IDs of the volumes with a NodePublishVolume or
// NodeUnpublishVolume in progress, as csi-driver-nfs keeps them: a second operation on
// one of them is answered Aborted at once (the kubelet retries it) rather than waiting
// behind the first, and operations on different volumes run side by side.
type volumeLocks struct {
	mu   sync.Mutex
	busy map[string]struct{}
}

// tryAcquire marks volume id busy and reports true, or reports false if it already is.
func (l *volumeLocks) tryAcquire(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.busy[id]; ok {
		return false
	}
	if l.busy == nil {
		l.busy = map[string]struct{}{}
	}
	l.busy[id] = struct{}{}
	return true
}

// release marks volume id free again.
func (l *volumeLocks) release(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.busy, id)
}
