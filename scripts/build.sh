#!/usr/bin/env bash
# Configures and builds libmqbench, libmqbench_deploy, the mqbench-deploy CLI, the Python module
# mqbench._C (written into python/mqbench/) and the tests in ./build (override with BUILD_DIR),
# against the torch of .venv (override with MQBENCH_VENV). Incremental: reruns cost seconds.
#
# Prints one line per stage. The compiler's full output goes to $BUILD_DIR/build.log; when a
# stage fails, the failing command and its errors are printed from it. MQBENCH_VERBOSE=1 streams
# the whole output instead.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${BUILD_DIR:-build}"
VENV="${MQBENCH_VENV:-.venv}"
PY="$(cd "$VENV/bin" && pwd)/python"
mkdir -p "$BUILD_DIR"
LOG="$BUILD_DIR/build.log"
: >"$LOG"

# stage NAME COMMAND...: runs COMMAND with its output in $LOG, then prints one line.
stage() {
  local name="$1" t0=$SECONDS status=0
  shift
  if [ "${MQBENCH_VERBOSE:-0}" = 1 ]; then
    "$@" 2>&1 | tee -a "$LOG" || status=$?
  else
    "$@" >>"$LOG" 2>&1 || status=$?
  fi
  if [ "$status" -ne 0 ]; then
    echo "build: $name FAILED after $((SECONDS - t0)) s; full log: $LOG" >&2
    if grep -q '^FAILED:' "$LOG"; then
      sed -n '/^FAILED:/,$p' "$LOG" | head -n 200 >&2   # ninja: the failing command, its errors
    else
      tail -n 60 "$LOG" >&2
    fi
    exit "$status"
  fi
  echo "build: $name done ($((SECONDS - t0)) s)"
}

# In CI (CI=true) a warning in our own code is an error (torch's and pybind11's headers are
# system headers: theirs stay quiet).
# CI compiles the CUDA kernels for one architecture (sm_90, the GPU machine's): nothing CUDA runs
# there, the compile is the check, and each further architecture adds a device pass per kernel
# file (docs/design/build-and-ci.md). Builds elsewhere keep the default list (CMakeLists.txt).
CI_ARGS=""
if [ "${CI:-}" = true ]; then
  CI_ARGS="-DMQBENCH_WERROR=ON"
  case " ${MQBENCH_CMAKE_ARGS:-} " in
    *MQBENCH_CUDA_ARCHITECTURES*) ;;
    *) CI_ARGS="$CI_ARGS -DMQBENCH_CUDA_ARCHITECTURES=90-real" ;;
  esac
fi
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  stage "configure ($BUILD_DIR)" cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DPython_EXECUTABLE="$PY" $CI_ARGS ${MQBENCH_CMAKE_ARGS:-}
fi
stage "compile and link ($(nproc) jobs)" cmake --build "$BUILD_DIR" --parallel "$(nproc)"
warnings=$(grep -c 'warning:' "$LOG" || true)
if [ "$warnings" -gt 0 ]; then
  echo "build: $warnings compiler warnings, see $LOG"
fi
