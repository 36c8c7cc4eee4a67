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
#                                        bf16: gpu_peers.py --llm), then the CUDA tests, the capability tests, the
#                                        nccl engine on one GPU and the conformance suites on the CUDA backend (each part
#                                        alone when named: together they can outlast one 10-minute call;
#                                        docs/backends/cuda.md); the console output also lands in
#                                        $OUT/cuda_full.txt, and the logs are packed even when `timeout` stops it
#   bash bench/gpu.sh nccl [ranks]       there, on a machine with 2 or more GPUs (the multi-GPU issue): the
#                                        distributed tests with the nccl engine (one GPU per rank, started by
#                                        tests/distributed/run_tcp.sh), then bench_collectives beside
#                                        torch.distributed's NCCL (bench/nccl_peer.py) on the same messages, 1 MiB
#                                        to 1 GiB in GPU memory, and the ratio of their bus bandwidths; host-staged
#                                        messages to 64 MiB; bench_tensor_parallel (the encoder block sharded over
#                                        the GPUs against one GPU, small and large)
#   bash bench/gpu.sh mlx pack [build-dir] here: the MLX backend's suites for the GPU machine (docs/backends/mlx.md,
#                                        "mlx-cuda-13"): the mlx-cuda-13 wheel of the version the build links
#                                        (pip download, nothing installed), its libmlx.so xz-compressed in parts
#                                        under 40 MiB (.gpu/mlx-cuda-13.xz.part-*: one call carries 64 MiB at
#                                        most), and the test binaries with librlx (.gpu/rlx-mlx.tar.xz)
#   bash bench/gpu.sh mlx stash          there: keeps what this call carried in /tmp for the next call (a call's
#                                        carry replaces .gpu there)
#   bash bench/gpu.sh mlx run            there: joins the parts, puts the CUDA libmlx.so first on the loader's
#                                        path, and runs the MLX suites on MLX's GPU device
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
  [ -x "$build/bench/bench_collectives" ] && bins+=("$build/bench/bench_collectives")
  [ -x "$build/bench/bench_tensor_parallel" ] && bins+=("$build/bench/bench_tensor_parallel")
  mapfile -t -O ${#bins[@]} bins < <(find "$build/tests" -maxdepth 1 -type f -executable -name 'distributed_test_*')
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
  echo "## the CUDA backend's own tests, the capability tests on CUDA, and the nccl engine on one GPU"
  # distributed_test_nccl: the nccl engine at world size 1, device memory and a CUDA handle's address. The
  # data- and tensor-parallel tests at world size 1 on the nccl engine: the Trainer and the sharded encoder block
  # on CUDA, as the multi-GPU run (bench/gpu.sh nccl) runs them on each rank.
  for b in $(cd "$r/bin" && ls cuda_test_* runtime_test_capabilities distributed_test_nccl \
    distributed_test_data_parallel distributed_test_tensor_parallel 2>/dev/null); do
    local filter='*'
    [ "$b" = runtime_test_capabilities ] && filter='*cuda*:*Cuda*:AdvisoryCapabilities.*'
    case $b in distributed_test_data_parallel | distributed_test_tensor_parallel) export RLX_DISTRIBUTED=nccl ;; esac
    timeout 120 "$r/bin/$b" --gtest_filter="$filter" >"$out/$b.log" 2>&1
    echo "$b: exit $? | $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]|^\[  SKIPPED \] [0-9]' "$out/$b.log" | tr '\n' ' ')"
    grep -E '^\[  FAILED  \] [A-Z]|Failure|rror' "$out/$b.log" | head -20
    unset RLX_DISTRIBUTED
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

