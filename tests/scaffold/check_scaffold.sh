#!/usr/bin/env bash
# `rlx new-op` and `rlx new-model` write templates that compile as they are
# and run: each checks itself against the reference and exits non-zero on a mismatch.
#   check_scaffold.sh <rlx cli> <rlx include dir> <librlx dir> <c++ compiler>
set -euo pipefail
rlx=$1 include=$2 libdir=$3 cxx=$4
work=$(mktemp -d "${TMPDIR:-/tmp}/rlx_scaffold.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "FAILED: $*"; exit 1; }

(cd "$work" && "$rlx" new-op GatedGate) | grep -qx "wrote ./gated_gate.cpp" || fail "new-op did not write ./gated_gate.cpp"
"$rlx" new-model gated_mlp --dir "$work/models" > /dev/null
[ -f "$work/models/gated_mlp.cpp" ] || fail "new-model --dir did not write models/gated_mlp.cpp"
cmp -s <("$rlx" new-op GatedGate --stdout) "$work/gated_gate.cpp" || fail "--stdout differs from the written file"
if "$rlx" new-op GatedGate --dir "$work" 2> "$work/err"; then fail "overwrote an existing file"; fi
grep -q "already exists" "$work/err" || fail "no 'already exists' error: $(cat "$work/err")"
if "$rlx" new-model 9lives --stdout 2> "$work/err"; then fail "accepted the name 9lives"; fi
grep -q "not a usable name" "$work/err" || fail "no 'not a usable name' error: $(cat "$work/err")"

# -Wno-unused-parameter: rlx/ir/custom_op.hpp's default hooks name unused parameters.
# RLX_SANITIZE_FLAGS: set by CTest in a sanitizer build (tests/CMakeLists.txt), whose librlx needs the
# sanitizer runtime loaded first; the programs get the same instrumentation as the library.
read -r -a sanitize <<< "${RLX_SANITIZE_FLAGS:-}"
for src in "$work/gated_gate.cpp" "$work/models/gated_mlp.cpp"; do
  exe=${src%.cpp}
  "$cxx" -std=c++20 -O1 -Wall -Wextra -Wno-unused-parameter -Werror "${sanitize[@]}" -I"$include" "$src" \
    -L"$libdir" -lrlx -Wl,-rpath,"$libdir" -o "$exe" || fail "$(basename "$src") does not compile"
  "$exe" | tee "$work/out" || fail "$(basename "$src") failed when run"
  grep -q "(ok)" "$work/out" || fail "$(basename "$src") did not report a match"
done
echo "scaffolds compile and run"
