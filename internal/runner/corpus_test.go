package runner

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluice-io/sluice/api/v1alpha1"
	"github.com/sluice-io/sluice/internal/semantics"
	"github.com/sluice-io/sluice/internal/streamfs"
	"github.com/sluice-io/sluice/internal/testenv"
)

// corpusPython is the interpreter of the corpus's Python rows: Debian's, which has h5py
// (python3-h5py); a python3 earlier on PATH (pyenv) may not.
const corpusPython = "/usr/bin/python3"

// corpusRow is one program of TestProgramCorpus: a consumer step runs cmd on the files
// inputs (from the corpus's sources, written by a producer step into the directory $D
// while cmd already waits for them) and writes its result to $OUT; the same cmd run on
// the finished files on a tmpfs must give the same result.
type corpusRow struct {
	name   string   // the row's name: part of its steps' names and of its files'
	needs  []string // the programs cmd runs
	inputs []string // the source files it reads, written into $D in this order
	// tree, when set, is the directory of inputs (a Directory output, OnTermination, its
	// files inheriting its rule) instead of one output per file (OnClose).
	tree string
	// cmd is a sh script run with set -e, $D (the inputs), $OUT (the result file),
	// $SCRATCH (an empty plain directory of its own) and $PY (corpusPython).
	cmd string
	// decode, when set, is a sh script run on a result ($F) whose output is compared
	// instead of the result's bytes (archives whose headers hold times and owners).
	decode string
	// warns names the firing rules under which the program may print a warning it does not
	// print on tmpfs, with the documented reason (docs/semantics.md, "Differences from
	// tmpfs"); its exit code and result must still be tmpfs's.
	warns map[string]string
	// differs names the firing rules under which the exit code and result may differ from
	// tmpfs's, with the documented reason: there the test logs the difference instead of
	// failing.
	differs map[string]string
	// bugs names, by firing rule ("Update") or firing rule and node count
	// ("Update/nodes=2"), differences that no rule imposes: defects known and not fixed
	// yet (issue 30), logged as such instead of failing. Remove an entry when its fix lands.
	bugs map[string]string
}

// bug returns the known defect of r under fire on nodes nodes, if any.
func (r corpusRow) bug(fire string, nodes int) (string, bool) {
	if why, ok := r.bugs[fmt.Sprintf("%s/nodes=%d", fire, nodes)]; ok {
		return why, true
	}
	why, ok := r.bugs[fire]
	return why, ok
}