# The multi-GPU run: every collective and the data- and tensor-parallel tests on the nccl engine, then the
# bandwidth against PyTorch (docs/distributed.md).
nccl() {
  local r=/tmp/rlx out=${OUT:-/tmp/rlx-out} np=${1:-$(nvidia-smi -L | wc -l)}
  mkdir -p "$r" "$out"
  tar xJf .gpu/rlx-gpu.tar.xz -C "$r"
  export LD_LIBRARY_PATH=$r/lib RLX_CACHE_DIR=$r/cache
  nvidia-smi -L
  echo "## the distributed tests on the nccl engine, $np ranks"
  for t in collectives data_parallel tensor_parallel; do
    RUN_TCP_ENGINE=nccl timeout 300 bash tests/distributed/run_tcp.sh "$np" "$r/bin/distributed_test_$t" \
      >"$out/nccl_$t.log" 2>&1
    echo "distributed_test_$t: exit $? | $(grep -E '^\[rank [0-9]+\] \[  (PASSED|FAILED)  \]' "$out/nccl_$t.log" | tr '\n' ' ')"
  done
  echo "## collective bandwidth, $np ranks: RLX's nccl engine, then torch.distributed (NCCL)"
  RUN_TCP_ENGINE=nccl timeout 300 bash tests/distributed/run_tcp.sh "$np" "$r/bin/bench_collectives" |
    tee "$out/collectives_rlx.txt"
  timeout 300 bash tests/distributed/run_tcp.sh "$np" python3 bench/nccl_peer.py | tee "$out/collectives_torch.txt"
  python3 bench/nccl_peer.py --compare "$out/collectives_rlx.txt" "$out/collectives_torch.txt"
  echo "## host-staged messages on the same engine (RLX's host buffers), up to 64 MiB"
  RUN_TCP_ENGINE=nccl timeout 200 bash tests/distributed/run_tcp.sh "$np" "$r/bin/bench_collectives" --memory host \
    --max-mib 64 | tee "$out/collectives_rlx_host.txt"
  echo "## the tensor-parallel encoder block, $np GPUs, against the whole block on one GPU"
  for size in small large; do
    RUN_TCP_ENGINE=nccl timeout 200 bash tests/distributed/run_tcp.sh "$np" "$r/bin/bench_tensor_parallel" \
      --size $size | tee "$out/tp_encoder_$size.txt"
  done
}

cuda_pack_out() {
  [ -n "${OUT:-}" ] || return 0
  tar cJf "$OUT/cuda-logs.tar.xz" -C /tmp/rlx logs
  [ -d .gpu/cache ] && tar cf - -C .gpu cache | xz -T0 -3 >"$OUT/cuda-cubin-cache.tar.xz"
  ls -la "$OUT"
}

