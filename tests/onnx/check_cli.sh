#!/usr/bin/env bash
# rlx import / rlx run on tests/onnx/models/mlp.onnx: the report, the IR text, a run on a .npy input that
# writes its output (its dims bound from the input's shape), symbolic dims in the IR text, and the exit code and message of a malformed file.
set -euo pipefail
RLX=$1
SRC=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$RLX" import "$SRC/tests/onnx/models/mlp.onnx" --report --dim batch=3 | grep -q "^MatMul *1 *0 *0"
"$RLX" import "$SRC/tests/onnx/models/mlp.onnx" --dim batch=3 -o "$tmp/mlp.rlx" | grep -q "wrote"
grep -q 'input "x" : f32\[3,8\]' "$tmp/mlp.rlx"
"$RLX" compile "$tmp/mlp.rlx" >/dev/null
# Without --dim the dims stay symbolic in the IR text, and the shape subgraph's results are dim expressions.
"$RLX" import "$SRC/tests/onnx/models/dynamic_shapes.onnx" -o "$tmp/dyn.rlx" | grep -q "wrote"
grep -q 'input "x" : f32\[batch,seq,4\]' "$tmp/dyn.rlx"
grep -q 'f32\[batch\*seq,4\]' "$tmp/dyn.rlx"
"$RLX" compile "$tmp/dyn.rlx" --bind batch=2 --bind seq=3 >/dev/null
"$RLX" run "$SRC/tests/onnx/models/mlp.onnx" --input x="$SRC/tests/onnx/models/mlp_x.npy" -o "$tmp/out" | grep -q "^y: f32\[3,16\]"
test -s "$tmp/out/y.npy"
set +e
msg=$("$RLX" import "$SRC/tests/malformed/onnx/unsupported_op.onnx" 2>&1)
rc=$?
set -e
test "$rc" = 2
echo "$msg" | grep -q "node 'nms' (NonMaxSuppression, domain ai.onnx, opset 17): unsupported op"
echo "cli onnx: ok"