// corpusRows are the programs of the corpus: compressors, archivers, copiers, checksums,
// text tools, SQLite, h5py and the 1000 Genomes workflow's tools as Debian packages them.
var corpusRows = []corpusRow{
	// compressors: their output is deterministic (gzip and pigz with -n store no name or
	// time), so the bytes are compared
	{name: "gzip", needs: []string{"gzip"}, inputs: []string{"in.txt"}, cmd: `gzip -n -c "$D/in.txt" > "$OUT"`,
		warns: map[string]string{"NoUpdate": "gzip compares the size fstat gave at open with what it read: 'file size changed while zipping'"}},
	{name: "pigz", needs: []string{"pigz"}, inputs: []string{"in.txt"}, cmd: `pigz -n -c "$D/in.txt" > "$OUT"`},
	{name: "xz", needs: []string{"xz"}, inputs: []string{"in.txt"}, cmd: `xz -c "$D/in.txt" > "$OUT"`},
	{name: "zstd", needs: []string{"zstd"}, inputs: []string{"in.txt"}, cmd: `zstd -q -c "$D/in.txt" > "$OUT"`,
		differs: map[string]string{"NoUpdate": "zstd writes the size stat gave into the frame, then fails: 'Src size is incorrect'"}},
	{name: "bzip2", needs: []string{"bzip2"}, inputs: []string{"in.txt"}, cmd: `bzip2 -c "$D/in.txt" > "$OUT"`},
	{name: "lz4", needs: []string{"lz4"}, inputs: []string{"in.txt"}, cmd: `lz4 -q -c "$D/in.txt" > "$OUT"`},
	// archivers: an archive holds times and owners, so its listing and contents are compared
	{name: "tar-c", needs: []string{"tar"}, inputs: []string{"in.txt"}, cmd: `tar -cf "$OUT" -C "$D" in.txt`,
		decode:  `tar -tvf "$F" | awk '{print $3, $6}'; tar -xOf "$F"`,
		differs: map[string]string{"NoUpdate": "tar archives as many bytes as stat said, exit 1: 'file changed as we read it'"}},
	{name: "tar-x", needs: []string{"tar"}, inputs: []string{"in.tar"}, cmd: `tar -xf "$D/in.tar" -C "$SCRATCH"; cd "$SCRATCH"; find . -type f | LC_ALL=C sort | xargs sha256sum > "$OUT"`},
	{name: "cpio-o", needs: []string{"cpio"}, inputs: []string{"in.txt"}, cmd: `cd "$D"; echo in.txt | cpio -o -H newc --quiet > "$OUT"`,
		decode:  `cpio -it --quiet < "$F"; cpio -i --to-stdout --quiet < "$F"`,
		differs: map[string]string{"NoUpdate": "cpio archives as many bytes as stat said, exit 0: 'File in.txt grew, N new bytes not copied'"}},
	{name: "cpio-i", needs: []string{"cpio"}, inputs: []string{"in.cpio"}, cmd: `cd "$SCRATCH"; cpio -idm --quiet < "$D/in.cpio"; find . -type f | LC_ALL=C sort | xargs sha256sum > "$OUT"`},
	// copiers
	{name: "cp", needs: []string{"cp"}, inputs: []string{"in.txt"}, cmd: `cp "$D/in.txt" "$OUT"`},
	{name: "cp-a", needs: []string{"cp"}, inputs: []string{"in.txt"}, cmd: `cp -a "$D/in.txt" "$OUT"`},
	{name: "rsync", needs: []string{"rsync"}, inputs: []string{"in.txt"}, cmd: `rsync "$D/in.txt" "$OUT"`,
		differs: map[string]string{"NoUpdate": "rsync copies as many bytes as stat said, silently"}},
	{name: "install", needs: []string{"install"}, inputs: []string{"in.txt"}, cmd: `install -m 644 "$D/in.txt" "$OUT"`},
	{name: "shutil", needs: []string{corpusPython}, inputs: []string{"in.txt"}, cmd: `$PY -c 'import shutil, sys; shutil.copy(sys.argv[1], sys.argv[2])' "$D/in.txt" "$OUT"`},
	// checksums
	{name: "sha256sum", needs: []string{"sha256sum"}, inputs: []string{"in.txt"}, cmd: `cd "$D"; sha256sum in.txt > "$OUT"`},
	{name: "md5sum", needs: []string{"md5sum"}, inputs: []string{"in.txt"}, cmd: `cd "$D"; md5sum in.txt > "$OUT"`},
	// text tools
	{name: "sort", needs: []string{"sort"}, inputs: []string{"in.txt"}, cmd: `sort -S 256K -T "$SCRATCH" "$D/in.txt" -o "$OUT"`},
	{name: "awk", needs: []string{"awk"}, inputs: []string{"in.txt"}, cmd: `awk '{ s += $1; n[substr($1, 1, 2)]++ } END { printf "%d %d\n", s, NR; for (k in n) print k, n[k] | "sort" }' "$D/in.txt" > "$OUT"`},
	{name: "perl", needs: []string{"perl"}, inputs: []string{"in.txt"}, cmd: `perl -ne '$s += (split)[0]; $w{(split)[1]}++; END { print "$s $.\n", join(",", map { "$_=$w{$_}" } sort keys %w), "\n" }' "$D/in.txt" > "$OUT"`},
	{name: "python", needs: []string{corpusPython}, inputs: []string{"in.txt"}, cmd: `$PY -c '
import hashlib, sys
h, n = hashlib.sha256(), 0
with open(sys.argv[1]) as f:
    for line in f:
        h.update(line.encode()); n += 1
print(n, h.hexdigest())' "$D/in.txt" > "$OUT"`},
	// a database and an HDF5 file as inputs
	{name: "sqlite3", needs: []string{"sqlite3"}, inputs: []string{"in.db"}, cmd: `sqlite3 "$D/in.db" 'select count(*), sum(x), max(s) from t; select s from t where x = 4242; pragma integrity_check;' > "$OUT"`,
		differs: map[string]string{"NoUpdate": "SQLite takes the database's size from fstat: 'database disk image is malformed'"}},
	{name: "h5py", needs: []string{corpusPython}, inputs: []string{"in.h5"}, cmd: `$PY -c '
import sys, h5py
with h5py.File(sys.argv[1], "r") as f:
    print(f["x"][:].sum(), f["x"].attrs["unit"], f["g/y"][:].sum())' "$D/in.h5" > "$OUT"`,
		differs: map[string]string{"NoUpdate": "HDF5 compares the file's size with the end its superblock records: 'truncated file'"}},
	// the 1000 Genomes workflow's tools (Debian packages tabix, bcftools, samtools)
	{name: "bgzip", needs: []string{"bgzip"}, inputs: []string{"in.vcf"}, cmd: `bgzip -c "$D/in.vcf" > "$OUT"`},
	{name: "bgzip-d", needs: []string{"bgzip"}, inputs: []string{"in.vcf.gz"}, cmd: `bgzip -dc "$D/in.vcf.gz" > "$OUT"`},
	{name: "tabix", needs: []string{"tabix"}, inputs: []string{"in.vcf.gz", "in.vcf.gz.tbi"}, cmd: `tabix -h "$D/in.vcf.gz" 1:200000-600000 > "$OUT"`},
	{name: "bcftools-query", needs: []string{"bcftools"}, inputs: []string{"in.vcf.gz"}, cmd: `bcftools query -f '%CHROM\t%POS\t%ID\t%REF\t%ALT\t%INFO/AC[\t%GT]\n' "$D/in.vcf.gz" > "$OUT"`,
		warns: map[string]string{"NoUpdate": htslibEOF}},
	{name: "bcftools-view", needs: []string{"bcftools"}, inputs: []string{"in.vcf.gz", "in.vcf.gz.tbi"}, cmd: `bcftools view --no-version -H -r 1:200000-600000 "$D/in.vcf.gz" > "$OUT"`,
		differs: map[string]string{"NoUpdate": htslibEOF + "; bcftools view -r makes it an error, exit 6"}},
	{name: "bcftools-view-all", needs: []string{"bcftools"}, inputs: []string{"in.vcf.gz"}, cmd: `bcftools view --no-version "$D/in.vcf.gz" > "$OUT"`,
		differs: map[string]string{"NoUpdate": htslibEOF + "; bcftools view fails at the input's end, exit 6"}},
	// the workaround docs/semantics.md gives for bcftools view of a NoUpdate input: read it
	// from a pipe, which htslib never seeks (its end is not looked at when it is opened)
	{name: "bcftools-view-pipe", needs: []string{"bcftools"}, inputs: []string{"in.vcf.gz"}, cmd: `cat "$D/in.vcf.gz" | bcftools view --no-version - > "$OUT"`},
	{name: "bcftools-stats", needs: []string{"bcftools"}, inputs: []string{"in.vcf.gz"}, cmd: `bcftools stats "$D/in.vcf.gz" | grep -v -e '^#' -e '^ID' > "$OUT"`,
		warns: map[string]string{"NoUpdate": htslibEOF}},
	{name: "samtools-view", needs: []string{"samtools"}, inputs: []string{"in.bam"}, cmd: `samtools view --no-PG -h "$D/in.bam" > "$OUT"`,
		warns: map[string]string{"NoUpdate": htslibEOF}},
	{name: "samtools-flagstat", needs: []string{"samtools"}, inputs: []string{"in.bam"}, cmd: `samtools flagstat "$D/in.bam" > "$OUT"`,
		warns: map[string]string{"NoUpdate": htslibEOF}},
	{name: "samtools-sort", needs: []string{"samtools"}, inputs: []string{"in.bam"}, cmd: `samtools sort --no-PG -n -O sam -T "$SCRATCH/sort" -o "$OUT" "$D/in.bam"`,
		warns: map[string]string{"NoUpdate": htslibEOF}},
	// a tree as input: a Directory, its listing ends when it is committed
	{name: "tar-c-dir", needs: []string{"tar"}, inputs: corpusTree, tree: "tree", cmd: `tar -cf "$OUT" -C "$D" tree`,
		decode:  `mkdir "$F.x" && tar -xf "$F" -C "$F.x" && cd "$F.x" && find . | LC_ALL=C sort && find . -type f | LC_ALL=C sort | xargs sha256sum`,
		differs: map[string]string{"NoUpdate": "tar archives as many bytes of each file as stat said, exit 1: 'file changed as we read it'"}},
	{name: "cp-r", needs: []string{"cp"}, inputs: corpusTree, tree: "tree", cmd: `cp -r "$D/tree" "$SCRATCH/t"; cd "$SCRATCH/t"; find . | LC_ALL=C sort > "$OUT"; find . -type f | LC_ALL=C sort | xargs sha256sum >> "$OUT"`},
	{name: "rsync-a", needs: []string{"rsync"}, inputs: corpusTree, tree: "tree", cmd: `rsync -a "$D/tree/" "$SCRATCH/t/"; cd "$SCRATCH/t"; find . | LC_ALL=C sort > "$OUT"; find . -type f | LC_ALL=C sort | xargs sha256sum >> "$OUT"`,
		differs: map[string]string{"NoUpdate": "rsync copies as many bytes of each file as stat said, silently"}},
	{name: "find", needs: []string{"find"}, inputs: corpusTree, tree: "tree", cmd: `cd "$D"; find tree -type f -printf '%p %s\n' -o -printf '%p %y\n' | LC_ALL=C sort > "$OUT"`,
		differs: map[string]string{"NoUpdate": "find prints the sizes written so far (stat)"}},
}

