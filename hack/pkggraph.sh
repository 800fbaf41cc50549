#!/usr/bin/env bash
# Prints the package graph of the module (each package and the Sluice packages it
# imports, as go list sorts them) as the markdown table docs/architecture.md holds between its pkggraph markers;
# `make verify` fails when the two differ. `hack/pkggraph.sh -w` rewrites the document.
set -euo pipefail
cd "$(dirname "$0")/.."
mod=$(go list -m)
table=$(go list -f '{{.ImportPath}} {{join .Imports " "}}' ./... | awk -v m="$mod/" '
  BEGIN { print "| package | imports (within Sluice) |"; print "|---|---|" }
  {
    p = substr($1, length(m) + 1)
    if (p ~ /^hack\//) next
    n = 0
    for (i = 2; i <= NF; i++) if (index($i, m) == 1) deps[++n] = substr($i, length(m) + 1)
    line = ""
    for (i = 1; i <= n; i++) line = line (i > 1 ? ", " : "") "`" deps[i] "`"
    if (line == "") line = "—"
    print "| `" p "` | " line " |"
  }')
if [ "${1:-}" = "-w" ]; then
  TABLE="$table" python3 - docs/architecture.md <<'PY'
import os, re, sys
p = sys.argv[1]
s = open(p).read()
s = re.sub(r"(<!-- pkggraph -->\n).*?(<!-- /pkggraph -->)", lambda m: m.group(1) + os.environ["TABLE"] + "\n" + m.group(2), s, flags=re.S)
open(p, "w").write(s)
PY
else
  echo "$table"
fi
