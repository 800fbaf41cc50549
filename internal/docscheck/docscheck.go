// Package docscheck keeps the commands and outputs quoted in README.md and docs/*.md true:
// a marker, an HTML comment on the line before a fenced block (or a table), says how the
// block is produced, and the package's tests (make docs-check; make test runs them too)
// check every marked block against the program:
//
//	<!-- docs-check: run: sluice run examples/pipeline/noupdate.yaml -->
//	```
//	...what the command prints...
//	```
//
// The kinds of marker:
//
//   - run: CMD — the block is what the shell command CMD prints on its standard output
//     (add 2>&1 to show its errors), run in a scratch directory where sluice and
//     bin/sluice are the binaries built from this tree, examples/ is the repository's and
//     testdata/ is this package's. It is compared modulo timings, rates, ratios, hex
//     hashes, the scratch directory (shown as /root/sluice) and runs of spaces (see
//     Normalize), and the order of the rows of a table of step instances (sorted by
//     start time: instances that start together come in either order); "…" or "..."
//     in a line of the block stands for any text. go test
//     ./internal/docscheck -run TestDocs -update (make docs-check UPDATE=1) rewrites the
//     blocks that differ with what the commands print.
//   - commands — every line of the block that runs sluice or sluice-bench names a real
//     subcommand and only flags it has, and every make target it names exists. The
//     commands are not run.
//   - usage: sluice SUBCOMMAND — the block or table names exactly the flags of that
//     command (the --help flag aside).
//   - skip: REASON — not checked, for the reason given (a cluster is needed, a diagram,
//     another test checks it, ...).
//
// Every fenced block that is not YAML or JSON (a command, an output, a diagram) must carry
// a marker, so that a new block cannot drift unnoticed.
package docscheck

import (
	"fmt"
	"regexp"
	"strings"
)

// Marker kinds.
const (
	KindRun      = "run"
	KindCommands = "commands"
	KindUsage    = "usage"
	KindSkip     = "skip"
)

// Marker is a parsed docs-check comment.
type Marker struct {
	Line int    // 1-based line of the comment
	Kind string // KindRun, KindCommands, KindUsage or KindSkip
	Arg  string // the command (run), the command path (usage) or the reason (skip)
}

// Block is a fenced code block of a Markdown file, or a table that follows a marker.
type Block struct {
	Line   int     // 1-based line of the opening fence, or of a table's first row
	Info   string  // the fence's info string ("sh", "yaml", ...); "" for a table
	Table  bool    // a table, not a fenced block
	Indent string  // the opening fence's indentation, removed from Body's lines
	Body   string  // the lines inside the fences (a table's rows), each ending in a newline
	Marker *Marker // the marker on the line before, nil when there is none

	start, end int // 0-based line indexes of the body: lines[start:end]
}

// NeedsMarker reports whether the block must carry a marker: every fenced block except
// YAML and JSON ones, which show input documents rather than commands or output.
func (b Block) NeedsMarker() bool {
	if b.Table {
		return false
	}
	switch strings.ToLower(strings.Fields(b.Info + " x")[0]) {
	case "yaml", "yml", "json":
		return false
	}
	return true
}

var (
	markerRE = regexp.MustCompile(`^\s*<!--\s*docs-check:\s*(.*?)\s*-->\s*$`)
	fenceRE  = regexp.MustCompile("^( {0,3}|\\s*)(```+|~~~+)\\s*(.*)$")
)

