#!/usr/bin/env bash
# llama.cpp from PyPI's llama-cpp-python source distribution (it vendors llama.cpp under
# vendor/llama.cpp), cached under the build directory. Kept out of `make test`'s critical path:
# the tests need only the quant-ref driver, which compiles one C file of ggml in seconds.
#
#   scripts/build_llama_cpp.sh [--build-dir DIR] [quant-ref | tools | all]   (default: quant-ref)
#
#   source     fetch and unpack the source into DIR/llama.cpp-src (skipped when present)
#   quant-ref  DIR/llama.cpp/ggml_quant_ref: tests/gguf/ggml_quant_ref.c over ggml-quants.c, the
#              independent reference for RLX's K-quant quantizers (tests/gguf/test_quants.cpp)
#   tools      llama-bench, llama-tokenize and llama-quantize in DIR/llama.cpp/build/bin (minutes
#              on 2 cores; for the benchmarks and cross-checks, not for `make test`)
#   tokenize   llama-tokenize alone (the tokenizer cross-check, tests/llm/test_tokenizer_llama_cpp.cpp)
#   logits     DIR/llama.cpp/build/bin/llama_logits: bench/llama_logits.cpp over libllama, llama.cpp's logits at
#              every position (the fast-mode accuracy comparison, bench/llm_accuracy.py); builds the tools first
#
# Environment: PYTHON (default .venv/bin/python, else python3), LLAMA_CPP_PYTHON_VERSION (the pinned
# sdist; change it deliberately, since the reference quantizers may change between releases), JOBS (2).
# A failed download is remembered in DIR/llama.cpp/fetch-failed (its reason inside) so that every
# test process does not retry it; delete that file to try again.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="$ROOT/build"
what=quant-ref
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) BUILD="$(mkdir -p "$2" && cd "$2" && pwd)"; shift 2 ;;
    source | quant-ref | tools | tokenize | logits | all) what="$1"; shift ;;
    *) echo "usage: $0 [--build-dir DIR] [source|quant-ref|tools|tokenize|logits|all]" >&2; exit 2 ;;
  esac
done

VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
SRC="$BUILD/llama.cpp-src"
OUT="$BUILD/llama.cpp"
LLAMA="$SRC/vendor/llama.cpp"
JOBS="${JOBS:-2}"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$ROOT/.venv/bin/python" ]]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
mkdir -p "$OUT"

# Test processes run in parallel: one fetch and one build at a time.
exec 9>"$OUT/.lock"
flock 9

fetch_source() {
  [[ -f "$LLAMA/ggml/src/ggml-quants.c" ]] && return 0
  if [[ -f "$OUT/fetch-failed" ]]; then
    echo "[llama.cpp] an earlier fetch failed ($OUT/fetch-failed; delete it to retry): $(cat "$OUT/fetch-failed")" >&2
    return 1
  fi
  local dl="$SRC.download"
  rm -rf "$dl" && mkdir -p "$dl"
  echo "[llama.cpp] pip download llama-cpp-python==$VERSION (source distribution)" >&2
  if ! "$PYTHON" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$dl" >"$dl/log" 2>&1; then
    echo "pip download llama-cpp-python==$VERSION failed: $(tail -n 3 "$dl/log" | tr '\n' ' ')" >"$OUT/fetch-failed"
    cat "$OUT/fetch-failed" >&2
    return 1
  fi
  local tarball
  tarball="$(ls "$dl"/llama_cpp_python-*.tar.gz | head -n 1)"
  rm -rf "$SRC.tmp" && mkdir -p "$SRC.tmp"
  tar -xzf "$tarball" -C "$SRC.tmp" --strip-components=1
  rm -rf "$SRC" && mv "$SRC.tmp" "$SRC" && rm -rf "$dl"
  [[ -f "$LLAMA/ggml/src/ggml-quants.c" ]] || { echo "no vendor/llama.cpp in $tarball" >"$OUT/fetch-failed"; return 1; }
}

