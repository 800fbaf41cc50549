#!/usr/bin/env bash
# Builds the pinned command-line tools the checks use, from the Go module proxy, into
# $SLUICE_CACHE/bin (default ~/.cache/sluice/bin), once; prints the path of the one asked
# for:
#   hack/tools.sh helm     helm (chart lint and template in `make verify`)
#   hack/tools.sh promtool promtool (alert rule unit tests in `make verify`)
#   hack/tools.sh golangci-lint  golangci-lint (the linters of .golangci.yml in `make verify`)
set -euo pipefail

HELM_VERSION=v3.22.0
PROMETHEUS_VERSION=v0.316.0 # Prometheus's Go module version (Prometheus 3.x releases are v0.3xx.y)
GOLANGCI_LINT_VERSION=v2.15.0

cache=${SLUICE_CACHE:-$HOME/.cache/sluice}
bin="$cache/bin"
mkdir -p "$bin"

build() { # name module version [build tags]
  local name=$1 module=$2 version=$3 tags=${4:-}
  local dir="$bin/$name-$version${tags:+-$tags}"
  if [ ! -x "$dir/$name" ]; then
    echo "tools: building $name $version${tags:+ (tags $tags)} (cached in $dir)" >&2
    rm -rf "$dir.tmp"
    CGO_ENABLED=0 GOBIN="$dir.tmp" GOFLAGS=-mod=mod "$(dirname "$0")/heartbeat.sh" "tools: building $name $version" go install ${tags:+-tags "$tags"} "$module@$version" >&2
    mv "$dir.tmp" "$dir"
  fi
  echo "$dir/$name"
}

case "${1:-}" in
  helm) build helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION" ;;
  # Without Prometheus's service discovery plugins (remove_all_sd), which rule checks and
  # rule unit tests never use: the cloud SDKs they pull in were most of a cold build (5 min
  # of a first make test on 2 cores; 3 min 55 s without them, from an empty build cache).
  promtool) build promtool github.com/prometheus/prometheus/cmd/promtool "$PROMETHEUS_VERSION" remove_all_sd ;;
  golangci-lint) build golangci-lint github.com/golangci/golangci-lint/v2/cmd/golangci-lint "$GOLANGCI_LINT_VERSION" ;;
  *)
    echo "usage: $0 helm|promtool|golangci-lint" >&2
    exit 2
    ;;
esac
