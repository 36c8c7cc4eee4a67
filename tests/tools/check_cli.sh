#!/usr/bin/env bash
# The command line's own contract, beyond the generated docs (tests/docs):
# `rlx compile` prints its dispatch report once, on stdout, also when
# RLX_DISPATCH_REPORT asks the library to print it.
#   check_cli.sh <rlx cli>
set -euo pipefail
rlx=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat >"$dir/g.rlx" <<'GRAPH'
graph cli {
  %x = input "x" : f32[4]
  %y = exp %x : f32[4]
  output %y
}
GRAPH
RLX_DISPATCH_REPORT=1 "$rlx" compile "$dir/g.rlx" >"$dir/out" 2>"$dir/err"
first=$(grep -m1 -i "dispatch" "$dir/out" || true)
[ -n "$first" ] || { echo "no dispatch report on stdout:"; cat "$dir/out"; exit 1; }
count=$(cat "$dir/out" "$dir/err" | grep -cxF "$first" || true)
[ "$count" -eq 1 ] || { echo "the report's first line '$first' appears $count times:"; cat "$dir/out" "$dir/err"; exit 1; }
echo "ok: one dispatch report"
