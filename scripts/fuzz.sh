#!/usr/bin/env bash
# make fuzz [FUZZ_SECONDS=N] [FUZZ_TARGETS="ir_text ..."]: builds the libFuzzer harnesses of tests/fuzz with
# clang (coverage, ASan, UBSan) in build-fuzz/, then runs every harness for N
# seconds, all at once, one core each. New inputs that reach new code collect
# in build-fuzz/corpus/<name>; a crash, leak, timeout or out-of-memory lands in
# build-fuzz/artifacts/<name>/ and fails the run. Copy a fixed crash into
# tests/fuzz/regressions/<name>/ so that `make test` replays it from then on.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-60}
BUILD=${FUZZ_BUILD:-build-fuzz}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/ccache} CCACHE_BASEDIR=$PWD

if [ ! -f "$BUILD/build.ninja" ]; then
  CC=clang CXX=clang++ cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRLX_FUZZ=ON \
    -DRLX_BUILD_TESTS=OFF -DRLX_BUILD_PYTHON=OFF -DRLX_BUILD_BENCH=OFF -DRLX_VULKAN=OFF >/dev/null
fi
harnesses=("${@:2}")  # scripts/fuzz.sh SECONDS [NAME...]: only those harnesses
if [ ${#harnesses[@]} = 0 ]; then
  for src in tests/fuzz/fuzz_*.cpp; do
    name=$(basename "$src" .cpp); harnesses+=("${name#fuzz_}")
  done
fi
cmake --build "$BUILD" -j "$(nproc)" --target $(printf 'fuzz_%s ' "${harnesses[@]}")

pids=()
for name in "${harnesses[@]}"; do
  mkdir -p "$BUILD/corpus/$name" "$BUILD/artifacts/$name"
  rm -f "$BUILD/artifacts/$name"/*  # findings of an earlier run were looked at then
  dict=(); [ -f "tests/fuzz/$name.dict" ] && dict=(-dict="tests/fuzz/$name.dict")
  # ASan's leak check at exit stays on; -rss_limit_mb bounds memory, -timeout a single input.
  "$BUILD/tests/fuzz/fuzz_$name" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 -max_len=8192 \
    -print_final_stats=1 -artifact_prefix="$BUILD/artifacts/$name/" "${dict[@]}" \
    "$BUILD/corpus/$name" "tests/fuzz/corpus/$name" >"$BUILD/$name.log" 2>&1 &
  pids+=($!)
done
status=0
for i in "${!harnesses[@]}"; do
  wait "${pids[$i]}" || status=1
done
for name in "${harnesses[@]}"; do
  log="$BUILD/$name.log"
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*' || echo "?")
  ft=$(grep -o 'ft: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*' || echo "?")
  corpus=$(find "$BUILD/corpus/$name" -type f | wc -l)
  found=$(find "$BUILD/artifacts/$name" -type f | wc -l)
  echo "fuzz $name: ${SECONDS_EACH}s, $execs execs, coverage $cov edges, $ft features, corpus $corpus, findings $found"
  [ "$found" = 0 ] || { status=1; ls "$BUILD/artifacts/$name"; }
done
exit $status
