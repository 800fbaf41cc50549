package runner

import (
	"bytes"
	"context"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/internal/streamfs"
)

const readInputWorkflow = `apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: read-input}
spec:
  steps:
  - name: produce
    template:
      spec:
        containers:
        - {name: p, image: x, command: [sh, -c, 'head -c 1048576 /dev/urandom > "$SLUICE_DIR/data.bin"']}
    outputs: [{path: data.bin, commit: {rule: OnClose}}]
  - name: consume
    inputs: [data.bin]
    template:
      spec:
        containers:
        - name: c
          image: x
          command: [sh, -c]
          args:
          - |
            set -eu
            head -c 4096 /dev/zero > "$SLUICE_DIR/scratch"
            sha256sum "$SLUICE_DIR/scratch" > /dev/null
            sha256sum "$SLUICE_DIR/data.bin" > "$SLUICE_DIR/sum.txt"
    outputs: [{path: sum.txt, commit: {rule: OnClose}}]
`

// The report counts what a consumer read of a committed input, and of an ungoverned
// file of its own, whether the view served the reads or the kernel read the store file
// itself (FUSE passthrough, which Sluice never sees): sha256sum reads its 1 MiB input and
// a 4 KiB scratch file once each, and the consumer's IN is their sum in both modes,
// marked in the table where it counts passthrough opens at their size.
func TestReportCountsInputsReadByPassthrough(t *testing.T) {
	const size = 1<<20 + 4096
	for _, mode := range []streamfs.PassthroughMode{streamfs.PassthroughOn, streamfs.PassthroughOff} {
		wf, rules := load(t, "read-input.yaml", []byte(readInputWorkflow))
		tmp := t.TempDir()
		rep, err := Run(context.Background(), wf, rules, Options{WorkDir: filepath.Join(tmp, "work"), OutDir: filepath.Join(tmp, "out"), Passthrough: mode})
		if err != nil {
			t.Fatalf("passthrough %s: %v", mode, err)
		}
		var consume *InstanceReport
		for i := range rep.Instances {
			if rep.Instances[i].Step == "consume" {
				consume = &rep.Instances[i]
			}
		}
		if consume == nil {
			t.Fatalf("passthrough %s: no consume instance in the report: %+v", mode, rep.Instances)
		}
		if got := consume.BytesIn + consume.BytesInPassthrough; got != size {
			t.Errorf("passthrough %s: consume[0] IN = %d bytes served + %d by passthrough, want %d in all", mode, consume.BytesIn, consume.BytesInPassthrough, size)
		}
		var table bytes.Buffer
		rep.WriteTable(&table)
		row := regexp.MustCompile(`(?m)^consume\[0\].*$`).FindString(table.String())
		switch mode {
		case streamfs.PassthroughOn:
			if consume.BytesInPassthrough != size {
				t.Errorf("passthrough on: %d bytes counted as read by passthrough, want %d (the kernel read the committed input itself)", consume.BytesInPassthrough, size)
			}
			if !regexp.MustCompile(`\s1\.0 MiB\*\s`).MatchString(row) || !bytes.Contains(table.Bytes(), []byte("\n* includes files read by FUSE passthrough")) {
				t.Errorf("passthrough on: the table does not show consume[0]'s 1.0 MiB marked as counted by passthrough, with the note:\n%s", table.String())
			}
		case streamfs.PassthroughOff:
			if consume.BytesInPassthrough != 0 || bytes.Contains(table.Bytes(), []byte("*")) {
				t.Errorf("passthrough off: every read is served, nothing is marked; got %d by passthrough and table:\n%s", consume.BytesInPassthrough, table.String())
			}
			if !regexp.MustCompile(`\s1\.0 MiB\s`).MatchString(row) {
				t.Errorf("passthrough off: consume[0]'s row does not show 1.0 MiB in:\n%s", table.String())
			}
		}
	}
}

// The table lists instances by start as it shows them (to 10 ms), and those that start
// together in the workflow's order: the producer first, although its process may have
// started a few nanoseconds after its consumers'.
func TestReportTableKeepsWorkflowOrderAtEqualStarts(t *testing.T) {
	t0 := time.Now()
	rep := &Report{Start: t0, Instances: []InstanceReport{
		{Step: "split", Start: t0.Add(40*time.Millisecond + 900*time.Microsecond)},
		{Step: "count", Instance: 0, Start: t0.Add(40 * time.Millisecond)},
		{Step: "count", Instance: 1, Start: t0.Add(41 * time.Millisecond)},
		{Step: "late", Start: t0.Add(20 * time.Millisecond)},
	}}
	var b bytes.Buffer
	rep.WriteTable(&b)
	var names []string
	for _, line := range strings.Split(b.String(), "\n")[1:5] {
		names = append(names, strings.Fields(line)[0])
	}
	if got, want := strings.Join(names, " "), "late[0] split[0] count[0] count[1]"; got != want {
		t.Errorf("table order = %s, want %s:\n%s", got, want, b.String())
	}
}