// corpusTree is the tree of the rows that read a directory.
var corpusTree = []string{"tree/a.txt", "tree/noise.bin", "tree/sub/c.txt", "tree/.hidden"}

// htslibEOF is why htslib's programs warn under NoUpdate.
const htslibEOF = "htslib looks for the BGZF end-of-file block at the file's end when it opens it: 'EOF marker is absent'"

// corpusFire is a firing rule the rows run under, with the short name of their files'
// directory.
type corpusFire struct{ short, rule string }

// corpusFires are the firing rules every row runs under, one run each.
var corpusFires = []corpusFire{{"u", "Update"}, {"n", "NoUpdate"}}

// needPrograms fails t, naming the first of progs that is not installed, with where it
// comes from; under -short it skips t instead, naming it.
func needPrograms(t *testing.T, progs ...string) {
	t.Helper()
	for _, p := range progs {
		if _, err := exec.LookPath(p); err != nil {
			if testing.Short() {
				t.Skipf("%s is not installed", p)
			}
			t.Fatalf("%s is needed (hack/install-deps.sh installs it): %v", p, err)
		}
	}
	for _, p := range progs {
		if p != corpusPython {
			continue
		}
		if out, err := exec.Command(corpusPython, "-c", "import h5py").CombinedOutput(); err != nil {
			if testing.Short() {
				t.Skipf("h5py is not installed for %s", corpusPython)
			}
			t.Fatalf("h5py is needed for %s (hack/install-deps.sh installs python3-h5py): %v %s", corpusPython, err, out)
		}
		break
	}
}

