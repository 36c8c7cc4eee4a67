#!/usr/bin/env bash
# Installs RLX from a build tree into a scratch prefix, then configures, builds
# and runs tests/downstream against that prefix alone, as an outside project would.
#   check_downstream.sh <cmake> <rlx build dir> <generator> <c++ compiler>
set -euo pipefail
cmake=$1 build=$2 generator=$3 cxx=$4
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/rlx_downstream.XXXXXX")
trap 'rm -rf "$work"' EXIT

"$cmake" --install "$build" --prefix "$work/prefix" > "$work/install.log" || { cat "$work/install.log"; exit 1; }
"$work/prefix/bin/rlx" new-op Probe --stdout > /dev/null || { echo "the installed rlx does not run"; exit 1; }
# RLX_SANITIZE_FLAGS: set by CTest in a sanitizer build (tests/CMakeLists.txt), whose librlx needs the
# sanitizer runtime loaded first; the outside project is built with the same instrumentation.
"$cmake" -S "$here" -B "$work/build" -G "$generator" -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_CXX_FLAGS="${RLX_SANITIZE_FLAGS:-}" -DCMAKE_EXE_LINKER_FLAGS="${RLX_SANITIZE_FLAGS:-}" \
  -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF > "$work/configure.log" \
  || { cat "$work/configure.log"; exit 1; }
# The package must be the installed one, with its headers, not the source tree's.
rlx_dir=$(sed -n 's/^rlx_DIR:PATH=//p' "$work/build/CMakeCache.txt")
case $rlx_dir in "$work/prefix"/*) ;; *) echo "find_package(rlx) found '$rlx_dir', not the install"; exit 1 ;; esac
"$cmake" --build "$work/build"
"$work/build/downstream"
