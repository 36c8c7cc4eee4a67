#!/usr/bin/env bash
# The command line's own contract, beyond the generated docs (tests/docs):
# `rlx compile` prints its dispatch report once, on stdout, also when
# RLX_DISPATCH_REPORT asks the library to print it; `rlx inspect` prints a
# GGUF file and refuses each malformed one with its message; `rlx tokenize` names
# a missing tokenizer key.
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

# `rlx inspect`: a valid GGUF file prints its tables; each malformed one (tests/malformed/gguf/expected.txt)
# exits 2 with an rlx::Error naming the problem, never a crash.
root=$(cd "$(dirname "$0")/../.." && pwd)
"$rlx" inspect "$root/tests/fuzz/corpus/gguf/every_type.gguf" >"$dir/out"
grep -q "^total: 7 tensors" "$dir/out" || { echo "rlx inspect printed:"; cat "$dir/out"; exit 1; }
n=0
while IFS=$'\t' read -r file words; do
  case "$file" in '' | '#'*) continue ;; esac
  rc=0
  "$rlx" inspect "$root/tests/malformed/gguf/$file" >"$dir/out" 2>"$dir/err" || rc=$?
  [ "$rc" = 2 ] || { echo "rlx inspect $file: exit $rc, expected 2:"; cat "$dir/out" "$dir/err"; exit 1; }
  while IFS= read -r w; do
    grep -qF -- "$w" "$dir/err" || { echo "rlx inspect $file: no '$w' in:"; cat "$dir/err"; exit 1; }
  done < <(printf '%s\n' "$words" | sed 's/ | /\n/g')
  n=$((n + 1))
done <"$root/tests/malformed/gguf/expected.txt"
[ "$n" -ge 30 ] || { echo "only $n malformed GGUF files"; exit 1; }
echo "ok: rlx inspect refuses $n malformed GGUF files"

# `rlx tokenize`: a GGUF file without tokenizer metadata is refused, naming the key.
rc=0
"$rlx" tokenize "$root/tests/fuzz/corpus/gguf/every_type.gguf" "hello" >"$dir/out" 2>"$dir/err" || rc=$?
[ "$rc" = 2 ] && grep -qF "tokenizer.ggml.model" "$dir/err" || {
  echo "rlx tokenize without a tokenizer: exit $rc:"
  cat "$dir/out" "$dir/err"
  exit 1
}
echo "ok: rlx tokenize names the missing tokenizer key"
