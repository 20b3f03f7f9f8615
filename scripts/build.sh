#!/usr/bin/env bash
# Configures and builds libmqbench, libmqbench_deploy, the mqbench-deploy CLI, the Python module
# mqbench._C (written into python/mqbench/) and the tests in ./build (override with BUILD_DIR),
# against the torch of .venv (override with MQBENCH_VENV). Incremental: reruns cost seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${BUILD_DIR:-build}"
VENV="${MQBENCH_VENV:-.venv}"
PY="$(cd "$VENV/bin" && pwd)/python"
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$PY" \
    ${MQBENCH_CMAKE_ARGS:-}
fi
cmake --build "$BUILD_DIR" --parallel "$(nproc)"
