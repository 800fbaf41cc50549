#!/usr/bin/env bash
# Builds the real servers the tests run, at pinned versions, from the Go module proxy into
# $SLUICE_CACHE/bin (default ~/.cache/sluice/bin), reusing what is already there:
#   nats-server  (JetStream; embedded in-process too, the real binary for failure tests)
#   minio        (S3-compatible object storage; its community edition is archived, so also:)
#   versitygw    (a maintained S3 server, Apache-2.0, on a POSIX directory: the second S3
#                 implementation the objstore, runner and controller tests run against)
# All are static (CGO off), so the local cluster can put them into images as they are.
# $SLUICE_CACHE/bin/<name> links to the pinned build; internal/servers starts them.
set -euo pipefail

NATS_VERSION=v2.12.15 # >= 2.12.6: GO-2026-4826 (Nats-Trace-Dest into another account's stream)
MINIO_VERSION=v0.0.0-20260212201848-7aac2a2c5b7c
VERSITYGW_VERSION=v1.8.0

cache=${SLUICE_CACHE:-$HOME/.cache/sluice}
bin="$cache/bin"
mkdir -p "$bin"

build() { # name module version
  local name=$1 module=$2 version=$3
  local dir="$bin/$name-$version-static"
  if [ ! -x "$dir/$name" ]; then
    echo "servers: building $name $version (cached in $dir)" >&2
    rm -rf "$dir.tmp"
    CGO_ENABLED=0 GOBIN="$dir.tmp" GOFLAGS=-mod=mod "$(dirname "$0")/heartbeat.sh" "servers: building $name $version" go install "$module@$version"
    mv "$dir.tmp" "$dir"
  fi
  ln -sfn "$dir/$name" "$bin/$name"
}

case "${1:-build}" in
  build)
    build nats-server github.com/nats-io/nats-server/v2 "$NATS_VERSION"
    build minio github.com/minio/minio "$MINIO_VERSION"
    build versitygw github.com/versity/versitygw/cmd/versitygw "$VERSITYGW_VERSION"
    ;;
  *)
    echo "usage: $0 build" >&2
    exit 2
    ;;
esac
