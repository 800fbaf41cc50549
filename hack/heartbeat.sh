#!/usr/bin/env bash
# hack/heartbeat.sh [--log FILE] LABEL COMMAND [ARG...] runs COMMAND and, while it runs,
# writes a line on standard error every $HEARTBEAT seconds (default 50, so at least one a
# minute):
#
#   LABEL: 4m10s: building 2 packages (k8s.io/kubernetes/pkg/kubelet, ...); running internal/transport (1m05s)
#
# naming what COMMAND's processes do now, read from /proc (no ps needed): the packages the
# Go compiler builds (compile -p), the binaries it links, the test binaries that run
# (their package directories, and for how long), else COMMAND's own processes. A step
# that builds for minutes (kube-apiserver, the servers, go test's compiles) is never
# silent for long. It exits with COMMAND's status; COMMAND runs in the foreground, so
# Ctrl-C reaches it as usual. With --log, COMMAND's output goes to FILE instead, and to
# standard error only if COMMAND fails.
set -uo pipefail

log=
if [ "${1:-}" = --log ]; then
  log=${2:?--log needs a file}
  shift 2
fi
if [ $# -lt 2 ]; then
  echo "usage: $0 [--log FILE] LABEL COMMAND [ARG...]" >&2
  exit 2
fi
label=$1
shift
every=${HEARTBEAT:-50}
top=$$
tick=$(getconf CLK_TCK 2>/dev/null || echo 100)
repo=$(cd "$(dirname "$0")/.." && pwd)

# since SECONDS: "4m10s".
since() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

# doing SKIP: what the processes below this script do, but those below SKIP (the
# heartbeat itself), in one line.
doing() {
  local skip=$1 d p stat rest now
  local -A parent=() start=()
  read -r now _ </proc/uptime
  now=${now%.*}
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    read -r stat 2>/dev/null <"$d/stat" || continue
    rest=${stat##*) }
    # shellcheck disable=SC2086
    set -- $rest
    parent[$p]=$2
    start[$p]=${20}
  done
  local -a building=() other=()
  local -A running=()
  local linking=0 q args pkg dir age
  for p in "${!parent[@]}"; do
    q=${parent[$p]}
    while [ "$q" != "$top" ] && [ "$q" != "$skip" ] && [ "$q" -gt 1 ] 2>/dev/null; do
      q=${parent[$q]:-0}
    done
    [ "$q" = "$top" ] && [ "$p" != "$skip" ] || continue
    args=$(tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline") || continue
    args=${args% }
    case "$args" in
      */compile\ *)
        pkg=${args#* -p }
        building+=("${pkg%% *}")
        ;;
      */link\ *) linking=$((linking + 1)) ;;
      *.test\ * | *.test)
        dir=$(readlink "/proc/$p/cwd" 2>/dev/null) || dir=${args%% *}
        dir=${dir#"$repo"/}
        age=$((now - ${start[$p]} / tick))
        # One entry a package (a fuzz target runs several processes): the oldest.
        if [ -z "${running[$dir]:-}" ] || [ "$age" -gt "${running[$dir]}" ]; then running[$dir]=$age; fi
        ;;
      *)
        # COMMAND itself and what it runs directly (go, go mod tidy, apt-get, ...).
        [ "${parent[$p]}" = "$top" ] && other+=("${args:0:80}")
        ;;
    esac
  done
  local out=() list
  if [ ${#building[@]} -gt 0 ]; then
    list=$(printf '%s, ' "${building[@]:0:3}")
    [ ${#building[@]} -gt 3 ] && list="$list..., "
    out+=("building ${#building[@]} package$([ ${#building[@]} -gt 1 ] && echo s) (${list%, })")
  fi
  [ "$linking" -gt 0 ] && out+=("linking $linking binar$([ "$linking" -gt 1 ] && echo ies || echo y)")
  if [ ${#running[@]} -gt 0 ]; then
    list=
    for dir in "${!running[@]}"; do list="$list$dir ($(since "${running[$dir]}")), "; done
    out+=("running ${list%, }")
  fi
  if [ ${#out[@]} -eq 0 ]; then
    if [ ${#other[@]} -gt 0 ]; then
      list=$(printf '%s; ' "${other[@]}")
      out+=("${list%; }")
    else
      out+=("working")
    fi
  fi
  list=$(printf '%s; ' "${out[@]}")
  echo "${list%; }"
}

began=$SECONDS
(
  self=$BASHPID
  while sleep "$every"; do
    kill -0 "$top" 2>/dev/null || exit 0
    echo "$label: $(since $((SECONDS - began))): $(doing "$self")" >&2
  done
) &
beat=$!
if [ -n "$log" ]; then
  "$@" >"$log" 2>&1
  status=$?
  [ "$status" -eq 0 ] || cat "$log" >&2
else
  "$@"
  status=$?
fi
kill "$beat" 2>/dev/null
wait "$beat" 2>/dev/null
exit $status
