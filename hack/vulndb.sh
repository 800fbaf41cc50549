#!/usr/bin/env bash
# hack/vulndb.sh VERSION prints the directory of a Go vulnerability database for
# `govulncheck -db file://DIR`, built (once per version, hack/vulndb) from the OSV entries
# of golang.org/x/vulndb@VERSION, which the Go module proxy serves like any module:
# $SLUICE_CACHE/govulndb/<version> (default ~/.cache/sluice). VERSION "latest" is resolved
# on the proxy. Databases of other versions are removed. make verify runs it.
set -euo pipefail
cd "$(dirname "$0")/.."

version=${1:?usage: hack/vulndb.sh VERSION}
# Not .../vulndb: older checkouts keep a database of another layout there.
cache=${SLUICE_CACHE:-$HOME/.cache/sluice}/govulndb
mod=golang.org/x/vulndb
mkdir -p "$cache"
if [ "$version" = latest ]; then
  version=$( (cd "$cache" && go list -m -json "$mod@latest") | sed -n 's/^[[:space:]]*"Version": "\(.*\)",*$/\1/p')
  [ -n "$version" ] || { echo "vulndb: no latest version of $mod on the module proxy" >&2; exit 1; }
fi
db="$cache/$version"
if [ ! -f "$db/index/db.json" ]; then
  echo "vulndb: building the vulnerability database from $mod@$version (cached in $db)" >&2
  # From outside the module, so that nothing of go.mod or go.sum changes.
  src=$( (cd "$cache" && "$OLDPWD/hack/heartbeat.sh" "vulndb: downloading $mod@$version" go mod download -json "$mod@$version") |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')
  [ -d "$src/data/osv" ] || { echo "vulndb: $mod@$version has no data/osv" >&2; exit 1; }
  rm -rf "$db.tmp"
  go run ./hack/vulndb "$src/data/osv" "$db.tmp" >&2
  rm -rf "$db"
  mv "$db.tmp" "$db"
fi
# Only this version's database stays.
for old in "$cache"/* "$cache"/.[!.]*; do
  [ -e "$old" ] && [ "$old" != "$db" ] && rm -rf "$old"
done
echo "$db"
