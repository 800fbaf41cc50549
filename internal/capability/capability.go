// Package capability answers whether this process holds a Linux capability
// (capabilities(7)), read from the CapEff line of /proc/self/status.
package capability

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Bit is a capability's number, as in <linux/capability.h>.
type Bit uint

// The capabilities Sluice asks about.
const (
	// Chown is CAP_CHOWN: change any file's owner and group (the node store records the
	// owners a view reports with chown when it holds it).
	Chown Bit = 0
	// SysAdmin is CAP_SYS_ADMIN: mount FUSE file systems and register FUSE passthrough
	// backing files.
	SysAdmin Bit = 21
)

// Effective reports whether bit is in this process's effective capability set. The
// error names what could not be read or parsed in /proc/self/status.
func Effective(bit Bit) (bool, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false, fmt.Errorf("reading capabilities: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			eff, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			if err != nil {
				return false, fmt.Errorf("CapEff in /proc/self/status: %w", err)
			}
			return eff&(1<<bit) != 0, nil
		}
	}
	return false, errors.New("no CapEff line in /proc/self/status")
}