// Parse returns the fenced blocks of a Markdown document, and the tables that follow a
// marker, with their markers. A marker that is malformed or not directly before a block
// or table, and a block that is not closed, are errors.
func Parse(md string) ([]Block, error) {
	lines := splitLines(md)
	var blocks []Block
	var pending *Marker
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if m := markerRE.FindStringSubmatch(l); m != nil {
			mk, err := parseMarker(i+1, m[1])
			if err != nil {
				return nil, err
			}
			if pending != nil {
				return nil, fmt.Errorf("line %d: docs-check marker of line %d is not directly before a fenced block or table", i+1, pending.Line)
			}
			pending = &mk
			continue
		}
		if f := fenceRE.FindStringSubmatch(l); f != nil {
			b := Block{Line: i + 1, Info: strings.TrimSpace(f[3]), Indent: f[1], Marker: pending, start: i + 1}
			pending = nil
			end := -1
			for j := i + 1; j < len(lines); j++ {
				t := strings.TrimSpace(lines[j])
				if strings.HasPrefix(t, f[2]) && strings.Trim(t, f[2][:1]) == "" {
					end = j
					break
				}
			}
			if end < 0 {
				return nil, fmt.Errorf("line %d: fenced block is not closed", i+1)
			}
			b.end = end
			var body strings.Builder
			for _, bl := range lines[b.start:end] {
				body.WriteString(strings.TrimPrefix(bl, b.Indent))
				body.WriteByte('\n')
			}
			b.Body = body.String()
			blocks = append(blocks, b)
			i = end
			continue
		}
		if pending != nil {
			if !strings.HasPrefix(strings.TrimSpace(l), "|") {
				return nil, fmt.Errorf("line %d: docs-check marker is not directly before a fenced block or table", pending.Line)
			}
			b := Block{Line: i + 1, Table: true, Marker: pending, start: i}
			pending = nil
			j := i
			var body strings.Builder
			for ; j < len(lines) && strings.HasPrefix(strings.TrimSpace(lines[j]), "|"); j++ {
				body.WriteString(lines[j])
				body.WriteByte('\n')
			}
			b.end, b.Body = j, body.String()
			blocks = append(blocks, b)
			i = j - 1
		}
	}
	if pending != nil {
		return nil, fmt.Errorf("line %d: docs-check marker is not directly before a fenced block or table", pending.Line)
	}
	return blocks, nil
}

func parseMarker(line int, s string) (Marker, error) {
	kind, arg, _ := strings.Cut(s, ":")
	m := Marker{Line: line, Kind: strings.TrimSpace(kind), Arg: strings.TrimSpace(arg)}
	switch m.Kind {
	case KindRun, KindUsage, KindSkip:
		if m.Arg == "" {
			return m, fmt.Errorf("line %d: docs-check %s needs an argument after %q", line, m.Kind, m.Kind+":")
		}
	case KindCommands:
		if m.Arg != "" {
			return m, fmt.Errorf("line %d: docs-check commands takes no argument", line)
		}
	default:
		return m, fmt.Errorf("line %d: unknown docs-check marker %q (run, commands, usage or skip)", line, m.Kind)
	}
	return m, nil
}

// splitLines splits a document into lines without their newlines.
func splitLines(s string) []string {
	return strings.Split(strings.TrimSuffix(s, "\n"), "\n")
}

// ReplaceBody returns md with the body of block b (from Parse(md)) replaced by body,
// indented as the block is.
func ReplaceBody(md string, b Block, body string) string {
	lines := splitLines(md)
	var repl []string
	for _, l := range splitLines(body) {
		if l != "" {
			l = b.Indent + l
		}
		repl = append(repl, l)
	}
	if body == "" {
		repl = nil
	}
	out := append(append(append([]string{}, lines[:b.start]...), repl...), lines[b.end:]...)
	return strings.Join(out, "\n") + "\n"
}

var normalizers = []struct {
	re   *regexp.Regexp
	with string
}{
	// Hashes (sha256 prefixes of random data, ids): 12 or more hex digits.
	{regexp.MustCompile(`\b[0-9a-f]{12,}\b`), "<hex>"},
	// sluice run's temporary work directories.
	{regexp.MustCompile(`(sluice-run-[A-Za-z0-9_.-]*?)-?[0-9]+\b`), "$1-<n>"},
	// Rates: 89.9 MiB/s, 1.2 GB/s, 70 B/s.
	{regexp.MustCompile(`\b\d+(\.\d+)? ?[KMGTP]?i?B/s\b`), "<rate>"},
	// Durations: 0.04s, 10ms, 3µs, 1m30s, 2h0m0s.
	{regexp.MustCompile(`\b(\d+h)?(\d+m)?\d+(\.\d+)?(ns|us|µs|ms|s|m|h)\b`), "<duration>"},
	// Ratios: (overlap 1.33x).
	{regexp.MustCompile(`\b\d+(\.\d+)?x\b`), "<ratio>x"},
	// Log line headers of klog: I1126 17:46:37.447651   32486 file.go:526].
	{regexp.MustCompile(`^[IWEF]\d{4} [0-9:.]+ +\d+ [^ \]]+\]`), "<log>"},
	// Runs of spaces and tabs: tables are aligned to their widest cell.
	{regexp.MustCompile(`[ \t]+`), " "},
}

