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
)
# pip package -> the module it provides (to check whether it is installed).
PIP_PACKAGES=(numpy:numpy onnx:onnx onnxruntime:onnxruntime pytest:pytest nanobind:nanobind
              scikit-build-core:scikit_build_core ml_dtypes:ml_dtypes matplotlib:matplotlib scikit-learn:sklearn tqdm:tqdm)

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
if [ ${#need[@]} -gt 0 ]; then
  echo "[bootstrap] pip install ${need[*]}"
  "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
  "$VENV/bin/python" -m pip install -q "${need[@]}"
fi
touch "$VENV/.bootstrapped"