# ---- MLX's CUDA build (mlx-cuda-13) ----
# librlx is built against mlx-cpu's headers; mlx-cuda-13 of the same version is the same C++ API in a libmlx.so
# that also has a GPU device (MLX's default device when a GPU is there, so the backend needs no switch). The
# wheel is 90 MB, more than one call carries, so its libmlx.so travels xz-compressed, in parts.
MLX_PARTS_MB=36
mlx_pack() {
  local build=${1:-build} py=.venv/bin/python exclude
  exclude=$(git rev-parse --git-path info/exclude)  # .git is a file in a worktree
  grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >>"$exclude"
  local version
  version=$("$py" -c 'import importlib.metadata as m; print(m.version("mlx-cpu"))') ||
    { echo "mlx pack: no mlx-cpu in .venv (run scripts/bootstrap.sh)" >&2; return 1; }
  mkdir -p .gpu/wheels
  local wheel
  wheel=$(ls .gpu/wheels/mlx_cuda_13-"$version"-*.whl 2>/dev/null | head -1)
  if [ -z "$wheel" ]; then
    "$py" -m pip download -q --no-deps --only-binary=:all: -d .gpu/wheels "mlx-cuda-13==$version" || return 1
    wheel=$(ls .gpu/wheels/mlx_cuda_13-"$version"-*.whl | head -1)
  fi
  local stage
  stage=$(mktemp -d)
  "$py" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract("mlx/lib/libmlx.so", sys.argv[2])' "$wheel" "$stage"
  echo "mlx pack: $(basename "$wheel"): libmlx.so $(du -m "$stage/mlx/lib/libmlx.so" | cut -f1) MB; needs:"
  readelf -d "$stage/mlx/lib/libmlx.so" | awk '/NEEDED/ {printf " %s", $5} END {print ""}'
  # The parts are made again only when the wheel's libmlx.so is not the one they hold (xz -9 takes minutes).
  local sum
  sum=$(sha256sum "$stage/mlx/lib/libmlx.so" | cut -d' ' -f1)
  if [ "$sum" != "$(cat .gpu/mlx-cuda-13.sha256 2>/dev/null)" ] || ! ls .gpu/mlx-cuda-13.xz.part-aa >/dev/null 2>&1; then
    rm -f .gpu/mlx-cuda-13.xz.part-*
    echo "$sum" >.gpu/mlx-cuda-13.sha256
    xz -9 -T1 -c "$stage/mlx/lib/libmlx.so" | split -b "${MLX_PARTS_MB}M" - .gpu/mlx-cuda-13.xz.part-
  fi
  # The binaries the run needs, librlx, and what they load (mlx-cpu's libmlx.so stays behind: the parts replace it).
  mkdir -p "$stage/pkg/bin" "$stage/pkg/lib"
  local bins=("$build/tests/conformance_test_op_parity" "$build/tests/conformance_test_random_graphs"
              "$build/tests/conformance_test_errors" "$build/tests/runtime_test_capabilities"
              "$build/tests/runtime_test_calibration")
  mapfile -t -O ${#bins[@]} bins < <(find "$build/tests" -maxdepth 1 -type f -executable -name 'mlx_test_*')
  cp "${bins[@]}" "$stage/pkg/bin/"
  cp "$build/librlx.so" "$stage/pkg/lib/"
  ldd "${bins[@]}" "$build/librlx.so" | awk '/=> \// {print $3}' | sort -u |
    grep -vE '/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' |
    grep -vE 'librlx|/libmlx\.so' | xargs -r -I{} cp -L {} "$stage/pkg/lib/"
  strip --strip-unneeded "$stage"/pkg/bin/* "$stage"/pkg/lib/* 2>/dev/null
  tar cf - -C "$stage/pkg" bin lib | xz -9 -T1 >.gpu/rlx-mlx.tar.xz
  rm -rf "$stage"
  ls -la .gpu/rlx-mlx.tar.xz .gpu/mlx-cuda-13.xz.part-* .gpu/mlx-cuda-13.sha256
  echo "mlx pack: carry .gpu/mlx-cuda-13.xz.part-aa and .gpu/mlx-cuda-13.sha256 in a call running" \
    "'bash bench/gpu.sh mlx stash', then the other parts and .gpu/rlx-mlx.tar.xz in the next, running" \
    "'bash bench/gpu.sh mlx run' (the machine must stay warm between: 30 s)"
}

mlx_run() {
  local r=/tmp/rlx-mlx
  local out=$r/logs
  mkdir -p "$out" .gpu
  # A call's carry replaces .gpu there, so what an earlier call brought waits in /tmp (mlx stash).
  for f in /tmp/rlx-mlx-parts/*; do [ -e "$f" ] && [ ! -e ".gpu/${f##*/}" ] && cp "$f" .gpu/; done
  [ -f .gpu/rlx-mlx.tar.xz ] && [ -f .gpu/mlx-cuda-13.sha256 ] ||
    { echo "mlx run: .gpu/rlx-mlx.tar.xz or .gpu/mlx-cuda-13.sha256 is missing (bash bench/gpu.sh mlx pack)"; return 3; }
  tar xJf .gpu/rlx-mlx.tar.xz -C "$r"
  cat .gpu/mlx-cuda-13.xz.part-* | xz -d >"$r/lib/libmlx.so" 2>"$out/xz.log"
  if [ "$(sha256sum "$r/lib/libmlx.so" | cut -d' ' -f1)" != "$(cat .gpu/mlx-cuda-13.sha256)" ]; then
    echo "mlx run: libmlx.so from the parts here ($(cd .gpu && echo mlx-cuda-13.xz.part-*)) is not the packed one:" \
      "a part is missing (carry each one, the machine must stay warm between)"
    return 3
  fi
  # The CUDA libraries libmlx.so names (cuBLASLt, cuFFT, cuSOLVER, NVRTC, cuDNN, NCCL): the toolkit's, then the
  # pip nvidia-* packages of the machine's Python (PyTorch's), whose folders the wheel's run path expects.
  local paths=$r/lib
  [ -d /usr/local/cuda/lib64 ] && paths+=:/usr/local/cuda/lib64
  paths+=$(python3 -c 'import os, nvidia
print("".join(":" + os.path.join(p, d, "lib") for p in nvidia.__path__ for d in sorted(os.listdir(p))
              if os.path.isdir(os.path.join(p, d, "lib"))))' 2>/dev/null)
  # MLX compiles its fused kernels with NVRTC against $CUDA_HOME/include, and includes CCCL's headers (cuda/std/...)
  # from there too; CUDA 13 keeps them in include/cccl, which this MLX does not search (nor MLX_CCCL_DIR, on
  # 2026-12-07). So CUDA_HOME is a toolkit of links whose include/ holds both.
  local toolkit=${CUDA_HOME:-/usr/local/cuda}
  if [ -d "$toolkit/include/cccl" ]; then
    local home=$r/cuda-home
    rm -rf "$home" && mkdir -p "$home/include"
    for d in "$toolkit"/*; do [ "$(basename "$d")" = include ] || ln -s "$d" "$home/"; done
    for f in "$toolkit"/include/* "$toolkit"/include/cccl/*; do ln -sf "$f" "$home/include/"; done
    toolkit=$home
  fi
  export LD_LIBRARY_PATH=$paths CUDA_HOME=$toolkit MLX_PTX_CACHE_DIR=$r/ptx RLX_CACHE_DIR=$r/cache
  nvidia-smi -L
  echo "## libmlx.so (mlx-cuda-13): what the loader finds"
  ldd "$r/lib/libmlx.so" | grep -E 'not found|cu|nccl|nvrtc'
  echo "## the MLX backend's tests, capabilities and calibration (the file names the device: mlx-gpu or mlx-cpu)"
  for b in $(cd "$r/bin" && ls mlx_test_*) runtime_test_capabilities runtime_test_calibration; do
    local filter='*'
    case $b in runtime_test_*) filter='*mlx*:*Mlx*:AdvisoryCapabilities.*' ;; esac
    timeout 300 "$r/bin/$b" --gtest_filter="$filter" >"$out/$b.log" 2>&1
    echo "$b: exit $? | $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]|^\[  SKIPPED \] [0-9]' "$out/$b.log" | tr '\n' ' ')"
    grep -E '^\[  FAILED  \] [A-Z]|Failure|rror' "$out/$b.log" | head -20
  done
  ls "$RLX_CACHE_DIR" 2>/dev/null
  local shards
  shards=$(nproc)
  # MLX's compiled kernels from an earlier call (.gpu/mlx-ptx-cache.tar.xz, from its $OUT): each op test's first
  # run compiles its fused kernels with NVRTC, 15 to 115 s on an H100, which a whole suite cannot pay in one call.
  if [ -f .gpu/mlx-ptx-cache.tar.xz ]; then
    mkdir -p "$r/ptx-all" && tar xJf .gpu/mlx-ptx-cache.tar.xz -C "$r/ptx-all"
    echo "MLX kernel cache: $(find "$r/ptx-all" -type f | wc -l) files from an earlier call"
  fi
  echo "## conformance on MLX ($shards shards per binary)"
  for b in conformance_test_op_parity conformance_test_random_graphs conformance_test_errors; do
    local t0=$SECONDS
    for ((i = 0; i < shards; i++)); do
      mkdir -p "$r/ptx/$i" && [ -d "$r/ptx-all" ] && cp -rn "$r/ptx-all/." "$r/ptx/$i/" 2>/dev/null
      # A PTX cache per shard: MLX writes its cache files in place, so a shard could read another's half-written one.
      MLX_PTX_CACHE_DIR=$r/ptx/$i GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i timeout "${RLX_GPU_TIMEOUT:-400}" \
        "$r/bin/$b" --gtest_filter="${RLX_GPU_FILTER:-*mlx*}" >"$out/$b.$i.log" 2>&1 &
    done
    wait
    # A shard that crashed or ran past its timeout prints no summary: name the test it was in.
    for f in $(grep -LE '^\[  (PASSED|FAILED)  \]' "$out/$b".*.log); do
      local shard=${f%.log}
      echo "$b: shard ${shard##*.} did not finish (a crash or the timeout), in: $(grep -E '^\[ RUN' "$f" | tail -1)"
    done
    cat "$out/$b".*.log >"$out/$b.log" && rm -f "$out/$b".*.log
    echo "$b: $((SECONDS - t0)) s | passed $(grep -hoE '^\[  PASSED  \] [0-9]+' "$out/$b.log" | awk '{s+=$4} END {print s+0}')" \
      "| failed $(grep -E '^\[  FAILED  \] [A-Z]' "$out/$b.log" | sort -u | wc -l) | skipped $(grep -cE '^\[  SKIPPED \] [A-Z]' "$out/$b.log")"
    grep -E '^\[  FAILED  \] [A-Z]' "$out/$b.log" | sort -u | head -40
  done
  [ -n "${OUT:-}" ] && tar cJf "$OUT/mlx-logs.tar.xz" -C "$r" logs
  # Every shard's kernels, merged, for the next call (carry it back as .gpu/mlx-ptx-cache.tar.xz).
  if [ -n "${OUT:-}" ] && [ -d "$r/ptx" ]; then
    mkdir -p "$r/ptx-all"
    for d in "$r"/ptx/*/; do [ -d "$d" ] && cp -rn "$d." "$r/ptx-all/" 2>/dev/null; done
    tar cf - -C "$r/ptx-all" . | xz -T0 -6 >"$OUT/mlx-ptx-cache.tar.xz"
    echo "MLX kernel cache for the next call: $(du -h "$OUT/mlx-ptx-cache.tar.xz" | cut -f1)"
  fi
}

# There, after a call that carried some of the files: keeps them in /tmp for the call that carries the rest (a
# call's carry replaces the checkout's .gpu, and /tmp lasts while the machine stays warm).
mlx_stash() {
  mkdir -p /tmp/rlx-mlx-parts && cp .gpu/mlx-cuda-13.* .gpu/rlx-mlx.tar.xz .gpu/mlx-ptx-cache.tar.xz /tmp/rlx-mlx-parts/ 2>/dev/null
  ls -la /tmp/rlx-mlx-parts
}

mlx() {
  case "${1:-}" in
    pack) shift; mlx_pack "$@" ;;
    stash) mlx_stash ;;
    run) mlx_run ;;
    *) echo "usage: bash bench/gpu.sh mlx pack [build-dir] | mlx stash | mlx run" >&2; return 2 ;;
  esac
}

case "${1:-}" in
  pack) shift; pack "$@" ;;
  run) run ;;
  # The whole console output also goes to $OUT/cuda_full.txt, and the logs are packed even when an outer `timeout`
  # stops the run (its TERM): one call's partial figures still come back.
  cuda) shift
    full=${OUT:-/tmp/rlx}/cuda_full.txt
    mkdir -p "$(dirname "$full")"
    trap 'cuda_pack_out; exit 124' TERM
    cuda "$@" 2>&1 | tee "$full"
    cuda_pack_out ;;
  mlx) shift; mlx "$@" ;;
  nccl) shift; nccl "$@" ;;
  *) echo "usage: bash bench/gpu.sh pack [build-dir] | run | cuda [bench|suites] | nccl [ranks] | mlx pack [build-dir] | mlx stash | mlx run" >&2; exit 2 ;;
esac
