#!/usr/bin/env bash
# Installs the system packages the tests need on a fresh Debian machine (idempotent):
# make, git, and what the POSIX tests use: a C compiler (pjdfstest), perl's prove, setpriv
# (tests as a non-root user), GNU tar, and the real programs the filesystem tests run in
# steps: sqlite3, rsync, sort, busybox (its cat copies with sendfile) and Python's h5py. Go itself must already be on PATH.
set -euo pipefail
need=()
command -v make >/dev/null || need+=(make)
command -v git >/dev/null || need+=(git)
command -v cc >/dev/null || need+=(gcc libc6-dev)
command -v prove >/dev/null || need+=(perl)
command -v setpriv >/dev/null || need+=(util-linux)
command -v tar >/dev/null || need+=(tar)
command -v sqlite3 >/dev/null || need+=(sqlite3)
command -v rsync >/dev/null || need+=(rsync)
command -v busybox >/dev/null || need+=(busybox-static)
command -v sort >/dev/null || need+=(coreutils)
/usr/bin/python3 -c 'import h5py' 2>/dev/null || need+=(python3-h5py)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: missing ${need[*]}; install them or run as root" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
fi
command -v go >/dev/null || { echo "install-deps: Go is required (https://go.dev/dl)" >&2; exit 1; }
go version
