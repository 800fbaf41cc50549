#!/usr/bin/env bash
# Apache Airflow 3 with the cncf.kubernetes provider (KubernetesPodOperator), pinned, for
# the engine e2e specs and for docs/recipes.md: a virtualenv under $SLUICE_CACHE (default
# ~/.cache/sluice), keyed by the versions and the constraints file, reused once built.
#
#   hack/engines/airflow.sh install   build the virtualenv if missing; print its directory
#   hack/engines/airflow.sh path      print the directory (exit 1 if it is not built)
#   hack/engines/airflow.sh lock      resolve the two pins afresh into a scratch virtualenv
#                                     and rewrite airflow-constraints.txt from it
#
# Every distribution is pinned by airflow-constraints.txt beside this script (Airflow's
# own constraints file is not reachable here). PyPI is the only source; pip's cache is
# $SLUICE_CACHE/pip. Cold: about 1.5 min on the 2-core VM; warm: nothing to do.
set -euo pipefail

AIRFLOW_VERSION=3.3.2
PROVIDER_VERSION=10.25.0 # apache-airflow-providers-cncf-kubernetes

here=$(cd "$(dirname "$0")" && pwd)
constraints=$here/airflow-constraints.txt
cache=${SLUICE_CACHE:-$HOME/.cache/sluice}
python=${PYTHON:-python3}
export PIP_CACHE_DIR=$cache/pip PIP_DISABLE_PIP_VERSION_CHECK=1

pins=("apache-airflow==$AIRFLOW_VERSION" "apache-airflow-providers-cncf-kubernetes==$PROVIDER_VERSION")

check_python() {
  "$python" -c 'import sys; sys.exit(not ((3, 10) <= sys.version_info[:2] <= (3, 13)))' ||
    { echo "airflow: Airflow $AIRFLOW_VERSION needs CPython 3.10 to 3.13; $python is $("$python" --version 2>&1)" >&2; exit 1; }
}

venv_dir() {
  local sum
  sum=$(sha256sum "$constraints" | cut -c1-12)
  echo "$cache/airflow-$AIRFLOW_VERSION-k8s-$PROVIDER_VERSION-$sum"
}

case "${1:-install}" in
  install)
    dir=$(venv_dir)
    if [ ! -e "$dir/.installed" ]; then
      check_python
      echo "airflow: installing apache-airflow $AIRFLOW_VERSION, cncf.kubernetes $PROVIDER_VERSION into $dir" >&2
      # A virtualenv's scripts name its directory, so it is built where it stays; the
      # mark .installed says the install finished.
      rm -rf "$dir"
      "$python" -m venv "$dir"
      "$dir/bin/pip" install --quiet --no-input -c "$constraints" "${pins[@]}" >&2 || { rm -rf "$dir"; exit 1; }
      touch "$dir/.installed"
    fi
    echo "$dir"
    ;;
  path)
    dir=$(venv_dir)
    [ -e "$dir/.installed" ] || { echo "airflow: not installed (hack/engines/airflow.sh install)" >&2; exit 1; }
    echo "$dir"
    ;;
  lock)
    check_python
    scratch=$(mktemp -d)
    trap 'rm -rf "$scratch"' EXIT
    "$python" -m venv "$scratch/v"
    "$scratch/v/bin/pip" install --quiet --no-input "${pins[@]}" >&2
    { sed -n '1,/^# with:/p' "$constraints"; "$scratch/v/bin/pip" freeze --exclude-editable; } > "$constraints.new"
    mv "$constraints.new" "$constraints"
    echo "airflow: wrote $constraints" >&2
    ;;
  *)
    echo "usage: $0 install|path|lock" >&2
    exit 2
    ;;
esac