# The reference quantizers as plain C: no -march, no fast-math and no FMA contraction, so each float
# operation rounds exactly as the C source says (RLX's scalar code is compiled the same way).
build_quant_ref() {
  local exe="$OUT/ggml_quant_ref" driver="$ROOT/tests/gguf/ggml_quant_ref.c" quants="$LLAMA/ggml/src/ggml-quants.c"
  if [[ -x "$exe" && "$exe" -nt "$driver" && "$exe" -nt "$quants" ]]; then return 0; fi
  echo "[llama.cpp] building $exe" >&2
  nice -n 10 "${CC:-cc}" -std=gnu11 -O2 -ffp-contract=off -fno-fast-math -w \
    -I"$LLAMA/ggml/include" -I"$LLAMA/ggml/src" -I"$LLAMA/ggml/src/ggml-cpu" \
    "$driver" "$quants" -lm -o "$exe.tmp"
  mv "$exe.tmp" "$exe"
}

# The peer is built for the host's ISA (GGML_NATIVE), except AMX: ggml's AMX matmul segfaults in a worker thread
# on this project's AMX-INT8 machines (seen 2026-12-05 with llama-cpp-python 0.3.36, ggml_backend_amx_mul_mat, on
# every quant type: llama-bench and llama_logits both died), so there it gets the host's AVX-512 extensions by
# name and no AMX.
isa_flags() {
  if ! grep -qw amx_int8 /proc/cpuinfo 2>/dev/null; then
    echo "-DGGML_NATIVE=ON"
    return
  fi
  local flags="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
  local cpu_flag ggml_option
  for pair in avx512f:AVX512 avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI avx512_bf16:AVX512_BF16 \
    avx_vnni:AVX_VNNI; do
    cpu_flag=${pair%%:*} ggml_option=${pair#*:}
    grep -qw "$cpu_flag" /proc/cpuinfo && flags+=" -DGGML_$ggml_option=ON"
  done
  echo "$flags"
}

configure_tools() {
  local flags
  flags="$(isa_flags)"
  # A build configured with other ISA flags (an older script, another machine) is configured again.
  [[ -f "$OUT/build/build.ninja" && "$(cat "$OUT/build/rlx-isa-flags" 2>/dev/null)" == "$flags" ]] && return 0
  rm -rf "$OUT/build"
  # shellcheck disable=SC2086 # the flags are separate words
  nice -n 10 cmake -S "$LLAMA" -B "$OUT/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF $flags >&2
  echo "$flags" >"$OUT/build/rlx-isa-flags"
}

build_tools() {
  echo "[llama.cpp] building llama-bench, llama-tokenize, llama-quantize (minutes)" >&2
  configure_tools
  nice -n 10 cmake --build "$OUT/build" -j "$JOBS" --target llama-bench llama-tokenize llama-quantize >&2
}

build_tokenize() {
  [[ -x "$OUT/build/bin/llama-tokenize" ]] && return 0
  echo "[llama.cpp] building llama-tokenize (minutes)" >&2
  configure_tools
  nice -n 10 cmake --build "$OUT/build" -j "$JOBS" --target llama-tokenize >&2
}

fetch_source
build_logits() {
  build_tools
  local lib="$OUT/build"
  echo "[llama.cpp] building llama_logits" >&2
  nice -n 10 "${CXX:-c++}" -O2 -std=c++17 -I"$LLAMA/include" -I"$LLAMA/ggml/include" "$ROOT/bench/llama_logits.cpp" \
    "$lib/src/libllama.a" "$lib/ggml/src/libggml.a" "$lib/ggml/src/libggml-cpu.a" "$lib/ggml/src/libggml-base.a" \
    -fopenmp -lpthread -ldl -o "$lib/bin/llama_logits"
}

case "$what" in
  source) ;;
  quant-ref) build_quant_ref ;;
  tools) build_tools ;;
  tokenize) build_tokenize ;;
  logits) build_logits ;;
  all) build_quant_ref; build_tools ;;
esac
