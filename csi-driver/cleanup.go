package csidriver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Retirement says whether a workflow's temporary data may go: the Workflow was deleted,
// is being deleted, or its data retention ended (condition DataRemoved).
type Retirement interface {
	// Retired reports whether workflow wf of namespace ns no longer needs its node data.
	Retired(ctx context.Context, ns, wf string) (bool, error)
}

// Finisher says whether a workflow has finished (Succeeded or Failed): its pods are done,
// and nothing more is written into its node stores.
type Finisher interface {
	// Finished reports whether workflow wf of namespace ns has finished.
	Finished(ctx context.Context, ns, wf string) (bool, error)
}

// SetRetirement makes the plugin remove a workflow's node store directory once r says
// the workflow is retired and no volume of it is published on this node: checked when a
// volume of the workflow is unpublished, and by Sweep.
func (d *Driver) SetRetirement(ctx context.Context, r Retirement) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.retired = func(ns, wf string) {
		if err := d.RetireIf(ctx, r, ns, wf); err != nil {
			d.log.Error(err, "removing a retired workflow's node store", "namespace", ns, "workflow", wf)
		}
	}
}

// Sweep checks every workflow directory of the node store, and every disk tier of the
// node (which outlives the node store's tmpfs when the node restarts), with r and
// removes the retired ones that no published volume uses.
func (d *Driver) Sweep(ctx context.Context, r Retirement) error {
	dirs, err := d.WorkflowDirs()
	if err != nil {
		return err
	}
	wfs, err := d.diskTiers()
	if err != nil {
		return err
	}
	for _, dir := range dirs {
		wfs = append(wfs, workflowName{filepath.Base(filepath.Dir(dir)), filepath.Base(dir)})
	}
	var errs []error
	seen := map[workflowName]bool{}
	for _, w := range wfs {
		if !seen[w] {
			seen[w] = true
			errs = append(errs, d.RetireIf(ctx, r, w.ns, w.name))
		}
	}
	return errors.Join(errs...)
}

// RetireIf removes the node store directory of workflow ns/wf if r says it is retired
// and no volume of this node uses it; if r is also a Finisher and says the workflow
// finished, it shrinks the workflow's memory tier to what it holds (ShrinkMemoryTier).
func (d *Driver) RetireIf(ctx context.Context, r Retirement, ns, wf string) error {
	retired, err := r.Retired(ctx, ns, wf)
	if err != nil {
		return err
	}
	if retired {
		_, err = d.Retire(ns, wf)
		return err
	}
	f, ok := r.(Finisher)
	if !ok {
		return nil
	}
	finished, err := f.Finished(ctx, ns, wf)
	if err != nil || !finished {
		return err
	}
	return d.ShrinkMemoryTier(ns, wf)
}

// Retire removes the node store directory of workflow ns/wf, unmounting its tmpfs,
// unless a published volume uses it (a bind mount of it or of its data directory); it
// reports whether it removed it. Removing a directory that is gone is a success.
func (d *Driver) Retire(ns, wf string) (bool, error) {
	d.dirs.Lock()
	defer d.dirs.Unlock()
	dir := d.WorkflowDir(ns, wf)
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return d.retireDiskTier(ns, wf)
	}
	used, err := d.inUse(dir)
	if err != nil || used {
		return false, err
	}
	// The record first: the store servers' loop starts no server for a workflow
	// without one, so none holds the tiers once the running one has stopped.
	if err := d.removeRecord(ns, wf); err != nil {
		return false, err
	}
	d.mu.Lock()
	beforeRetire := d.beforeRetire
	d.mu.Unlock()
	if beforeRetire != nil {
		beforeRetire(dir)
	}
	// The workflow's tmpfs (memtier.go): unmounting it gives its memory back and its size
	// to the other workflows.
	if err := d.unmountMemoryTier(dir); err != nil {
		return false, fmt.Errorf("unmounting the memory tier of %s: %w", dir, err)
	}
	d.memMu.Lock()
	delete(d.shrunk, dir)
	d.memMu.Unlock()
	if err := os.RemoveAll(dir); err != nil {
		return false, fmt.Errorf("removing %s: %w", dir, err)
	}
	if err := d.removeDiskTier(ns, wf); err != nil {
		return false, err
	}
	_ = os.Remove(filepath.Dir(dir)) // the namespace's directory, if now empty
	d.log.Info("removed a retired workflow's node store", "namespace", ns, "workflow", wf)
	return true, nil
}

// inUse reports whether a mount shows dir or a directory below it. The mount table gives
// a bind mount's directory relative to its filesystem's root: dir's own path there is its
// containing mount's root joined with the rest of dir. The workflow's own tmpfs, mounted
// at dir, does not count.
func (d *Driver) inUse(dir string) (bool, error) {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return false, fmt.Errorf("%s: %w", dir, err)
	}
	dev := fmt.Sprintf("%d:%d", unix.Major(uint64(st.Dev)), unix.Minor(uint64(st.Dev)))
	ms, err := d.mnt.Mounts()
	if err != nil {
		return false, err
	}
	var container *mountInfo
	for i := range ms {
		m := &ms[i]
		if m.dev != dev || !(dir == m.mountPoint || strings.HasPrefix(dir, strings.TrimSuffix(m.mountPoint, "/")+"/")) {
			continue
		}
		if container == nil || len(m.mountPoint) >= len(container.mountPoint) {
			container = m
		}
	}
	if container == nil {
		return false, fmt.Errorf("no mount holds %s", dir)
	}
	rel := filepath.Join(container.root, strings.TrimPrefix(dir, container.mountPoint))
	for _, m := range ms {
		if m.dev != dev || m.mountPoint == dir {
			continue
		}
		if m.root == rel || rel == "/" || strings.HasPrefix(m.root, rel+"/") {
			return true, nil
		}
	}
	return false, nil
}

// retireDiskTier removes the disk tier (and the publication record) of retired
// workflow ns/wf whose node store is gone (the node restarted), unless a published volume
// uses it; it reports whether there was one to remove.
func (d *Driver) retireDiskTier(ns, wf string) (bool, error) {
	disk := d.DiskDir(ns, wf)
	img := filepath.Join(d.diskRoot(), diskImage(ns, wf))
	_, errDir := os.Lstat(disk)
	_, errImg := os.Lstat(img)
	if errors.Is(errDir, os.ErrNotExist) && errors.Is(errImg, os.ErrNotExist) {
		return false, nil
	}
	if _, ok, err := mountedAt(d.mnt, disk); err != nil {
		return false, err
	} else if ok {
		if used, err := d.inUse(disk); err != nil || used {
			return false, err
		}
	}
	if err := d.removeDiskTier(ns, wf); err != nil {
		return false, err
	}
	if err := d.removeRecord(ns, wf); err != nil {
		return false, err
	}
	d.log.Info("removed a retired workflow's disk tier", "namespace", ns, "workflow", wf)
	return true, nil
}

// removeRecord removes workflow ns/wf's publication record (and its namespace's
// directory of records, if now empty).
func (d *Driver) removeRecord(ns, wf string) error {
	rec := d.RecordDir(ns, wf)
	if err := os.RemoveAll(rec); err != nil {
		return fmt.Errorf("removing %s: %w", rec, err)
	}
	_ = os.Remove(filepath.Dir(rec))
	return nil
}
