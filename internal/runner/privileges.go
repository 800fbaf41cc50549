package runner

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// capSysAdmin is CAP_SYS_ADMIN's bit in the kernel's capability sets (linux/capability.h).
const capSysAdmin = 21

// ErrPrivileges is wrapped by CheckPrivileges' error.
var ErrPrivileges = errors.New("sluice run mounts a FUSE view per step instance: it needs root (or CAP_SYS_ADMIN) and /dev/fuse")

// CheckPrivileges reports whether this process can serve sluice run's views: it mounts
// FUSE itself (no fusermount), which needs CAP_SYS_ADMIN in the effective capability set
// (/proc/self/status CapEff; root has it) and a /dev/fuse it can open read-write. The
// error wraps ErrPrivileges and says which of the two is missing.
func CheckPrivileges() error {
	eff, err := effectiveCaps()
	if err != nil {
		return fmt.Errorf("%w: reading this process's capabilities: %v", ErrPrivileges, err)
	}
	if eff&(1<<capSysAdmin) == 0 {
		return fmt.Errorf("%w: this process (uid %d) lacks CAP_SYS_ADMIN; run it as root", ErrPrivileges, os.Geteuid())
	}
	f, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("%w: %v (load the fuse module, or give the container the device)", ErrPrivileges, err)
	}
	return f.Close()
}

// effectiveCaps returns the CapEff mask of /proc/self/status.
func effectiveCaps() (uint64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "CapEff:"); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, errors.New("no CapEff line in /proc/self/status")
}
