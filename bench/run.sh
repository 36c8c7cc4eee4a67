#!/usr/bin/env bash
# `make bench`: every workload against its peer in this one run, then
# bench/results/latest.json and the ratio table (docs/performance.md explains both).
#
# In-process peers (OpenBLAS, memcpy, the unfused chain) alternate with RLX rep
# by rep inside bench_kernels. Python peers (NumPy, ONNX Runtime) alternate
# with bench_e2e process by process: BENCH_ROUNDS rounds of BENCH_REPS reps,
# the order flipping each round, samples pooled over the rounds.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=${BUILD:-build}
ROUNDS=${BENCH_ROUNDS:-5}
REPS=${BENCH_REPS:-2}
KERNEL_REPS=${BENCH_KERNEL_REPS:-7}
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
BIN=$BUILD/bench
for exe in bench_machine bench_kernels bench_e2e; do
  [ -x "$BIN/$exe" ] || { echo "bench: $BIN/$exe not built (run 'make build' or set BUILD=<dir>)" >&2; exit 1; }
done

RAW=$(mktemp -d)
trap 'rm -rf "$RAW"' EXIT
start=$SECONDS

echo "[bench] machine limits (peak f32 FMA, copy bandwidth), all cores"
"$BIN/bench_machine" --reps 5 >"$RAW/machine_0.jsonl"
"$PY" bench/peers.py versions >"$RAW/versions.jsonl"

echo "[bench] GEMM/GEMV vs OpenBLAS; 8-op elementwise chain vs memcpy and vs unfused"
"$BIN/bench_kernels" --reps "$KERNEL_REPS" >"$RAW/kernels.jsonl"

echo "[bench] same params for ONNX Runtime; checking RLX and ORT outputs agree"
"$BIN/bench_e2e" --dump-params "$RAW/dump"
"$PY" bench/peers.py verify --dump "$RAW/dump" >"$RAW/checks.jsonl"

rlx_round() { "$BIN/bench_e2e" --reps "$REPS" >"$RAW/e2e_rlx_$1.jsonl"; }
peer_round() {
  { "$PY" bench/peers.py numpy --reps "$REPS"; "$PY" bench/peers.py ort --dump "$RAW/dump" --reps "$REPS"; } \
    >"$RAW/e2e_peer_$1.jsonl"
}
for r in $(seq 1 "$ROUNDS"); do
  echo "[bench] round $r/$ROUNDS: norms vs NumPy; conv2d, MLP, encoder, compile time vs ONNX Runtime"
  if [ $((r % 2)) = 1 ]; then rlx_round "$r"; peer_round "$r"; else peer_round "$r"; rlx_round "$r"; fi
done

# Limits again at the end: the report keeps the best, so a busy moment at the start does not skew the percentages.
"$BIN/bench_machine" --reps 5 >"$RAW/machine_1.jsonl"

mkdir -p bench/results
echo
"$PY" bench/report.py "$RAW"/*.jsonl --out bench/results/latest.json
"$PY" bench/plot.py bench/results/latest.json bench/results/ratios.png
echo "[bench] done in $((SECONDS - start)) s; wrote bench/results/latest.json"
