#!/usr/bin/env bash
# Configures and builds libmqbench, the Python module mqbench._C (written into python/mqbench/)
# and the tests, in ./build (override with BUILD_DIR). Incremental: reruns cost seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${BUILD_DIR:-build}"
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release
fi
cmake --build "$BUILD_DIR" --parallel "$(nproc)"
