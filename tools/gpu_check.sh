#!/usr/bin/env bash
# Builds mqbench on the GPU machine (torch 2.11 + CUDA 13, Python 3.12, no package registry) and
# runs the test suites there, CUDA tests included, then the CUDA tests under compute-sanitizer.
#
# That machine lacks the C++ build dependencies of the deploy part and the tests. Fetch Debian's
# packages here, into a folder that git ignores, and carry it with the call:
#   mkdir -p .gpudeps && echo /.gpudeps/ >> .git/info/exclude && (cd .gpudeps && apt-get download \
#     libprotobuf-dev libprotobuf32 libprotobuf-lite32 libprotoc32 protobuf-compiler \
#     libonnx-dev libonnx1 libonnxifi nlohmann-json3-dev libgtest-dev googletest)
# then run `bash tools/gpu_check.sh` there with .gpudeps carried. Logs land in $OUT (or ./gpu-logs).
# Build with /usr/bin/g++: the image's other compiler links libstdc++ statically, and the
# extension then crashes inside TORCH_CHECK's message formatting.
set -uo pipefail
cd "$(dirname "$0")/.."
LOGS="${OUT:-$PWD/gpu-logs}"
mkdir -p "$LOGS"
DEPS=/tmp/mqbench-deps
mkdir -p "$DEPS"
for f in .gpudeps/*.deb; do dpkg -x "$f" "$DEPS"; done
export LD_LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++
PY="${MQBENCH_GPU_PYTHON:-$(command -v python3)}"
BUILD=/tmp/mqbench-build
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$LOGS/versions.txt"
"$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__,
  "cuda", torch.version.cuda, "gpu", torch.cuda.is_available())' | tee -a "$LOGS/versions.txt"
nvcc --version | tail -2 | tee -a "$LOGS/versions.txt"

start=$(date +%s)
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$PY" \
  -DCMAKE_PREFIX_PATH="$DEPS/usr" -DMQBENCH_USE_CCACHE=OFF >"$LOGS/configure.log" 2>&1 \
  || { tail -40 "$LOGS/configure.log"; exit 1; }
grep -i "mqbench\|cuda" "$LOGS/configure.log" | head -20
cmake --build "$BUILD" --parallel "$(nproc)" >"$LOGS/build.log" 2>&1 \
  || { grep -B2 -A12 "error" "$LOGS/build.log" | head -80; exit 1; }
echo "gpu_check: configure + build took $(( $(date +%s) - start )) s"

# Every CTest test but the pip wheel one (it installs into a fresh venv: no registry there).
ctest --test-dir "$BUILD" --output-on-failure -E '^python_wheel$' -j 4 >"$LOGS/ctest.log" 2>&1
rc=$?
grep -E "passed|failed|skipped|PASSED|FAILED|tests passed|Test +#" "$LOGS/ctest.log" | tail -40
"$PY" -m pytest -q -rs -p no:cacheprovider tests/python/test_cuda_*.py 2>&1 | tail -5

# compute-sanitizer over the CUDA tests (memcheck, then initcheck).
for tool in memcheck initcheck; do
  compute-sanitizer --tool "$tool" --error-exitcode 3 \
    "$PY" -m pytest -q -p no:cacheprovider tests/python/test_cuda_*.py >"$LOGS/sanitizer-$tool.log" 2>&1
  echo "compute-sanitizer --tool $tool: exit $? ($(grep -c "ERROR SUMMARY: 0 errors" \
    "$LOGS/sanitizer-$tool.log") clean summaries)"; tail -3 "$LOGS/sanitizer-$tool.log"
done

# The benchmark table of docs/benchmarks.md (GPU section), when asked: MQBENCH_GPU_BENCH=1
# (bandwidth and observers, a few minutes) or MQBENCH_GPU_BENCH=all (also the QAT steps, fp32
# and bf16 autocast; may need a call of its own for the 10-minute limit).
case "${MQBENCH_GPU_BENCH:-0}" in
  1) PYTHONPATH=python "$PY" bench/bench_gpu.py --sections bw,obs 2>&1 | tee "$LOGS/bench_gpu.log" ;;
  all) PYTHONPATH=python "$PY" bench/bench_gpu.py --all-variants 2>&1 | tee "$LOGS/bench_gpu.log" ;;
esac
exit $rc
