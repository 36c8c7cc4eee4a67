#!/usr/bin/env bash
# Installs pyrlx into the project's virtual environment from the CMake build
# (no second compile: a .pth file points at build/python, which holds the
# extension built by `make build` plus links to the pure-Python sources), then
# runs the pytest suite.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
PY=.venv/bin/python
site=$($PY -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$(pwd)/$BUILD/python" > "$site/pyrlx-build.pth"
$PY -c "import pyrlx; print('[pyrlx]', pyrlx.__file__)"
exec $PY -m pytest -q python/tests "$@"
