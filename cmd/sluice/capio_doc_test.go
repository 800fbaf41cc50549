package main

import (
	"bufio"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// transcriptCommand is one "$ ..." line of a console transcript and what follows it.
type transcriptCommand struct {
	line string // the command, without "$ "
	want string // the lines shown after it, up to the next command
}

// consoleTranscripts returns the commands of the ```console blocks of a Markdown file.
func consoleTranscripts(t *testing.T, md string) [][]transcriptCommand {
	t.Helper()
	var blocks [][]transcriptCommand
	var cur []transcriptCommand
	in := false
	sc := bufio.NewScanner(strings.NewReader(md))
	for sc.Scan() {
		l := sc.Text()
		switch {
		case !in && l == "```console":
			in, cur = true, nil
		case in && l == "```":
			in = false
			blocks = append(blocks, cur)
		case in && strings.HasPrefix(l, "$ "):
			cur = append(cur, transcriptCommand{line: strings.TrimPrefix(l, "$ ")})
		case in:
			if len(cur) == 0 {
				t.Fatalf("a console block starts with %q, not with a $ command", l)
			}
			cur[len(cur)-1].want += l + "\n"
		}
	}
	if in {
		t.Fatal("a console block is not closed")
	}
	return blocks
}

// The console transcripts of docs/capio-cl.md are what sluice prints. Each block runs in
// an empty directory: "$ cat FILE" writes the lines shown into FILE, "$ sluice ARGS
// [> FILE]" runs the command (its standard output into FILE if redirected) and what it
// prints (warnings and errors, then its standard output) must be the lines shown.
func TestCAPIOCLDocTranscripts(t *testing.T) {
	md, err := os.ReadFile("../../docs/capio-cl.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := consoleTranscripts(t, string(md))
	ran := 0
	for i, block := range blocks {
		dir := t.TempDir()
		t.Chdir(dir)
		for _, c := range block {
			args := strings.Fields(c.line)
			if args[0] == "cat" && len(args) == 2 {
				if err := os.WriteFile(filepath.Join(dir, args[1]), []byte(c.want), 0o644); err != nil {
					t.Fatal(err)
				}
				continue
			}
			if args[0] != "sluice" {
				t.Fatalf("block %d: %q: only cat and sluice commands are run", i, c.line)
			}
			args, redirect := args[1:], ""
			if n := len(args); n >= 2 && args[n-2] == ">" {
				args, redirect = args[:n-2], args[n-1]
			}
			stdout, stderr, _ := run(t, args...)
			got := stderr
			if got != "" && !strings.HasSuffix(got, "\n") {
				got += "\n" // main prints the error with a newline
			}
			if redirect != "" {
				if err := os.WriteFile(filepath.Join(dir, redirect), []byte(stdout), 0o644); err != nil {
					t.Fatal(err)
				}
			} else {
				got += stdout
			}
			if got != c.want {
				t.Errorf("docs/capio-cl.md: $ %s\nprints:\n%s\nthe doc shows:\n%s", c.line, got, c.want)
			}
			ran++
		}
	}
	if ran < 3 {
		t.Errorf("docs/capio-cl.md: %d sluice commands in console blocks, want the error, export and import examples", ran)
	}
}

// What validate and import say about the Workflow a CAPIO-CL document converts to names
// the document's file and JSON paths, never the Workflow's fields: warnings and errors.
func TestCAPIOCLMessagesNameTheDocument(t *testing.T) {
	warns := writeFile(t, "w.json", `{"name": "w", "IO_Graph": [
		{"name": "a", "input_stream": [], "output_stream": ["x"]},
		{"name": "b", "input_stream": ["x", "missing.txt"], "output_stream": []}]}`)
	cycle := writeFile(t, "c.json", `{"name": "c", "IO_Graph": [{"name": "s", "input_stream": [], "output_stream": ["a", "b"],
		"streaming": [{"name": ["a"], "committed": "on_file", "file_deps": ["b"]},
		              {"name": ["b"], "committed": "on_file", "file_deps": ["a"]}]}]}`)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"validate", warns}, "warning: " + warns + `: IO_Graph[1].input_stream[1]: "missing.txt" is not declared by any output`},
		{[]string{"capio", "import", warns}, "warning: " + warns + `: IO_Graph[1].input_stream[1]: "missing.txt" is not declared by any output`},
		{[]string{"validate", cycle}, cycle + `: IO_Graph[0].streaming[1].file_deps: Invalid value: "a": OnFile dependency cycle`},
		{[]string{"capio", "import", cycle}, cycle + `: IO_Graph[0].streaming[1].file_deps: Invalid value: "a": OnFile dependency cycle`},
	} {
		_, stderr, _ := run(t, tc.args...)
		if !strings.Contains(stderr, tc.want) || strings.Contains(stderr, "spec.") {
			t.Errorf("sluice %s prints:\n%s\nwant a line with %q and no Workflow field path", strings.Join(tc.args, " "), stderr, tc.want)
		}
	}
}
