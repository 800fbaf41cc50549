package runner

import (
	"errors"
	"fmt"
	"os"

	"github.com/sluice-io/sluice/internal/capability"
)

// ErrPrivileges is wrapped by CheckPrivileges' error.
var ErrPrivileges = errors.New("sluice run mounts a FUSE view per step instance: it needs root (or CAP_SYS_ADMIN) and /dev/fuse")

// CheckPrivileges reports whether this process can serve sluice run's views: it mounts
// FUSE itself (no fusermount), which needs CAP_SYS_ADMIN in the effective capability set
// (capability.SysAdmin; root has it) and a /dev/fuse it can open read-write. The
// error wraps ErrPrivileges and says which of the two is missing.
func CheckPrivileges() error {
	admin, err := capability.Effective(capability.SysAdmin)
	if err != nil {
		return fmt.Errorf("%w: reading this process's capabilities: %w", ErrPrivileges, err)
	}
	if !admin {
		return fmt.Errorf("%w: this process (uid %d) lacks CAP_SYS_ADMIN; run it as root", ErrPrivileges, os.Geteuid())
	}
	f, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("%w: %w (load the fuse module, or give the container the device)", ErrPrivileges, err)
	}
	return f.Close()
}
