#!/usr/bin/env bash
# Fails when generated files are stale, go.mod/go.sum are not tidy, go vet's analyzers or the linters
# of .golangci.yml complain, gofmt would change a file, a Go file has more than 800
# lines, an exported identifier lacks a doc comment, or govulncheck finds a known
# vulnerability reachable from the code. Its long steps print a line at least once a
# minute (hack/heartbeat.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

status=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Generated code and CRDs must match what `make generate` produces now.
mkdir -p "$tmp/chart"
cp -r api crds "$tmp/"
cp -r charts/sluice/crds "$tmp/chart/"
./hack/heartbeat.sh "verify: make generate" make -s generate >/dev/null
if ! diff -r "$tmp/api" api >/dev/null || ! diff -r "$tmp/crds" crds >/dev/null || ! diff -r "$tmp/chart/crds" charts/sluice/crds >/dev/null; then
  echo "verify: generated files are stale; run 'make generate' and commit the result:" >&2
  diff -r "$tmp/api" api >&2 || true
  diff -r "$tmp/crds" crds >&2 || true
  diff -r "$tmp/chart/crds" charts/sluice/crds >&2 || true
  status=1
fi

# The Helm chart lints and renders (helm pinned in hack/tools.sh).
helm=$(./hack/tools.sh helm)
# The defaults' trial object-storage keys are refused unless storage.trial=true
# (controller/TestHelmChartRefusesTrialStorageKeys).
if ! "$helm" lint --strict charts/sluice --set storage.trial=true >"$tmp/lint.out" 2>&1; then
  echo "verify: helm lint charts/sluice failed:" >&2
  cat "$tmp/lint.out" >&2
  status=1
fi
for values in "--set storage.trial=true" "--set nats.bundled=false,nats.url=nats://nats.example:4222,storage.bundled=false,storage.endpoint=s3.example:443,storage.secure=true,storage.secretKey=verify-secret-key,certManager.enabled=true,tls.enabled=true,tls.issuer=external" "--set storage.trial=true,nats.persistence.enabled=true" "--set storage.trial=true,tls.enabled=false"; do
  # shellcheck disable=SC2086
  if ! "$helm" template sluice charts/sluice -n sluice-system $values >"$tmp/render.out" 2>&1; then
    echo "verify: helm template charts/sluice $values failed:" >&2
    cat "$tmp/render.out" >&2
    status=1
  fi
done

# go.mod and go.sum must be what `go mod tidy` makes of them (CI builds with -mod=readonly).
# (heartbeat.sh --log shows the diff only if there is one.)
if ! ./hack/heartbeat.sh --log "$tmp/tidy.diff" "verify: go mod tidy -diff" go mod tidy -diff; then
  echo "verify: go.mod/go.sum are not tidy (the diff above); run 'go mod tidy' and commit the result" >&2
  status=1
fi

files=$(find . -name '*.go' -not -path './.git/*' -not -path './bin/*')
unformatted=$(gofmt -l $files)
if [ -n "$unformatted" ]; then
  echo "verify: gofmt would change:" >&2
  echo "$unformatted" >&2
  status=1
fi

# No hand-written Go file over 800 lines (issue 34): a file that grows past it is split by
# responsibility. Generated files (zz_generated*) are not counted.
long=$(for f in $files; do case $f in *zz_generated*) continue ;; esac; n=$(wc -l <"$f"); if [ "$n" -gt 800 ]; then echo "$f: $n lines"; fi; done)
if [ -n "$long" ]; then
  echo "verify: Go files over 800 lines; split them by responsibility:" >&2
  echo "$long" >&2
  status=1
fi

# go vet's analyzers, errorlint, revive, staticcheck, gocritic and more (.golangci.yml,
# which enables govet and the e2e build tag; pinned in hack/tools.sh). A separate
# `go vet ./...` type-checked and compiled the module again for the same analyzers: 3 to
# 4 minutes of a cold make test on 2 cores.
./hack/heartbeat.sh "verify: golangci-lint" "$(./hack/tools.sh golangci-lint)" run ./... || status=1
go run ./hack/doccheck . || status=1

# No known vulnerability reachable from the module's code: govulncheck (pinned) against a
# database hack/vulndb builds from the OSV entries of the golang.org/x/vulndb module
# (pinned below), which the Go module proxy serves like any module, so the check needs no
# other host; built once per version into $SLUICE_CACHE/govulndb/<version> (default
# ~/.cache/sluice). VULNDB_VERSION=latest checks against the newest entries instead; bump
# the pin to take them for good. It runs under the toolchain go.mod names
# (GOTOOLCHAIN=auto), the one releases are built with, so the standard library is judged
# at that version.
GOVULNCHECK_VERSION=v1.9.0
VULNDB_VERSION=${VULNDB_VERSION:-v0.0.0-20261105234957-e22db6528018}
if ! vulndb=$(./hack/vulndb.sh "$VULNDB_VERSION"); then
  echo "verify: govulncheck: no vulnerability database (hack/vulndb.sh $VULNDB_VERSION failed, above)." >&2
  echo "verify: it needs golang.org/x/vulndb from the Go module proxy (GOPROXY); where vuln.go.dev is reachable, 'go run golang.org/x/vuln/cmd/govulncheck@$GOVULNCHECK_VERSION ./...' checks against it" >&2
  status=1
elif ! GOTOOLCHAIN=auto ./hack/heartbeat.sh --log "$tmp/vuln.out" "verify: govulncheck" \
  go run "golang.org/x/vuln/cmd/govulncheck@$GOVULNCHECK_VERSION" -db "file://$vulndb" ./...; then
  echo "verify: govulncheck reports reachable vulnerabilities (or failed; its output above)" >&2
  status=1
fi

# docs/architecture.md's package graph is the module's (hack/pkggraph.sh).
if ! diff <(./hack/pkggraph.sh) <(sed -n '/^<!-- pkggraph -->$/,/^<!-- \/pkggraph -->$/p' docs/architecture.md | sed '1d;$d') >"$tmp/graph.diff"; then
  echo "verify: docs/architecture.md's package graph is stale; run hack/pkggraph.sh -w:" >&2
  cat "$tmp/graph.diff" >&2
  status=1
fi
exit $status
