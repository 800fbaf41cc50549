// Package version names the build of a Sluice command.
package version

import "runtime/debug"

// Of returns set, the version a command's main package was given at build time
// (-ldflags "-X main.version=..."), when it is not empty; else "dev-" and the first 12
// hex digits of the VCS revision Go recorded in the binary, else the module version, else
// "dev".
func Of(set string) string {
	if set != "" {
		return set
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				return "dev-" + s.Value[:12]
			}
		}
		if bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			return bi.Main.Version
		}
	}
	return "dev"
}
