package runner

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/moby/sys/mountinfo"
)

// Each node store's memory tier is a tmpfs of the run's own, as a cluster node's is (the
// CSI plugin mounts one per workflow): the files steps make live in memory, whatever file
// system the work directory is on (a temp directory on a disk file system made each
// small file's creation cost a journal update, more than the rest of its way through
// the view). It is mounted in the run's mount namespace (--private-mounts) and goes with
// the run, so a failed run keeps its logs but not its intermediate files.

// memTierSlack is how much more than twice the store's limit (spec.volume.sizeLimit) a
// memory tier's tmpfs holds: the store waits for space and spills by its own accounting
// of the bytes it holds, and the tmpfs only keeps the run in memory. A file moved to the
// disk tier or removed while a reader still has it open keeps its pages until the reader
// closes it, which the accounting has freed already; twice the limit leaves room for
// that, and for the blocks and directories the accounting does not count.
const memTierSlack = 16 << 20

// mountMemoryTier mounts a tmpfs at dir (made if needed) for a node store whose limit is
// limit bytes (0: none, and the tmpfs takes the kernel's default size, half of the
// machine's memory).
func mountMemoryTier(dir string, limit int64) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("making the node store's directory %s: %w", dir, err)
	}
	data := "mode=0755"
	if limit > 0 {
		data += fmt.Sprintf(",size=%d", 2*limit+memTierSlack)
	}
	if err := syscall.Mount("sluice-store", dir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, data); err != nil {
		return fmt.Errorf("mounting a tmpfs for the node store's memory tier at %s: %w", dir, err)
	}
	return nil
}

// unmountMemoryTiers detaches the memory tiers mountMemoryTier mounted; their files go.
func (r *run) unmountMemoryTiers() {
	for _, dir := range r.memTiers {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			r.log.Error(err, "unmounting a node store's memory tier", "dir", dir)
		}
	}
	r.memTiers = nil
}

// detachStaleTiers lazily unmounts the memory tiers an earlier run with
// --private-mounts=false left mounted under the work directory dir (it was killed before
// it could unmount them), so that clearing the work directory can remove them.
func detachStaleTiers(dir string) ([]string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	infos, err := mountinfo.GetMounts(mountinfo.PrefixFilter(abs))
	if err != nil {
		return nil, fmt.Errorf("reading mount table: %w", err)
	}
	var detached []string
	for _, m := range infos {
		if m.FSType != "tmpfs" || m.Source != "sluice-store" || !strings.HasSuffix(m.Mountpoint, "/store") {
			continue
		}
		if err := syscall.Unmount(m.Mountpoint, syscall.MNT_DETACH); err != nil {
			return detached, fmt.Errorf("detaching a stale memory tier %s: %w", m.Mountpoint, err)
		}
		detached = append(detached, m.Mountpoint)
	}
	return detached, nil
}
