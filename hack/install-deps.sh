#!/usr/bin/env bash
# Installs, with apt, the system packages the tests run that are missing on a fresh Debian
# machine (idempotent; `make test` runs it first, `make deps` alone). Go itself must already
# be on PATH. What the tests run:
#   - the POSIX tests: a C compiler (pjdfstest), perl's prove, setpriv (tests as a
#     non-root user);
#   - the real programs the filesystem tests run unmodified in steps: compressors (gzip,
#     pigz, xz, zstd, bzip2, lz4), archivers (tar, cpio), copiers (cp, install, rsync,
#     busybox, whose cat copies with sendfile), sort, python3 with h5py, perl, sqlite3, and
#     the 1000 Genomes workflow's tools (bgzip and tabix, bcftools, samtools);
#   - ps, with which .ci/run's watchdog names what a hung phase still runs;
#   - rclone, sluice-bench's batch-rclone baseline (docs/benchmarks.md).
set -euo pipefail

# command package: the package that brings the command, installed when the command is
# missing.
programs='
make      make
git       git
cc        gcc
prove     perl
perl      perl
setpriv   util-linux
ps        procps
tar       tar
cpio      cpio
cp        coreutils
install   coreutils
sort      coreutils
gzip      gzip
pigz      pigz
xz        xz-utils
zstd      zstd
bzip2     bzip2
lz4       lz4
rsync     rsync
busybox   busybox-static
sqlite3   sqlite3
python3   python3
bgzip     tabix
tabix     tabix
bcftools  bcftools
samtools  samtools
rclone    rclone
'

need=()
while read -r cmd pkg; do
  [ -n "$cmd" ] || continue
  command -v "$cmd" >/dev/null || need+=("$pkg")
done <<<"$programs"
# cc alone does not build a C program: libc's headers and crt files come with libc6-dev.
[ -e /usr/include/stdio.h ] || need+=(libc6-dev)
# The tests run /usr/bin/python3 (not whatever python3 is first on PATH) with h5py.
/usr/bin/python3 -c 'import h5py' 2>/dev/null || need+=(python3-h5py)

if [ ${#need[@]} -gt 0 ]; then
  mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: missing ${need[*]}; install them or run as root" >&2
    exit 1
  fi
  echo "install-deps: installing ${need[*]}" >&2
  # Another apt (an unattended upgrade, a second make) may hold the lock for a while: wait
  # for it instead of failing.
  apt=(apt-get -o DPkg::Lock::Timeout=300 -o Dpkg::Use-Pty=0)
  # apt and dpkg print a screenful per package: keep it, and show it only if they fail.
  log=$(mktemp)
  trap 'rm -f "$log"' EXIT
  if ! { "${apt[@]}" update -qq && DEBIAN_FRONTEND=noninteractive "${apt[@]}" install -y -qq "${need[@]}"; } >"$log" 2>&1; then
    cat "$log" >&2
    echo "install-deps: apt-get failed to install ${need[*]}" >&2
    exit 1
  fi
fi
command -v go >/dev/null || { echo "install-deps: Go is required (https://go.dev/dl)" >&2; exit 1; }
go version
