package runner

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// spillWrittenYAML has one producer write four 6 MiB files under OnTermination, 3x the
// memory tier's sizeLimit in all and none committed before the producer exits, and a
// consumer checksum them (fire rule %s).
const spillWrittenYAML = `apiVersion: sluice.io/v1alpha1
kind: Workflow
metadata: {name: spill-written}
spec:
  volume: {sizeLimit: 8Mi, disk: {sizeLimit: 64Mi}}
  permanent: [sums.txt]
  steps:
  - name: p
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'set -e; cd "$SLUICE_DIR"; mkdir -p big; for i in 0 1 2 3; do yes "file $i" | head -c 6291456 > big/f$i; done']}]}}
    outputs: [{path: "big/*", commit: {rule: OnTermination}, fire: %s}]
  - name: c
    template: {spec: {containers: [{name: c, image: x, command: [sh, -c, 'set -e; cd "$SLUICE_DIR"; sha256sum big/f0 big/f1 big/f2 big/f3 > sums.txt']}]}}
    inputs: ["big/*"]
    outputs: [{path: sums.txt, commit: {rule: OnClose}}]
`

// Spill covers files being written: with a disk tier, a workflow whose OnTermination
// intermediates (nothing commits before the producer exits) are 3x the memory tier
// completes byte for byte, under Update and under NoUpdate (whose consumer reads each file
// as it is written), the files the memory tier cannot hold written to the disk tier.
// Before, the producer's second file failed with ENOSPC after the space wait: only
// committed files could spill.
func TestSpillCoversFilesBeingWritten(t *testing.T) {
	var want strings.Builder
	for i := 0; i < 4; i++ {
		sum := sha256.Sum256([]byte(strings.Repeat(fmt.Sprintf("file %d\n", i), 6291456/7+1)[:6291456]))
		fmt.Fprintf(&want, "%x  big/f%d\n", sum, i)
	}
	for _, fire := range []string{"Update", "NoUpdate"} {
		t.Run(fire, func(t *testing.T) {
			wf, rules := load(t, "spill-written.yaml", []byte(fmt.Sprintf(spillWrittenYAML, fire)))
			tmp := t.TempDir()
			work, out := filepath.Join(tmp, "work"), filepath.Join(tmp, "out")
			rep, err := Run(context.Background(), wf, rules, Options{WorkDir: work, OutDir: out, SpaceWait: 5 * time.Second})
			if err != nil {
				t.Fatalf("24 MiB of OnTermination files through an 8 MiB memory tier with a disk tier: %v", err)
			}
			if got, err := os.ReadFile(filepath.Join(out, "sums.txt")); err != nil || string(got) != want.String() {
				t.Errorf("the consumer's checksums:\n%s(%v)\nwant:\n%s", got, err, want.String())
			}
			onDisk := 0
			for i := 0; i < 4; i++ {
				if _, err := os.Stat(filepath.Join(work, "disk", "big", fmt.Sprintf("f%d", i))); err == nil {
					onDisk++
				} else if !errors.Is(err, fs.ErrNotExist) {
					t.Error(err)
				}
			}
			if onDisk < 2 {
				t.Errorf("%d of the 4 files in the disk tier; want at least the 2 the memory tier cannot hold", onDisk)
			}
			if rep.PeakMemoryBytes > 8<<20 || rep.SpilledFiles < 2 || rep.SpilledBytes < 2*6291456 {
				t.Errorf("report: memory peak %d bytes, %d files and %d bytes spilled; want at most 8 MiB in memory and at least 2 files (12 MiB) spilled",
					rep.PeakMemoryBytes, rep.SpilledFiles, rep.SpilledBytes)
			}
		})
	}
}