// corpusSources writes the corpus's input files into dir: text, a tar and a cpio archive
// of a small tree, an SQLite database, an HDF5 file, a VCF (plain, bgzipped and indexed)
// and a BAM file, each a few MiB so that they stream. They are made with the programs
// themselves.
func corpusSources(t *testing.T, dir string) {
	t.Helper()
	rnd := rand.New(rand.NewSource(1))
	var txt bytes.Buffer
	for i := 0; txt.Len() < 2<<20; i++ {
		fmt.Fprintf(&txt, "%07d %s %d\n", (i*7919)%1000003, []string{"alpha", "beta", "gamma", "delta"}[i%4], i)
	}
	write := func(name string, data []byte) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("in.txt", txt.Bytes())
	noise := make([]byte, 1<<20)
	rnd.Read(noise)
	write("tree/a.txt", txt.Bytes()[:1<<20])
	write("tree/noise.bin", noise)
	write("tree/sub/c.txt", txt.Bytes()[1<<20:])
	write("tree/.hidden", []byte("h\n"))

	var vcf bytes.Buffer
	vcf.WriteString("##fileformat=VCFv4.2\n##contig=<ID=1,length=249250621>\n" +
		"##INFO=<ID=AC,Number=A,Type=Integer,Description=\"Allele count\">\n" +
		"##FORMAT=<ID=GT,Number=1,Type=String,Description=\"Genotype\">\n" +
		"#CHROM\tPOS\tID\tREF\tALT\tQUAL\tFILTER\tINFO\tFORMAT\tHG00096\tHG00097\tHG00099\tHG00100\n")
	gts := []string{"0|0", "0|1", "1|0", "1|1"}
	bases := "ACGT"
	for pos := 100; vcf.Len() < 3<<20; pos += 7 + rnd.Intn(20) {
		ref := bases[rnd.Intn(4)]
		alt := bases[(strings.IndexByte(bases, ref)+1+rnd.Intn(3))%4]
		fmt.Fprintf(&vcf, "1\t%d\trs%d\t%c\t%c\t100\tPASS\tAC=%d\tGT\t%s\t%s\t%s\t%s\n", pos, pos*3, ref, alt, rnd.Intn(8),
			gts[rnd.Intn(4)], gts[rnd.Intn(4)], gts[rnd.Intn(4)], gts[rnd.Intn(4)])
	}
	write("in.vcf", vcf.Bytes())

	var sam bytes.Buffer
	sam.WriteString("@HD\tVN:1.6\tSO:coordinate\n@SQ\tSN:1\tLN:249250621\n")
	seq, qual := make([]byte, 100), bytes.Repeat([]byte("I"), 100)
	for i, pos := 0, 1000; sam.Len() < 4<<20; i, pos = i+1, pos+rnd.Intn(50) {
		for k := range seq {
			seq[k] = bases[rnd.Intn(4)]
		}
		flag := []int{0, 16, 99, 147, 4}[rnd.Intn(5)]
		fmt.Fprintf(&sam, "read%06d\t%d\t1\t%d\t60\t100M\t*\t0\t0\t%s\t%s\n", i, flag, pos, seq, qual)
	}
	write("in.sam", sam.Bytes())

	sh := func(script string) {
		t.Helper()
		cmd := exec.Command("/bin/sh", "-c", "set -e; "+script)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("making the corpus's inputs: %s: %v\n%s", script, err, out)
		}
	}
	sh(`tar -cf in.tar -C tree .`)
	sh(`cd tree && find . | LC_ALL=C sort | cpio -o -H newc --quiet > ../in.cpio`)
	sh(`bgzip -c in.vcf > in.vcf.gz && tabix -p vcf in.vcf.gz`)
	sh(`samtools view --no-PG -b -o in.bam in.sam`)
	sh(`sqlite3 in.db "create table t(x integer, s text); begin;
  with recursive c(i) as (select 1 union all select i+1 from c where i < 100000)
  insert into t select i, printf('%08d-%s', i*7919 % 100003, hex(randomblob(4))) from c; commit; create index ts on t(s);"`)
	sh(corpusPython + ` -c '
import h5py, numpy
with h5py.File("in.h5", "w") as f:
    d = f.create_dataset("x", data=numpy.arange(300000, dtype="f8"), chunks=(32768,))
    d.attrs["unit"] = "m"
    f.create_group("g").create_dataset("y", data=numpy.ones((200, 200)))'`)
}

