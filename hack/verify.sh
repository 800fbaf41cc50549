#!/usr/bin/env bash
# Fails when generated files are stale, go.mod/go.sum are not tidy, go vet or the linters
# of .golangci.yml complain, gofmt would change a file, a Go file has more than 800
# lines, an exported identifier lacks a doc comment, or govulncheck finds a known
# vulnerability reachable from the code.
set -euo pipefail
cd "$(dirname "$0")/.."

status=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Generated code and CRDs must match what `make generate` produces now.
mkdir -p "$tmp/chart"
cp -r api crds "$tmp/"
cp -r charts/sluice/crds "$tmp/chart/"
make -s generate >/dev/null
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
for values in "--set storage.trial=true" "--set nats.bundled=false,nats.url=nats://nats.example:4222,storage.bundled=false,storage.endpoint=s3.example:443,storage.secure=true,storage.secretKey=verify-secret-key,certManager.enabled=true,tls.enabled=true,tls.issuer=external" "--set storage.trial=true,tls.enabled=true,nats.persistence.enabled=true"; do
  # shellcheck disable=SC2086
  if ! "$helm" template sluice charts/sluice -n sluice-system $values >"$tmp/render.out" 2>&1; then
    echo "verify: helm template charts/sluice $values failed:" >&2
    cat "$tmp/render.out" >&2
    status=1
  fi
done

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

# No hand-written Go file over 800 lines (issue 34): a file that grows past it is split by
# responsibility. Generated files (zz_generated*) are not counted.
long=$(for f in $files; do case $f in *zz_generated*) continue ;; esac; n=$(wc -l <"$f"); if [ "$n" -gt 800 ]; then echo "$f: $n lines"; fi; done)
if [ -n "$long" ]; then
  echo "verify: Go files over 800 lines; split them by responsibility:" >&2
  echo "$long" >&2
  status=1
fi

go vet ./... || status=1
go vet -tags e2e ./e2e/ || status=1
# errorlint, revive, staticcheck, gocritic and more (.golangci.yml; pinned in hack/tools.sh).
"$(./hack/tools.sh golangci-lint)" run ./... || status=1
go run ./hack/doccheck . || status=1

# No known vulnerability reachable from the module's code: govulncheck (pinned) against a
# database built from golang.org/x/vulndb on the module proxy by the CI tools'
# vulndb/build.sh (the usual database host is not reachable there), cached for a day in
# $SLUICE_CACHE/vulndb. It runs under the toolchain go.mod names (GOTOOLCHAIN=auto), the
# one releases are built with, so the standard library is judged at that version. A clone
# without ../shared/tools skips it, saying so.
GOVULNCHECK_VERSION=v1.9.0
vulndb_build=${VULNDB_BUILD:-../shared/tools/vulndb/build.sh}
if [ -x "$vulndb_build" ] || [ -f "$vulndb_build" ]; then
  vulndb="${SLUICE_CACHE:-$HOME/.cache/sluice}/vulndb"
  if [ ! -f "$vulndb/index/db.json" ] || [ -n "$(find "$vulndb/index/db.json" -mmin +1440)" ]; then
    bash "$vulndb_build" "$vulndb.tmp" >"$tmp/vulndb.out" 2>&1 || { cat "$tmp/vulndb.out" >&2; status=1; }
    if [ -f "$vulndb.tmp/index/db.json" ]; then rm -rf "$vulndb" && mv "$vulndb.tmp" "$vulndb"; fi
  fi
  if [ -f "$vulndb/index/db.json" ] && ! GOTOOLCHAIN=auto go run "golang.org/x/vuln/cmd/govulncheck@$GOVULNCHECK_VERSION" -db "file://$vulndb" ./... >"$tmp/vuln.out" 2>&1; then
    echo "verify: govulncheck reports reachable vulnerabilities (or failed):" >&2
    cat "$tmp/vuln.out" >&2
    status=1
  fi
else
  echo "verify: skipping govulncheck: $vulndb_build (the CI tools' vulnerability database builder) is absent" >&2
fi

# docs/architecture.md's package graph is the module's (hack/pkggraph.sh).
if ! diff <(./hack/pkggraph.sh) <(sed -n '/^<!-- pkggraph -->$/,/^<!-- \/pkggraph -->$/p' docs/architecture.md | sed '1d;$d') >"$tmp/graph.diff"; then
  echo "verify: docs/architecture.md's package graph is stale; run hack/pkggraph.sh -w:" >&2
  cat "$tmp/graph.diff" >&2
  status=1
fi
exit $status
