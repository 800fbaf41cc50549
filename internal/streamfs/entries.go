package streamfs

import (
	"container/list"
	"sync"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// A view hands the kernel a node for every file it looks up or creates, and the kernel
// keeps it, with its name, for as long as the entry's timeout says (an hour for a
// committed file) and memory allows; go-fuse keeps its own record of each (about 500
// bytes) until the kernel forgets it. A workflow of a million small files would hold a
// million of them in each view. So a view bounds the regular files the kernel caches
// (Options.EntryBudget): past the budget, it asks the kernel to forget the least recently
// looked-up ones (FUSE_NOTIFY_PRUNE, Linux >= 6.17, in batches; else an entry
// invalidation each), as the kernel would under memory pressure. A forgotten file costs
// the next access of it a LOOKUP, nothing else: what a view answers does not depend on
// what the kernel caches. Directories are never pruned (their entries hold their
// children's).

// defaultEntryBudget is Options.EntryBudget's default.
const defaultEntryBudget = 8192

// pruneBatch is how many files a view asks the kernel to forget at once.
const pruneBatch = 256

// kernelEntry is a regular file the kernel holds a node for: its node ID (the store's
// inode number) and the entry it was looked up by.
type kernelEntry struct {
	id, parent uint64
	name       string
}

// kernelEntries is a view's least-recently-used list of the regular files the kernel was
// given, bounded by budget.
type kernelEntries struct {
	budget int

	mu   sync.Mutex
	lru  *list.List               // of kernelEntry, most recent first
	byID map[uint64]*list.Element // into lru
	// pruning is set while a batch is being sent; further batches wait for it.
	pruning bool
}

// newKernelEntries returns the list for a budget (0: defaultEntryBudget; negative: no
// bound, nothing is tracked).
func newKernelEntries(budget int) *kernelEntries {
	if budget == 0 {
		budget = defaultEntryBudget
	}
	return &kernelEntries{budget: budget, lru: list.New(), byID: map[uint64]*list.Element{}}
}

// handed records that the kernel was given node id for name in directory parent, and
// returns the files to forget, oldest first, once the list holds a batch more than its
// budget (nil otherwise).
func (k *kernelEntries) handed(id, parent uint64, name string) []kernelEntry {
	if k.budget < 0 {
		return nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if e, ok := k.byID[id]; ok {
		e.Value = kernelEntry{id: id, parent: parent, name: name}
		k.lru.MoveToFront(e)
		return nil
	}
	k.byID[id] = k.lru.PushFront(kernelEntry{id: id, parent: parent, name: name})
	if k.lru.Len() < k.budget+pruneBatch || k.pruning {
		return nil
	}
	k.pruning = true
	out := make([]kernelEntry, 0, pruneBatch)
	for len(out) < pruneBatch {
		e := k.lru.Back()
		ke := k.lru.Remove(e).(kernelEntry)
		delete(k.byID, ke.id)
		out = append(out, ke)
	}
	return out
}

// pruned records that a batch handed returned was sent.
func (k *kernelEntries) pruned() {
	k.mu.Lock()
	k.pruning = false
	k.mu.Unlock()
}

// prune asks the kernel to forget the files of batch, on a goroutine of its own: an
// invalidation from inside a request could wait for the directory lock the kernel holds
// for that request.
func (v *View) prune(batch []kernelEntry) {
	go func() {
		defer v.entries.pruned()
		srv := v.notifier.Load()
		if srv == nil {
			return
		}
		ids := make([]uint64, len(batch))
		for i, e := range batch {
			ids[i] = e.id
		}
		if srv.PruneNotify(ids) != fuse.ENOSYS {
			return
		}
		for _, e := range batch {
			_ = srv.EntryNotify(e.parent, e.name)
		}
	}()
}