// corpusConsumer is the script of a row's consumer: it runs the row's cmd with the
// variables set by prefix, and writes cmd's exit code and error output to $STATUS. It
// always exits 0: the test compares the status with tmpfs's.
func corpusConsumer(prefix string, r corpusRow) string {
	return prefix + `PY=` + corpusPython + `
mkdir -p "$SCRATCH" "$(dirname "$OUT")"
( set -e
` + r.cmd + `
) 2> "$SCRATCH.err"
rc=$?
{ echo "exit $rc"; cat "$SCRATCH.err"; } > "$STATUS"
`
}

// corpusWorkflow is the Workflow of one corpus run, under one firing rule: for every row, a
// producer step that writes the row's inputs (from $SRC, in four pieces each through one
// descriptor, OnClose) once its consumer has started, and a consumer step that runs the
// program. The consumer says it has started through a file of its own (ready/...), which
// the producer waits for: the program runs before its input exists. Steps alternate
// producer, consumer, so on two nodes every consumer runs on the other node.
func corpusWorkflow(t *testing.T, rows []corpusRow, src string, fire corpusFire, nodes int) []byte {
	t.Helper()
	type m = map[string]any
	var steps []m
	var permanent []string
	step := func(name, script string, inputs []string, outputs []m) m {
		return m{"name": name, "inputs": inputs, "outputs": outputs,
			"template": m{"spec": m{"containers": []m{{"name": "main", "image": "x", "command": []string{"/bin/sh", "-c", script}}}}}}
	}
	for _, r := range rows {
		id := fire.short + "-" + r.name
		dir := fire.short + "/" + r.name
		ready := "ready/" + id
		var files []string
		var outs []m
		if r.tree != "" {
			files = []string{dir + "/" + r.tree}
			outs = []m{{"path": files[0], "type": "Directory", "commit": m{"rule": "OnTermination"}, "fire": fire.rule}}
		} else {
			for _, in := range r.inputs {
				files = append(files, dir+"/"+in)
				outs = append(outs, m{"path": dir + "/" + in, "commit": m{"rule": "OnClose"}, "fire": fire.rule})
			}
		}
		producer := `set -e
SRC=` + src + `; D="$SLUICE_DIR/` + dir + `"
cat "$SLUICE_DIR/` + ready + `" > /dev/null
mkdir -p "$D"
for f in ` + strings.Join(r.inputs, " ") + `; do
  size=$(stat -c %s "$SRC/$f"); piece=$(( (size + 3) / 4 ))
  mkdir -p "$(dirname "$D/$f")"
  exec 3> "$D/$f"
  for i in 0 1 2 3; do dd if="$SRC/$f" bs=$piece skip=$i count=1 status=none >&3; sleep 0.5; done
  exec 3>&-
done
`
		steps = append(steps, step("p-"+id, producer, []string{ready}, outs))
		out, status := "out/"+id, "out/"+id+".status"
		consumer := `mkdir -p "$SLUICE_DIR/ready" && : > "$SLUICE_DIR/` + ready + `"
` + corpusConsumer(`D="$SLUICE_DIR/`+dir+`"; OUT="$SLUICE_DIR/`+out+`"; STATUS="$SLUICE_DIR/`+status+`"; SCRATCH="$SLUICE_DIR/scratch/`+id+`"
`, r)
		steps = append(steps, step("c-"+id, consumer, files, []m{
			{"path": ready, "commit": m{"rule": "OnClose"}},
			{"path": out}, {"path": status}}))
		permanent = append(permanent, out, status)
	}
	data, err := json.Marshal(m{"apiVersion": "sluice.io/v1alpha1", "kind": "Workflow",
		"metadata": m{"name": "corpus"}, "spec": m{"steps": steps, "permanent": permanent}})
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// corpusResult returns what of a row's result file is compared: its bytes, or what the
// row's decode script prints of it.
func corpusResult(t *testing.T, r corpusRow, file string) []byte {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil || r.decode == "" {
		return b
	}
	cmd := exec.Command("/bin/sh", "-c", r.decode)
	cmd.Env = append(os.Environ(), "F="+file)
	out, err := cmd.Output()
	if err != nil {
		return append(out, fmt.Sprintf("\n(decoding failed: %v)", err)...)
	}
	return out
}

// Unmodified programs run as consumers that start before their input exists, under
// Update and NoUpdate, on one node and on two (every consumer on the other node than its
// producer), with FUSE passthrough where the kernel offers it and without: each gives
// what it gives on the finished file on a tmpfs, byte for byte (or, for archives, the
// same listing and contents). A row that differs under a firing rule for a documented
// reason (docs/semantics.md, "Differences from tmpfs") says so in corpusRows.
func TestProgramCorpus(t *testing.T) {
	var progs []string
	for _, r := range corpusRows {
		progs = append(progs, r.needs...)
	}
	needPrograms(t, append(progs, "dd", "bgzip", "tabix", "samtools", "sqlite3", "tar", "cpio")...)
	testenv.Root(t, "mounts a tmpfs and runs workflows in FUSE views")

	src := t.TempDir()
	corpusSources(t, src)

	// the programs on the finished files, on a tmpfs
	ref := t.TempDir()
	if err := unix.Mount("tmpfs", ref, "tmpfs", 0, "size=512m"); err != nil {
		t.Fatalf("mounting the tmpfs to compare with: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(ref, unix.MNT_DETACH) })
	want := map[string][]byte{}
	wantStatus := map[string]string{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 2)
	for _, r := range corpusRows {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			d := filepath.Join(ref, r.name)
			cp := exec.Command("cp", append(append([]string{"--parents"}, r.inputs...), d)...)
			cp.Dir = src
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Error(err)
				return
			}
			if out, err := cp.CombinedOutput(); err != nil {
				t.Errorf("%s: copying its inputs to the tmpfs: %v %s", r.name, err, out)
				return
			}
			out := filepath.Join(ref, "out", r.name)
			script := corpusConsumer(fmt.Sprintf("D=%s; OUT=%s; STATUS=%s.status; SCRATCH=%s\n", d, out, out, filepath.Join(ref, "scratch", r.name)), r)
			if b, err := exec.Command("/bin/sh", "-c", script).CombinedOutput(); err != nil {
				t.Errorf("%s on tmpfs: %v %s", r.name, err, b)
				return
			}
			st, _ := os.ReadFile(out + ".status")
			res := corpusResult(t, r, out)
			mu.Lock()
			defer mu.Unlock()
			want[r.name], wantStatus[r.name] = res, string(st)
		}()
	}
	wg.Wait()
	for _, r := range corpusRows {
		if wantStatus[r.name] != "exit 0\n" || len(want[r.name]) == 0 {
			t.Fatalf("%s on tmpfs: %q, %d bytes of result", r.name, wantStatus[r.name], len(want[r.name]))
		}
	}

	// two runs at a time: each waits much of its time on its producers' pauses
	runs := make(chan struct{}, 2)
	t.Run("runs", func(t *testing.T) {
		for _, fire := range corpusFires {
			for _, nodes := range []int{1, 2} {
				wf, rules := load(t, "corpus.yaml", corpusWorkflow(t, corpusRows, src, fire, nodes))
				for _, pt := range []streamfs.PassthroughMode{streamfs.PassthroughAuto, streamfs.PassthroughOff} {
					t.Run(fmt.Sprintf("%s/nodes=%d/passthrough=%s", fire.rule, nodes, pt), func(t *testing.T) {
						t.Parallel()
						runs <- struct{}{}
						defer func() { <-runs }()
						corpusRun(t, wf, rules, fire, nodes, pt, want, wantStatus)
					})
				}
			}
		}
	})
}

// corpusRun runs the corpus's workflow wf under fire on nodes nodes with passthrough pt,
// and compares each row's exit code, error output and result with tmpfs's (want,
// wantStatus by row).
func corpusRun(t *testing.T, wf *v1alpha1.Workflow, rules *semantics.RuleSet, fire corpusFire, nodes int, pt streamfs.PassthroughMode, want map[string][]byte, wantStatus map[string]string) {
	tmp := t.TempDir()
	out := filepath.Join(tmp, "out")
	start := time.Now()
	_, err := Run(context.Background(), wf, rules, Options{WorkDir: filepath.Join(tmp, "work"), OutDir: out,
		Nodes: nodes, Passthrough: pt, Timeout: 3 * time.Minute, WaitTimeout: time.Minute})
	t.Logf("the run took %v", time.Since(start).Round(time.Millisecond))
	if err != nil {
		// a failed run is a failure unless it names rows, each with a known defect
		var known bool
		for _, m := range regexp.MustCompile(`(?:out/|[cp]-)`+fire.short+`-([a-z0-9-]+)`).FindAllStringSubmatch(err.Error(), -1) {
			name := m[1]
			if i := strings.LastIndexByte(name, '-'); i > 0 && !slices.ContainsFunc(corpusRows, func(r corpusRow) bool { return r.name == name }) {
				name = name[:i] // an instance's name: the step's, then its index
			}
			i := slices.IndexFunc(corpusRows, func(r corpusRow) bool { return r.name == name })
			_, bug := corpusRows[max(i, 0)].bug(fire.rule, nodes)
			if known = i >= 0 && bug; !known {
				break
			}
		}
		if known {
			t.Logf("the run failed, naming only rows with known defects: %v", err)
		} else {
			t.Errorf("the run failed: %v", err)
		}
	}
	for _, r := range corpusRows {
		id := fire.short + "-" + r.name
		file := filepath.Join(out, "out", id)
		st, _ := os.ReadFile(file + ".status")
		code, stderr, _ := strings.Cut(string(st), "\n")
		wantCode, wantStderr, _ := strings.Cut(wantStatus[r.name], "\n")
		got := corpusResult(t, r, file)
		same := code == wantCode && bytes.Equal(got, want[r.name])
		if same && stderr == wantStderr {
			continue
		}
		msg := fmt.Sprintf("%s under %s: %s, %d bytes of result, error output %q; on tmpfs %s, %d bytes, %q",
			r.name, fire.rule, code, len(got), stderr, wantCode, len(want[r.name]), wantStderr)
		if why, ok := r.differs[fire.rule]; ok {
			t.Logf("%s (documented: %s)", msg, why)
		} else if why, ok := r.warns[fire.rule]; ok && same {
			t.Logf("%s (documented: %s)", msg, why)
		} else if why, ok := r.bug(fire.rule, nodes); ok {
			t.Logf("%s (KNOWN DEFECT, to fix: %s)", msg, why)
		} else {
			t.Error(msg)
		}
	}
}
