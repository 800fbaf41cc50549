// Command vulndb builds, from the OSV entries of the golang.org/x/vulndb module (its
// data/osv, which the Go module proxy serves like any module's files), a Go
// vulnerability database that govulncheck reads with -db file://OUT: OUT/ID/<id>.json
// (the entries as they are), OUT/index/db.json (the newest modification) and
// OUT/index/modules.json (the modules each entry affects). make verify runs it
// (hack/verify.sh), so govulncheck needs no host but the module proxy.
//
//	go run ./hack/vulndb SRC OUT
//
// OUT must not exist; on success it holds the whole database.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// entry is what the database's indexes need of an OSV entry.
type entry struct {
	ID       string    `json:"id"`
	Modified time.Time `json:"modified"`
	Affected []struct {
		Package struct {
			Name string `json:"name"`
		} `json:"package"`
	} `json:"affected"`
}

// moduleVuln and moduleMeta are index/modules.json's (golang.org/x/vuln's client
// schema); without Fixed, govulncheck reads every entry of a module it uses.
type moduleVuln struct {
	ID       string    `json:"id"`
	Modified time.Time `json:"modified"`
}

type moduleMeta struct {
	Path  string       `json:"path"`
	Vulns []moduleVuln `json:"vulns"`
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: go run ./hack/vulndb SRC OUT")
		os.Exit(2)
	}
	n, err := build(os.Args[1], os.Args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, "vulndb:", err)
		os.Exit(1)
	}
	fmt.Printf("vulndb: %d entries\n", n)
}

// build writes the database of the entries in src to out and returns how many there are.
func build(src, out string) (int, error) {
	files, err := filepath.Glob(filepath.Join(src, "*.json"))
	if err != nil {
		return 0, fmt.Errorf("listing %s: %w", src, err)
	}
	if len(files) == 0 {
		return 0, fmt.Errorf("no OSV entries in %s", src)
	}
	if err := os.Mkdir(out, 0o755); err != nil {
		return 0, fmt.Errorf("making the database: %w", err)
	}
	for _, d := range []string{"ID", "index"} {
		if err := os.Mkdir(filepath.Join(out, d), 0o755); err != nil {
			return 0, fmt.Errorf("making the database: %w", err)
		}
	}
	var newest time.Time
	modules := map[string]*moduleMeta{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return 0, fmt.Errorf("reading an entry: %w", err)
		}
		var e entry
		if err := json.Unmarshal(data, &e); err != nil {
			return 0, fmt.Errorf("entry %s: %w", f, err)
		}
		if e.ID == "" || e.ID+".json" != filepath.Base(f) {
			return 0, fmt.Errorf("entry %s: its id is %q", f, e.ID)
		}
		if err := os.WriteFile(filepath.Join(out, "ID", e.ID+".json"), data, 0o644); err != nil {
			return 0, fmt.Errorf("writing entry %s: %w", e.ID, err)
		}
		if e.Modified.After(newest) {
			newest = e.Modified
		}
		seen := map[string]bool{}
		for _, a := range e.Affected {
			p := a.Package.Name
			if p == "" || seen[p] {
				continue
			}
			seen[p] = true
			m := modules[p]
			if m == nil {
				m = &moduleMeta{Path: p}
				modules[p] = m
			}
			m.Vulns = append(m.Vulns, moduleVuln{ID: e.ID, Modified: e.Modified})
		}
	}
	index := make([]*moduleMeta, 0, len(modules))
	for _, m := range modules {
		sort.Slice(m.Vulns, func(i, j int) bool { return m.Vulns[i].ID < m.Vulns[j].ID })
		index = append(index, m)
	}
	sort.Slice(index, func(i, j int) bool { return strings.Compare(index[i].Path, index[j].Path) < 0 })
	if err := writeJSON(filepath.Join(out, "index", "modules.json"), index); err != nil {
		return 0, err
	}
	// db.json last: a database with it is whole (hack/verify.sh checks for it).
	if err := writeJSON(filepath.Join(out, "index", "db.json"), struct {
		Modified time.Time `json:"modified"`
	}{newest}); err != nil {
		return 0, err
	}
	return len(files), nil
}

func writeJSON(path string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encoding %s: %w", filepath.Base(path), err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return fmt.Errorf("writing %s: %w", filepath.Base(path), err)
	}
	return nil
}
