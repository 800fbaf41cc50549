#!/usr/bin/env bash
# Runs every native fuzz target for a short budget (default 20s each). New crashers are
# written by `go test` under the package's testdata/fuzz/ and replayed by every later
# `go test` run: commit them as regression cases.
set -euo pipefail
cd "$(dirname "$0")/.."
budget=${1:-20s}
for pkg in $(go list ./...); do
  dir=$(go list -f '{{.Dir}}' "$pkg")
  for target in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //' | sort -u); do
    echo "fuzz: $pkg $target ($budget)"
    ./hack/heartbeat.sh "fuzz: $pkg $target" go test -run='^$' -fuzz="^${target}\$" -fuzztime="$budget" "$pkg"
  done
done
