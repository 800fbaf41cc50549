#!/usr/bin/env bash
# Builds the binaries of the local test cluster from the Go module proxy, at pinned
# versions, into $SLUICE_CACHE/cluster/<version>/bin (default ~/.cache/sluice), reusing
# what is already built:
#   kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl kube-proxy
#   etcd      (with kube-apiserver, envtest for the controller and webhook tests)
#   coredns   (cluster DNS, so that pods resolve Services)
#   kwok      (simulated nodes for the placement scale test, with kube-scheduler and
#             kube-controller-manager; `envtest` builds these too)
# and copies cert-manager's Certificate and Issuer CRDs (from its module, Helm template
# lines removed) into <version>/crds/cert-manager, so that the deploy test checks the
# cert-manager component against the real schemas.
# Prints the bin directory on stdout. Nothing here needs a registry or Docker.
set -euo pipefail

KUBE_VERSION=${KUBE_VERSION:-v1.35.4}
ETCD_VERSION=${ETCD_VERSION:-v3.5.21}
COREDNS_VERSION=${COREDNS_VERSION:-v1.12.4}
KWOK_VERSION=${KWOK_VERSION:-v0.8.0}
CERT_MANAGER_VERSION=${CERT_MANAGER_VERSION:-v1.16.2}

cache=${SLUICE_CACHE:-$HOME/.cache/sluice}
root="$cache/cluster/kube-$KUBE_VERSION"
bin="$root/bin"
mkdir -p "$bin" "$root/build"
export CGO_ENABLED=0 GOFLAGS=-mod=mod

log() { echo "cluster-build: $*" >&2; }
# beat [--log FILE] LABEL CMD...: CMD with a line at least once a minute naming what it
# builds (hack/heartbeat.sh); with --log, CMD's output shown only if it fails.
heartbeat="$(cd "$(dirname "$0")/.." && pwd)/heartbeat.sh"
beat() { "$heartbeat" "$@"; }

# A throwaway module that requires k8s.io/kubernetes with every staging module replaced by
# its published version (k8s.io/kubernetes's own go.mod points them at ./staging).
kube() {
  local components="kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl kube-proxy"
  local missing=""
  for c in $components; do [ -x "$bin/$c" ] || missing="$missing $c"; done
  [ -n "$missing" ] || return 0
  local mod="$root/build/kube" staging="v0.${KUBE_VERSION#v1.}"
  mkdir -p "$mod"
  (
    cd "$mod"
    local gomod
    gomod=$(beat "cluster-build: downloading k8s.io/kubernetes $KUBE_VERSION" go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
    {
      printf 'module sluice.local/kubebuild\n\ngo 1.24.0\n\nrequire k8s.io/kubernetes %s\n\nreplace (\n' "$KUBE_VERSION"
      awk '/^replace \(/{f=1;next} f&&/^\)/{f=0} f&&$1~/^k8s.io\//{print $1}' "$gomod" |
        while read -r m; do printf '\t%s => %s %s\n' "$m" "$m" "$staging"; done
      printf ')\n'
    } > go.mod
    {
      printf '//go:build tools\n\npackage tools\n\nimport (\n'
      for c in $components; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$c"; done
      printf ')\n'
    } > tools.go
    beat --log "$mod/tidy.log" "cluster-build: resolving the modules of Kubernetes $KUBE_VERSION" go mod tidy
    local minor ldf
    minor=$(echo "$KUBE_VERSION" | cut -d. -f2)
    ldf="-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1"
    ldf="$ldf -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
    ldf="$ldf -X k8s.io/client-go/pkg/version.gitVersion=$KUBE_VERSION"
    for c in $missing; do
      log "building $c $KUBE_VERSION"
      beat "cluster-build: building $c" go build -trimpath -ldflags "$ldf" -o "$bin/$c.tmp" "k8s.io/kubernetes/cmd/$c"
      mv "$bin/$c.tmp" "$bin/$c"
    done
  )
}

# tool NAME MODULE VERSION PACKAGE: a throwaway module requiring MODULE@VERSION, building
# PACKAGE (a module's own replace directives do not apply when it is a dependency).
tool() {
  local name=$1 module=$2 version=$3 pkg=$4
  [ -x "$bin/$name" ] && return 0
  local mod="$root/build/$name"
  mkdir -p "$mod"
  log "building $name $version"
  (
    cd "$mod"
    printf 'module sluice.local/%sbuild\n\ngo 1.24.0\n' "$name" > go.mod
    printf '//go:build tools\n\npackage tools\n\nimport _ "%s"\n' "$pkg" > tools.go
    beat --log "$mod/get.log" "cluster-build: resolving the modules of $name" go get "$module@$version"
    beat --log "$mod/tidy.log" "cluster-build: resolving the modules of $name" go mod tidy
    beat "cluster-build: building $name" go build -trimpath -ldflags '-s -w' -o "$bin/$name.tmp" "$pkg"
    mv "$bin/$name.tmp" "$bin/$name"
  )
}

# cert-manager's CRDs are Helm templates only in comment and label lines: drop those.
certmanager_crds() {
  local out="$root/crds/cert-manager"
  [ -f "$out/$CERT_MANAGER_VERSION" ] && return 0
  log "cert-manager $CERT_MANAGER_VERSION CRDs"
  local dir
  dir=$(beat "cluster-build: downloading cert-manager $CERT_MANAGER_VERSION" go mod download -json "github.com/cert-manager/cert-manager@$CERT_MANAGER_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  mkdir -p "$out"
  for crd in certificates issuers; do
    grep -v '{{' "$dir/deploy/crds/crd-$crd.yaml" > "$out/$crd.yaml"
  done
  touch "$out/$CERT_MANAGER_VERSION"
}

what=${1:-all}
case "$what" in
  all)
    kube
    tool etcd go.etcd.io/etcd/server/v3 "$ETCD_VERSION" go.etcd.io/etcd/server/v3
    tool coredns github.com/coredns/coredns "$COREDNS_VERSION" github.com/coredns/coredns
    tool kwok sigs.k8s.io/kwok "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok
    certmanager_crds
    ;;
  envtest)
    kube
    tool etcd go.etcd.io/etcd/server/v3 "$ETCD_VERSION" go.etcd.io/etcd/server/v3
    tool kwok sigs.k8s.io/kwok "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok
    certmanager_crds
    ;;
  *)
    echo "usage: $0 [all|envtest]" >&2
    exit 2
    ;;
esac
echo "$bin"
