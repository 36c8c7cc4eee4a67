#!/usr/bin/env bash
# `rlx new-op --builtin`: on a copy of the files it edits, a unary op and a composite get their RLX_OPS row and
# op-table entry, the family files still compile, and a second run for the same name is refused.
set -euo pipefail
rlx=$1 src=$2 cxx=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/include/rlx/ir" "$tmp/src/ops"
cp "$src/include/rlx/ir/op.hpp" "$tmp/include/rlx/ir/"
cp "$src/src/ops/unary.cpp" "$src/src/ops/nn.cpp" "$tmp/src/ops/"
"$rlx" new-op HardSwish --builtin --root "$tmp" >/dev/null
"$rlx" new-op my_norm --builtin --kind composite --root "$tmp" >/dev/null
grep -q 'X(HardSwish, "hard_swish", Unary, 1, 1)' "$tmp/include/rlx/ir/op.hpp"
grep -q 'X(MyNorm, "my_norm", Composite, 1, 1)' "$tmp/include/rlx/ir/op.hpp"
grep -q 'formula(OpKind::HardSwish,' "$tmp/src/ops/unary.cpp"
grep -q 'define_op({.kind = OpKind::MyNorm,' "$tmp/src/ops/nn.cpp"
for f in unary nn; do
  "$cxx" -std=c++20 -fsyntax-only -Wall -Werror -I"$tmp/include" -I"$src/include" -I"$tmp/src" -I"$src/src" \
    "$tmp/src/ops/$f.cpp"
done
if "$rlx" new-op HardSwish --builtin --root "$tmp" 2>"$tmp/err"; then
  echo "a second new-op --builtin HardSwish was not refused" >&2
  exit 1
fi
grep -q "already exists" "$tmp/err"
if "$rlx" new-op Foo --builtin --kind reduce --root "$tmp" 2>"$tmp/err"; then exit 1; fi
grep -q "unary or composite" "$tmp/err"
echo "new-op --builtin: rows, entries and a compiling tree; repeats and unknown kinds refused"
