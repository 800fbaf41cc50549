package docscheck

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/internal/testenv"
)

var update = flag.Bool("update", false, "rewrite the docs' run blocks that differ from what their commands print")

// raceEnabled is set by race_test.go when the test runs with -race: the binaries are
// then built with -race too, which reuses the packages the test's build compiled.
var raceEnabled bool

// root is the repository, from this package's directory.
const root = "../.."

// displayDir is how a run block shows the scratch directory its command runs in.
const displayDir = "/root/sluice"

// docFiles are README.md and docs/*.md, relative to root.
func docFiles(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil || len(docs) == 0 {
		t.Fatalf("no docs/*.md (%v)", err)
	}
	files := []string{"README.md"}
	for _, d := range docs {
		files = append(files, filepath.Join("docs", filepath.Base(d)))
	}
	return files
}

func parseDoc(t *testing.T, file string) (string, []Block) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, file))
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := Parse(string(b))
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return string(b), blocks
}

// Every command, output or diagram block of the docs says how it is kept true: a new
// block without a marker fails here, naming its line.
func TestDocBlocksAreMarked(t *testing.T) {
	kinds := map[string]int{}
	for _, file := range docFiles(t) {
		_, blocks := parseDoc(t, file)
		for _, b := range blocks {
			if b.Marker != nil {
				kinds[b.Marker.Kind]++
				continue
			}
			if b.NeedsMarker() {
				t.Errorf("%s:%d: a ```%s block without a docs-check marker on the line before it "+
					"(<!-- docs-check: run: CMD -->, commands, usage: CMD or skip: REASON; see internal/docscheck)", file, b.Line, b.Info)
			}
		}
	}
	if kinds[KindRun] < 3 || kinds[KindCommands] < 5 || kinds[KindUsage] < 2 {
		t.Errorf("markers by kind: %v; want the README's example, the docs' error examples, their command lines and sluice run's flags checked", kinds)
	}
}