// Normalize returns a line of output with what changes from run to run replaced by
// placeholders: hex hashes, temporary directory names, rates, durations, ratios, log
// headers; runs of blanks become one space and trailing blanks go.
func Normalize(line string) string {
	for _, n := range normalizers {
		line = n.re.ReplaceAllString(line, n.with)
	}
	return strings.TrimRight(line, " ")
}

var ellipsisRE = regexp.MustCompile(`…|\.\.\.`)

// Match reports whether output (what a command printed) matches a block's text (what the
// docs show), line by line after Normalize; "…" or "..." in a line of want matches any
// text. When they differ, diff says where, in lines meant for a test failure.
func Match(want, output string) (ok bool, diff string) {
	w, o := splitLines(strings.TrimRight(want, "\n")), splitLines(strings.TrimRight(output, "\n"))
	o = alignInstanceRows(w, o)
	var d strings.Builder
	for i := 0; i < len(w) || i < len(o); i++ {
		if i >= len(w) {
			fmt.Fprintf(&d, "line %d: the docs end; the output goes on with:\n  %s\n", i+1, strings.Join(o[i:], "\n  "))
			break
		}
		if i >= len(o) {
			fmt.Fprintf(&d, "line %d: the output ends; the docs go on with:\n  %s\n", i+1, strings.Join(w[i:], "\n  "))
			break
		}
		if !lineMatches(w[i], o[i]) {
			fmt.Fprintf(&d, "line %d:\n  docs:   %s\n  output: %s\n", i+1, w[i], o[i])
		}
	}
	return d.Len() == 0, d.String()
}

// instanceRowRE matches a row of sluice run's table of step instances ("produce[0]  0.04s
// ..."): the table is sorted by start time, so instances that start within a few
// milliseconds of each other come in either order from run to run.
var instanceRowRE = regexp.MustCompile(`^\S+\[\d+\]\s`)

// alignInstanceRows returns output with each run of instance rows (instanceRowRE) that
// stands where want has a run of as many, and whose rows match want's in some order, put
// in want's order; every other line stays where it is. Which instance started first
// within a table is timing, not what the docs show.
func alignInstanceRows(want, output []string) []string {
	out := append([]string(nil), output...)
	for i := 0; i < len(want) && i < len(out); {
		if !instanceRowRE.MatchString(want[i]) {
			i++
			continue
		}
		j := i
		for j < len(want) && j < len(out) && instanceRowRE.MatchString(want[j]) && instanceRowRE.MatchString(out[j]) {
			j++
		}
		if j > i+1 {
			if rows, ok := matchInOrder(want[i:j], out[i:j]); ok {
				copy(out[i:j], rows)
			}
		}
		i = max(j, i+1)
	}
	return out
}

// matchInOrder returns got's lines in the order of the want lines they match, each used
// once; false when some want line matches none left.
func matchInOrder(want, got []string) ([]string, bool) {
	used := make([]bool, len(got))
	rows := make([]string, 0, len(want))
	for _, w := range want {
		found := false
		for k, g := range got {
			if !used[k] && lineMatches(w, g) {
				used[k], found = true, true
				rows = append(rows, g)
				break
			}
		}
		if !found {
			return nil, false
		}
	}
	return rows, true
}

func lineMatches(want, got string) bool {
	nw, ng := Normalize(want), Normalize(got)
	if nw == ng {
		return true
	}
	if !ellipsisRE.MatchString(nw) {
		return false
	}
	parts := ellipsisRE.Split(nw, -1)
	for i, p := range parts {
		parts[i] = regexp.QuoteMeta(p)
	}
	return regexp.MustCompile("^" + strings.Join(parts, ".*") + "$").MatchString(ng)
}
