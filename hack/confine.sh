#!/usr/bin/env bash
# hack/confine.sh COMMAND [ARG...] runs COMMAND (make integration's `go test`) and fails,
# naming them, when it left files outside its tests' temporary directories (t.TempDir())
# and the caches `make test` documents (README: $SLUICE_CACHE, default ~/.cache/sluice;
# Go's module and build caches; envtest's port reservations, a file a port, in
# ~/.cache/kubebuilder-envtest). A test writes only where it was given a directory.
#
# It lists before and after COMMAND (and reports what appeared in):
#   - the top of the file system (/data/, /srv/, ...) and of /tmp (less the go command's
#     own go-build* work directories, which it removes), and, two levels deep, /data,
#     /etc, /opt, /srv, /mnt, /var/lib, /var/tmp;
#   - $HOME, and two levels deep its .cache, .config and .local (less the caches);
#   - the repository: `git status --porcelain --ignored` (files made or changed in it).
# TMPDIR stays /tmp: a test's socket paths below t.TempDir() must fit in 108 bytes, and
# a longer TMPDIR breaks the CSI driver's. It exits with COMMAND's status if that failed,
# else 1 if anything appeared, else 0. What another program writes in those places
# meanwhile is reported too: on a machine shared with other jobs, a line may be theirs.
set -uo pipefail

if [ $# -lt 1 ]; then
  echo "usage: $0 COMMAND [ARG...]" >&2
  exit 2
fi
repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${SLUICE_CACHE:-$HOME/.cache/sluice}
gocache=$(go env GOCACHE 2>/dev/null)
gomodcache=$(go env GOMODCACHE 2>/dev/null)
gopath=$(go env GOPATH 2>/dev/null)
envtest=${XDG_CACHE_HOME:-$HOME/.cache}/kubebuilder-envtest # controller-runtime's addr package
work=$(mktemp -d "${TMPDIR:-/tmp}/sluice-confine.XXXXXX") # the lists
trap 'rm -rf "$work"' EXIT

# snapshot lists the places above, one path a line, sorted.
snapshot() {
  {
    find / -mindepth 1 -maxdepth 1 2>/dev/null
    find "${TMPDIR:-/tmp}" -mindepth 1 -maxdepth 1 -not -name 'go-build*' 2>/dev/null
    for d in /data /etc /opt /srv /mnt /var/lib /var/tmp; do
      [ -d "$d" ] && find "$d" -mindepth 1 -maxdepth 2 2>/dev/null
    done
    find "$HOME" -mindepth 1 -maxdepth 1 2>/dev/null
    for d in "$HOME/.cache" "$HOME/.config" "$HOME/.local"; do
      [ -d "$d" ] && find "$d" -mindepth 1 -maxdepth 2 2>/dev/null
    done
    git -C "$repo" status --porcelain --ignored --untracked-files=normal 2>/dev/null | sed "s|^|$repo: |"
  } | awk -v c="$cache" -v g="$gocache" -v m="$gomodcache" -v p="$gopath" -v w="$work" -v e="$envtest" '
    function under(path, dir) { return dir != "" && (path == dir || index(path, dir "/") == 1) }
    !(under($0, c) || under($0, g) || under($0, m) || under($0, p) || under($0, w) || under($0, e))' | LC_ALL=C sort -u
}

snapshot >"$work/before"
"$@"
status=$?
snapshot >"$work/after"

appeared=$(LC_ALL=C comm -13 "$work/before" "$work/after")
if [ -n "$appeared" ]; then
  echo "confine: the tests wrote outside their temporary directories (t.TempDir()) and the documented caches:" >&2
  sed 's/^/    /' <<<"$appeared" | head -n 40 >&2
  [ "$status" -ne 0 ] || status=1
fi
exit $status