// The docs' marked blocks are what the program prints, its flags and subcommands and the
// Makefile's targets (see the package comment for the markers).
func TestDocs(t *testing.T) {
	testenv.Root(t, "runs sluice run, which mounts FUSE")
	bin := buildBinaries(t)
	targets := makeTargets(t)
	for _, file := range docFiles(t) {
		md, blocks := parseDoc(t, file)
		updated := md
		// Rewrite from the last block up, so that earlier blocks' lines stay where they were.
		for i := len(blocks) - 1; i >= 0; i-- {
			b := blocks[i]
			if b.Marker == nil || b.Marker.Kind == KindSkip {
				continue
			}
			t.Run(fmt.Sprintf("%s:%d", file, b.Line), func(t *testing.T) {
				switch b.Marker.Kind {
				case KindRun:
					out := runBlock(t, bin, b.Marker.Arg)
					if ok, diff := Match(b.Body, out); !ok {
						if *update {
							updated = ReplaceBody(updated, b, out)
							t.Logf("%s:%d: rewritten with what `%s` prints", file, b.Line, b.Marker.Arg)
							return
						}
						t.Errorf("%s:%d: `%s` prints what the docs do not show (rerun with -update to rewrite the block):\n%s\nit printed:\n%s",
							file, b.Line, b.Marker.Arg, diff, out)
					}
				case KindCommands:
					checkCommands(t, bin, targets, b)
				case KindUsage:
					checkUsage(t, bin, b)
				}
			})
		}
		if updated != md {
			if err := os.WriteFile(filepath.Join(root, file), []byte(updated), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// buildBinaries builds sluice and sluice-bench from this tree into a directory of the
// test's, or takes them from $SLUICE_BIN_DIR.
func buildBinaries(t *testing.T) string {
	t.Helper()
	if d := os.Getenv("SLUICE_BIN_DIR"); d != "" {
		abs, err := filepath.Abs(d)
		if err != nil {
			t.Fatal(err)
		}
		return abs
	}
	dir := t.TempDir()
	args := []string{"build"}
	if raceEnabled {
		args = append(args, "-race")
	}
	args = append(args, "-o", dir+"/", "./cmd/sluice", "./cmd/sluice-bench")
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return dir
}

// scratch makes the directory a block's commands run in: bin/ holds the binaries (also on
// PATH), examples/ is the repository's, testdata/ this package's, and TMPDIR is tmp/.
func scratch(t *testing.T, bin string) (dir string, env []string) {
	t.Helper()
	dir = t.TempDir()
	abs := func(p string) string {
		a, err := filepath.Abs(p)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	for _, mk := range []string{"bin", "tmp"} {
		if err := os.Mkdir(filepath.Join(dir, mk), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	links := map[string]string{
		"bin/sluice":       filepath.Join(bin, "sluice"),
		"bin/sluice-bench": filepath.Join(bin, "sluice-bench"),
		"examples":         abs(filepath.Join(root, "examples")),
		"testdata":         abs("testdata"),
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	env = append(os.Environ(), "PATH="+filepath.Join(dir, "bin")+":"+os.Getenv("PATH"), "TMPDIR="+filepath.Join(dir, "tmp"))
	return dir, env
}

// sh runs a shell command line in dir and returns its standard output and error.
func sh(t *testing.T, dir string, env []string, line string) (stdout, stderr string, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", line)
	cmd.Dir, cmd.Env = dir, env
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return o.String(), e.String(), err
}

// runBlock runs a run marker's command and returns its standard output, the scratch
// directory shown as displayDir.
func runBlock(t *testing.T, bin, line string) string {
	t.Helper()
	dir, env := scratch(t, bin)
	stdout, stderr, err := sh(t, dir, env, line)
	if stdout == "" {
		t.Fatalf("`%s` printed nothing on its standard output (%v); its standard error:\n%s", line, err, stderr)
	}
	stdout = strings.ReplaceAll(stdout, filepath.Join(dir, "tmp")+"/", "/tmp/")
	return strings.ReplaceAll(stdout, dir, displayDir)
}

// makeTargets are the targets the Makefile defines.
func makeTargets(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	targets := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^([A-Za-z0-9_.-]+):`).FindAllStringSubmatch(string(b), -1) {
		targets[m[1]] = true
	}
	return targets
}

// shellWords splits a command line into words as sh would for simple quoting, and stops
// at a comment, a redirection, a pipe or a command separator.
func shellWords(line string) []string {
	var words []string
	var cur strings.Builder
	inWord := false
	quote := rune(0)
	for _, r := range line {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			} else {
				cur.WriteRune(r)
			}
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case r == '#' && !inWord:
			return words
		case strings.ContainsRune("><|&;", r):
			if w := cur.String(); inWord && !(r == '>' && (w == "1" || w == "2")) {
				words = append(words, w)
			}
			return words
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words
}

// commandLines joins a block's lines continued with a backslash.
func commandLines(body string) []string {
	var lines []string
	cont := ""
	for _, l := range splitLines(body) {
		if s, ok := strings.CutSuffix(strings.TrimRight(l, " "), `\`); ok {
			cont += s + " "
			continue
		}
		lines = append(lines, cont+l)
		cont = ""
	}
	return lines
}

var usageLineRE = regexp.MustCompile(`(?m)^Usage:\n\s+(.*)$`)

// checkCommands checks every sluice, sluice-bench and make command line of a block.
func checkCommands(t *testing.T, bin string, targets map[string]bool, b Block) {
	dir, env := scratch(t, bin)
	checked := 0
	for _, line := range commandLines(b.Body) {
		words := shellWords(strings.TrimPrefix(strings.TrimSpace(line), "$ "))
		for len(words) > 0 && regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`).MatchString(words[0]) {
			words = words[1:] // VAR=value before the command
		}
		if len(words) == 0 {
			continue
		}
		switch prog := filepath.Base(words[0]); prog {
		case "make":
			for _, w := range words[1:] {
				if !strings.HasPrefix(w, "-") && !strings.Contains(w, "=") && !targets[w] {
					t.Errorf("line %q: the Makefile has no target %q", line, w)
				}
			}
			checked++
		case "sluice", "sluice-bench":
			// The command line with --help: cobra parses its flags (an unknown one is an
			// error) and prints the help of the subcommand the words name.
			quoted := make([]string, 0, len(words)+1)
			for _, w := range append(slices.Clone(words), "--help") {
				quoted = append(quoted, "'"+strings.ReplaceAll(w, "'", `'\''`)+"'")
			}
			stdout, stderr, err := sh(t, dir, env, strings.Join(quoted, " "))
			m := usageLineRE.FindStringSubmatch(stdout)
			if err != nil || m == nil {
				t.Errorf("line %q: %s --help fails (%v):\n%s%s", line, strings.Join(words, " "), err, stdout, stderr)
				continue
			}
			// The words name an existing subcommand: the help is that of the deepest command
			// they name, and a command with subcommands takes no other word.
			var path []string
			for _, w := range strings.Fields(m[1]) {
				if !regexp.MustCompile(`^[a-z][a-z0-9-]*$`).MatchString(w) {
					break
				}
				path = append(path, w)
			}
			var args []string
			for _, w := range words[1:] {
				if !strings.HasPrefix(w, "-") {
					args = append(args, w)
				}
			}
			sub := path[1:]
			if len(args) < len(sub) || !slices.Equal(args[:len(sub)], sub) {
				t.Errorf("line %q: the help printed is that of %q", line, strings.Join(path, " "))
			} else if strings.Contains(stdout, "\nAvailable Commands:") && len(args) > len(sub) {
				t.Errorf("line %q: %q has no subcommand %q", line, strings.Join(path, " "), args[len(sub)])
			}
			checked++
		}
	}
	if checked == 0 {
		t.Errorf("a commands block with no sluice, sluice-bench or make command: mark it skip, with the reason")
	}
}

var (
	flagRE     = regexp.MustCompile(`--([a-z][a-z0-9-]*)`)
	helpFlagRE = regexp.MustCompile(`(?m)^\s+(?:-[a-zA-Z], )?--([a-z][a-z0-9-]*)`)
)

// checkUsage checks that a block or table names exactly the flags of a command.
func checkUsage(t *testing.T, bin string, b Block) {
	dir, env := scratch(t, bin)
	stdout, stderr, err := sh(t, dir, env, b.Marker.Arg+" --help")
	if err != nil {
		t.Fatalf("%s --help: %v\n%s", b.Marker.Arg, err, stderr)
	}
	_, flags, ok := strings.Cut(stdout, "\nFlags:\n")
	if !ok {
		t.Fatalf("%s --help shows no flags:\n%s", b.Marker.Arg, stdout)
	}
	has := map[string]bool{}
	for _, m := range helpFlagRE.FindAllStringSubmatch(flags, -1) {
		has[m[1]] = true
	}
	delete(has, "help")
	named := map[string]bool{}
	text := b.Body
	if b.Table { // a table's flags are in its first column
		var first []string
		for _, row := range splitLines(b.Body) {
			if cells := strings.Split(row, "|"); len(cells) > 2 {
				first = append(first, cells[1])
			}
		}
		text = strings.Join(first, "\n")
	}
	for _, m := range flagRE.FindAllStringSubmatch(text, -1) {
		named[m[1]] = true
	}
	for f := range has {
		if !named[f] {
			t.Errorf("%s has the flag --%s, which the docs do not name here", b.Marker.Arg, f)
		}
	}
	for f := range named {
		if !has[f] {
			t.Errorf("the docs name --%s, which %s does not have", f, b.Marker.Arg)
		}
	}
}
