#!/usr/bin/env bash
# Fails when generated files are stale, go.mod/go.sum are not tidy, go vet complains,
# gofmt would change a file, or an exported identifier lacks a doc comment.
set -euo pipefail
cd "$(dirname "$0")/.."

status=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Generated code and CRDs must match what `make generate` produces now.
cp -r api crds "$tmp/"
make -s generate >/dev/null
if ! diff -r "$tmp/api" api >/dev/null || ! diff -r "$tmp/crds" crds >/dev/null; then
  echo "verify: generated files are stale; run 'make generate' and commit the result:" >&2
  diff -r "$tmp/api" api >&2 || true
  diff -r "$tmp/crds" crds >&2 || true
  status=1
fi

# go.mod and go.sum must be what `go mod tidy` makes of them (CI builds with -mod=readonly).
if ! go mod tidy -diff >"$tmp/tidy.diff" 2>&1; then
  echo "verify: go.mod/go.sum are not tidy; run 'go mod tidy' and commit the result:" >&2
  cat "$tmp/tidy.diff" >&2
  status=1
fi

files=$(find . -name '*.go' -not -path './.git/*' -not -path './bin/*')
unformatted=$(gofmt -l $files)
if [ -n "$unformatted" ]; then
  echo "verify: gofmt would change:" >&2
  echo "$unformatted" >&2
  status=1
fi

go vet ./... || status=1
go vet -tags e2e ./e2e/ || status=1
go run ./hack/doccheck . || status=1
exit $status
