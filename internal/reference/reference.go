// Package reference locates the shared reference material that sits beside a Sluice
// checkout (../shared: the CAPIO-CL schema and parser fixtures, the design brief), for
// tests that check Sluice against it.
package reference

import (
	"errors"
	"os"
	"path/filepath"
)

// ErrNotFound is returned when no shared directory is found.
var ErrNotFound = errors.New("shared reference directory not found: set SLUICE_SHARED_DIR or place shared/ beside the checkout")

// Dir returns the shared reference directory: $SLUICE_SHARED_DIR if set, otherwise the
// first "shared" directory holding capio-cl/ found walking up from the working directory.
func Dir() (string, error) {
	if d := os.Getenv("SLUICE_SHARED_DIR"); d != "" {
		return d, nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; ; d = filepath.Dir(d) {
		cand := filepath.Join(d, "shared")
		if st, err := os.Stat(filepath.Join(cand, "capio-cl")); err == nil && st.IsDir() {
			return cand, nil
		}
		if filepath.Dir(d) == d {
			return "", ErrNotFound
		}
	}
}
