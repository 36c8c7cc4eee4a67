#!/usr/bin/env bash
# The Vulkan backend on a GPU machine (docs/backends/vulkan.md, "On an NVIDIA GPU").
#
#   bash bench/gpu.sh pack [build-dir]   here: packs the built binaries and the shared libraries they need
#                                        (ldd, minus what every glibc system has) into .gpu/rlx-gpu.tar.xz, and
#                                        downloads the Vulkan loader packages into .gl/ (both git-ignored)
#   bash bench/gpu.sh run                there: unpacks the loader and the build, runs the Vulkan conformance
#                                        suites and vulkan_bench, then bench/gpu_peers.py (PyTorch); results
#                                        also go to $OUT when it is set
#   bash bench/gpu.sh cuda [bench|suites] there: unpacks the build and runs cuda_bench with PyTorch's figures
#                                        beside it (then `cuda_bench decode`, GGUF decode beside PyTorch eager
#                                        bf16: gpu_peers.py --llm), then the conformance suites on the CUDA backend (each part
#                                        alone when named: together they can outlast one 10-minute call;
#                                        docs/backends/cuda.md)
set -uo pipefail
cd "$(dirname "$0")/.."

pack() {
  local build=${1:-build}
  grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >>.git/info/exclude
  grep -qx '/.gl/' .git/info/exclude 2>/dev/null || echo '/.gl/' >>.git/info/exclude
  local stage
  stage=$(mktemp -d)
  mkdir -p "$stage/bin" "$stage/lib" .gpu
  local bins=("$build/vulkan_bench" "$build/tests/conformance_test_op_parity" "$build/tests/conformance_test_random_graphs"
              "$build/tests/conformance_test_errors")
  mapfile -t -O ${#bins[@]} bins < <(find "$build/tests" -maxdepth 1 -type f -executable \
    \( -name 'vulkan_test_*' -o -name 'cuda_test_*' -o -name 'runtime_test_capabilities' \))
  [ -x "$build/cuda_bench" ] && bins+=("$build/cuda_bench")
  cp "${bins[@]}" "$stage/bin/"
  cp "$build/librlx.so" "$stage/lib/"
  # Non-system libraries the binaries load (the GPU machine's glibc and libstdc++ are newer than ours).
  ldd "${bins[@]}" "$build/librlx.so" | awk '/=> \// {print $3}' | sort -u |
    grep -vE '/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' |
    grep -v librlx | xargs -r -I{} cp -L {} "$stage/lib/"
  strip --strip-unneeded "$stage"/bin/* "$stage"/lib/* 2>/dev/null
  tar cJf .gpu/rlx-gpu.tar.xz -C "$stage" bin lib
  rm -rf "$stage"
  # The loader and the GL vendor-neutral libraries NVIDIA's Vulkan driver (libGLX_nvidia) loads.
  if ! ls .gl/libglvnd0*.deb >/dev/null 2>&1; then
    mkdir -p .gl /tmp/amd64/partial
    local o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
    apt-get $o update -qq && (cd .gl && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
  fi
  ls -la .gpu/rlx-gpu.tar.xz .gl
}

# The Vulkan loader from the packed .deb files, and NVIDIA's ICD.
vulkan_loader() {
  for f in .gl/*.deb; do [ -f "$f" ] && dpkg -x "$f" /; done
  ldconfig
  local icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  [ -f "$icd" ] && export VK_DRIVER_FILES=$icd
  echo "Vulkan ICD: ${VK_DRIVER_FILES:-none at $icd}; loader: $(ldconfig -p | grep -c libvulkan.so.1) found"
}

run() {
  local out=${OUT:-/tmp/rlx-out} r=/tmp/rlx
  mkdir -p "$out" "$r"
  vulkan_loader
  tar xJf .gpu/rlx-gpu.tar.xz -C "$r"
  export LD_LIBRARY_PATH=$r/lib RLX_CACHE_DIR=$r/cache
  nvidia-smi -L
  # The Vulkan loader's own view when the backend reports itself unavailable.
  VK_LOADER_DEBUG=error,warn "$r/bin/vulkan_test_vulkan_backend" --gtest_filter='Vulkan.EnvironmentSelectsTheDevice' 2>&1 |
    grep -E 'ERROR|WARNING|SKIPPED|OK \]' | head -12
  echo "## conformance on Vulkan (test binaries' summaries)"
  for t in conformance_test_op_parity conformance_test_random_graphs conformance_test_errors "$(cd "$r/bin" && ls vulkan_test_*)"; do
    for b in $t; do
      "$r/bin/$b" --gtest_filter='*vulkan*:*Vulkan*' --gtest_brief=1 >"$out/$b.log" 2>&1
      echo "$b: exit $? | $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]|^\[  SKIPPED \] [0-9]' "$out/$b.log" | tr '\n' ' ')"
      grep -E '^\[  FAILED  \] [A-Z]' "$out/$b.log" | head -20
    done
  done
  echo "## vulkan_bench"
  "$r/bin/vulkan_bench" | tee "$out/rlx_bench.txt"
  echo "## RLX Vulkan vs PyTorch"
  PYTHONUNBUFFERED=1 python3 bench/gpu_peers.py --rlx "$out/rlx_bench.txt" | tee "$out/table.txt"
}

cuda() {
  # Logs go to one folder, packed into $OUT/cuda-logs.tar.xz at the end (only 8 files come back from $OUT).
  local r=/tmp/rlx part=${1:-all}
  local out=$r/logs
  mkdir -p "$out" "$r"
  tar xJf .gpu/rlx-gpu.tar.xz -C "$r"
  # The cubin cache in the checkout's ignored .gpu/cache. It comes back as $OUT/cuda-cubin-cache.tar.xz: unpacked
  # here with `tar xJf <files_at>/cuda-cubin-cache.tar.xz -C .gpu`, a later call carrying .gpu starts with it.
  export LD_LIBRARY_PATH=$r/lib RLX_CACHE_DIR=$PWD/.gpu/cache RLX_TEST_TIMING=1
  vulkan_loader  # so that the device report can rank Vulkan on the same GPU against CUDA
  nvidia-smi -L
  if [ "$part" != suites ]; then
  echo "## cuda_bench"
  timeout 150 "$r/bin/cuda_bench" | tee "$out/cuda_bench.txt"
  echo "## RLX CUDA vs PyTorch"
  PYTHONUNBUFFERED=1 timeout 100 python3 bench/gpu_peers.py --rlx "$out/cuda_bench.txt" --label "RLX CUDA" |
    tee "$out/table.txt"
  # GGUF decode (SmolLM2-135M's shapes, random weights made there) beside PyTorch eager bf16 on the same weights.
  # Its own process and timeouts: a failure here costs these figures only.
  echo "## GGUF decode on CUDA (cuda_bench decode) vs PyTorch eager bf16"
  rm -rf "$r/llm"
  timeout "${RLX_GPU_DECODE_TIMEOUT:-300}" "$r/bin/cuda_bench" decode "$r/llm" | tee "$out/cuda_llm.txt" ||
    echo "cuda_bench decode failed or timed out (exit $?): the decode figures above are partial; the run continues"
  if [ -f "$r/llm/model.json" ] && [ -f "$r/llm/weights.f32" ]; then
    PYTHONUNBUFFERED=1 timeout 200 python3 bench/gpu_peers.py --llm "$r/llm" --rlx "$out/cuda_llm.txt" \
      --label "RLX CUDA" | tee "$out/llm_table.txt" ||
      echo "the PyTorch decode peer failed or timed out (exit $?): no PyTorch decode figure; the run continues"
  else
    echo "no dequantized weights in $r/llm (the Q4_1 decode failed): no PyTorch decode figure"
  fi
  rm -f "$r"/llm/*.gguf "$r"/llm/weights.f32  # hundreds of MB: not for the logs
  fi
  [ "$part" = bench ] && return
  echo "## the CUDA backend's own tests and the capability tests on CUDA"
  for b in $(cd "$r/bin" && ls cuda_test_* runtime_test_capabilities 2>/dev/null); do
    local filter='*'
    [ "$b" = runtime_test_capabilities ] && filter='*cuda*:*Cuda*:AdvisoryCapabilities.*'
    timeout 120 "$r/bin/$b" --gtest_filter="$filter" >"$out/$b.log" 2>&1
    echo "$b: exit $? | $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]|^\[  SKIPPED \] [0-9]' "$out/$b.log" | tr '\n' ' ')"
    grep -E '^\[  FAILED  \] [A-Z]|Failure|rror' "$out/$b.log" | head -20
  done
  # NVRTC's time (tens of ms per kernel) dominates the suites: each binary runs as gtest shards, one per core.
  local shards
  shards=$(nproc)
  echo "## conformance on CUDA ($shards shards per binary)"
  for b in conformance_test_op_parity conformance_test_random_graphs conformance_test_errors; do
    local t0=$SECONDS
    for ((i = 0; i < shards; i++)); do
      GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i timeout "${RLX_GPU_TIMEOUT:-400}" "$r/bin/$b" \
        --gtest_filter="${RLX_GPU_FILTER:-*cuda*}:-*CudaCodegen*" >"$out/$b.$i.log" 2>&1 &
    done
    wait
    # A shard stopped by its timeout prints no summary: its tests count neither way, so say how many.
    local unfinished
    unfinished=$(grep -LE '^\[  (PASSED|FAILED)  \]' "$out/$b".*.log | wc -l)
    [ "$unfinished" -gt 0 ] && echo "$b: $unfinished of $shards shards did not finish within ${RLX_GPU_TIMEOUT:-400} s"
    cat "$out/$b".*.log >"$out/$b.log" && rm -f "$out/$b".*.log
    echo "$b: $((SECONDS - t0)) s | passed $(grep -hoE '^\[  PASSED  \] [0-9]+' "$out/$b.log" | awk '{s+=$4} END {print s+0}')" \
      "| failed $(grep -E '^\[  FAILED  \] [A-Z]' "$out/$b.log" | sort -u | wc -l) | skipped $(grep -cE '^\[  SKIPPED \] [A-Z]' "$out/$b.log")"
    # RLX_TEST_TIMING's lines: where the cases' time went (compile, reference, runs), summed over the shards.
    grep -hE '^\[timing\]' "$out/$b.log" | sed -E 's/.*compile ([0-9.]+) ms, reference ([0-9.]+) ms, runs ([0-9.]+) ms/\1 \2 \3/' |
      sort -n | awk '{c+=$1; f+=$2; r+=$3; n++; v[n]=$1} END {if (n) printf "  %d cases: compile %.1f s (median %.0f ms, max %.0f ms), reference %.1f s, runs %.1f s\n", n, c/1e3, v[int((n+1)/2)], v[n], f/1e3, r/1e3}'
    grep -E '^\[  FAILED  \] [A-Z]' "$out/$b.log" | sort -u | head -40
  done
}

cuda_pack_out() {
  [ -n "${OUT:-}" ] || return 0
  tar cJf "$OUT/cuda-logs.tar.xz" -C /tmp/rlx logs
  [ -d .gpu/cache ] && tar cf - -C .gpu cache | xz -T0 -3 >"$OUT/cuda-cubin-cache.tar.xz"
  ls -la "$OUT"
}

case "${1:-}" in
  pack) shift; pack "$@" ;;
  run) run ;;
  cuda) shift; cuda "$@"; cuda_pack_out ;;
  *) echo "usage: bash bench/gpu.sh pack [build-dir] | run | cuda [bench|suites]" >&2; exit 2 ;;
esac
