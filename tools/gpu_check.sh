#!/usr/bin/env bash
# The GPU machine's check, in stages sized for its lease: 15 minutes of device time
# per session, start-up included, and 10 minutes per command (../.library/device/README.md).
#
#   bash tools/gpu_check.sh [STAGE...]        default: build pytest bench sanitizer
#
#   build      configure + build the Python module mqbench._C only, SASS for sm_90 (H100 / H200)
#              only, with /usr/bin/g++ (about 1.5 minutes on 16 cores)
#   pytest     every test that needs CUDA, in every file (pytest --cuda-only: the tests carrying
#              a skip-without-CUDA mark, 2,321 of them), naming failures and skips (-rfEs), in
#              4 processes where pytest-xdist is installed
#   sanitizer  compute-sanitizer memcheck, then initcheck, over a sample of the op tests (the
#              formats' included, 336 tests): the misaligned ("offset"), strided ("sliced") and
#              empty layouts in float32; MQBENCH_SANITIZER_K overrides the -k expression (e.g.
#              "contiguous and float64" for the 32-byte vector loads)
#   bench      bench/bench_gpu.py --sections bw,obs,fmt (the bandwidth, observer and formats
#              tables)
#   qat        bench/bench_gpu.py --sections qat --all-variants (QAT steps, fp32 and bf16)
#   ddp        examples/ddp_qat.py under torchrun with nccl (world of 1; of 2 where two GPUs are
#              present) and gloo on CUDA tensors (docs/ddp.md, "Owed on the GPU machine")
#   llm        examples/llm_gptq.py --quick --device cuda: RTN, GPTQ, SignRound on a CUDA Llama
#              from CPU calibration data, prepared both orders, deployed, run in onnxruntime
#   ctest      the whole build (deploy, tests, examples) and CTest without the pip wheel test:
#              long, a command of its own
#
# The stages share one deadline, MQBENCH_GPU_DEADLINE_S seconds from the start (default 560, so
# that the command ends inside the device's 10-minute limit with its logs written): a stage runs
# under `timeout` for what is left, and one with under 30 s left is skipped, with a line saying
# so. A later call on the still-warm machine reuses ./build-gpu (the build stage then takes
# seconds). Logs land in $OUT (or ./gpu-logs): at most 8 files, as the device tool returns.
#
# That machine lacks the C++ build dependencies. Fetch Debian's packages here, into a folder
# that git ignores, and carry it (and third_party/onnx-1.23.2, from scripts/setup.sh) with the
# call:
#   mkdir -p .gpudeps && echo /.gpudeps/ >> .git/info/exclude && (cd .gpudeps && apt-get download \
#     libprotobuf-dev libprotobuf32 libprotobuf-lite32 libprotoc32 protobuf-compiler \
#     libonnx-dev libonnx1 libonnxifi nlohmann-json3-dev libgtest-dev googletest)
# Build with /usr/bin/g++: the image's other compiler links libstdc++ statically, and the
# extension then crashes inside TORCH_CHECK's message formatting.
set -uo pipefail
SELF="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$0")/.."
LOGS="${OUT:-$PWD/gpu-logs}"
mkdir -p "$LOGS"
PY="${MQBENCH_GPU_PYTHON:-$(command -v python3)}"
BUILD="${MQBENCH_GPU_BUILD:-$PWD/build-gpu}"
DEPS=/tmp/mqbench-deps
export LD_LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1

configure() {
  # $1: extra cmake arguments
  [ -f "$BUILD/build.ninja" ] && return 0
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$PY" \
    -DCMAKE_PREFIX_PATH="$DEPS/usr" -DMQBENCH_USE_CCACHE=OFF \
    -DMQBENCH_CUDA_ARCHITECTURES=90-real $1 >>"$LOGS/build.log" 2>&1 \
    || { tail -40 "$LOGS/build.log"; return 1; }
}

stage_build() {
  configure "-DMQBENCH_BUILD_TESTS=OFF" || return 1
  cmake --build "$BUILD" --target mqbench_python --parallel "$(nproc)" >>"$LOGS/build.log" 2>&1 \
    || { grep -B2 -A12 "error" "$LOGS/build.log" | head -80; return 1; }
  "$PY" -c 'import sys; sys.path.insert(0, "python"); import torch, mqbench
x = torch.randn(1000, device="cuda")
y = torch.ops.mqbench.fake_quantize_per_tensor_affine(
    x, torch.tensor([0.1], device="cuda"), torch.tensor([0], device="cuda"), -128, 127)
print("build: mqbench._C runs on", torch.cuda.get_device_name(), "max |y - x| =",
      float((y - x).abs().max()))'
}

stage_pytest() {
  local par=()  # pytest-xdist where installed (the GPU image has it): 4 processes share the GPU
  "$PY" -c "import xdist" 2>/dev/null && par=(-n 4)
  "$PY" -m pytest -q -rfEs -p no:cacheprovider --cuda-only "${par[@]}" tests/python \
    >"$LOGS/pytest.log" 2>&1
  local status=$?
  grep -E "^(FAILED|ERROR)" "$LOGS/pytest.log" | head -40
  tail -3 "$LOGS/pytest.log"
  return $status
}

stage_sanitizer() {
  # the affine / formats kernels on their odd layouts, and the Hadamard / per-token kernels
  # (every layout inside each test) in float32
  local sample="((offset or sliced or empty) and float32) or (llm_act and float32)"
  local k="${MQBENCH_SANITIZER_K:-$sample}" status=0 s tool
  for tool in memcheck initcheck; do
    s=0
    compute-sanitizer --tool "$tool" --error-exitcode 3 \
      "$PY" -m pytest -q -p no:cacheprovider --cuda-only -k "$k" \
      tests/python/ops/test_cuda_affine_ops.py tests/python/ops/test_cuda_algorithm_ops.py \
      tests/python/observer/test_cuda_observers.py tests/python/ops/test_cuda_bn_fold.py \
      tests/python/formats/test_fp8_ops.py tests/python/formats/test_group_ops.py \
      tests/python/formats/test_cuda_formats.py tests/python/ops/test_cuda_llm_act_ops.py \
      >"$LOGS/sanitizer-$tool.log" 2>&1 || s=$?
    echo "compute-sanitizer --tool $tool: exit $s"
    grep -E "ERROR SUMMARY|passed|failed" "$LOGS/sanitizer-$tool.log" | tail -3
    [ "$s" -eq 0 ] || status=$s
  done
  return $status
}

stage_bench() {
  PYTHONPATH=python "$PY" bench/bench_gpu.py --sections bw,obs,fmt 2>&1 \
    | tee "$LOGS/bench_bw_obs.log"
}

stage_qat() {
  PYTHONPATH=python "$PY" bench/bench_gpu.py --sections qat --all-variants 2>&1 \
    | tee "$LOGS/bench_qat.log"
}

stage_ddp() {
  local status=0 n
  n=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
  {
    echo "== nccl, world of 1"
    PYTHONPATH=python "$PY" -m torch.distributed.run --standalone --nproc_per_node=1 \
      examples/ddp_qat.py --device cuda --output-dir out/ddp_nccl1 || status=1
    echo "== gloo on CUDA tensors, two processes sharing the GPU"
    PYTHONPATH=python "$PY" -m torch.distributed.run --standalone --nproc_per_node=2 \
      examples/ddp_qat.py --device cuda --dist-backend gloo --output-dir out/ddp_gloo_cuda \
      || status=1
    if [ "$n" -ge 2 ]; then
      echo "== nccl, world of 2 ($n GPUs)"
      PYTHONPATH=python "$PY" -m torch.distributed.run --standalone --nproc_per_node=2 \
        examples/ddp_qat.py --device cuda --output-dir out/ddp_nccl2 || status=1
    fi
  } >"$LOGS/ddp.log" 2>&1
  grep -E "^==|ranks identical|Error|error:" "$LOGS/ddp.log" | head -20
  return $status
}

stage_llm() {
  PYTHONPATH=python "$PY" examples/llm_gptq.py --quick --device cuda 2>&1 | tee "$LOGS/llm.log"
}

stage_ctest() {
  rm -f "$BUILD/build.ninja" "$BUILD/CMakeCache.txt"  # reconfigure with the tests
  configure "-DMQBENCH_BUILD_TESTS=ON" || return 1
  cmake --build "$BUILD" --parallel "$(nproc)" >>"$LOGS/build.log" 2>&1 \
    || { grep -B2 -A12 "error" "$LOGS/build.log" | head -80; return 1; }
  ctest --test-dir "$BUILD" --output-on-failure -E '^python_wheel$' -j 4 >"$LOGS/ctest.log" 2>&1
  local status=$?
  grep -E "tests passed|tests failed|\*\*\*Failed|Timeout" "$LOGS/ctest.log" | tail -20
  return $status
}

# One stage, run by the loop below under `timeout` (which runs programs, not functions).
if [ "${1:-}" = --stage ]; then
  "stage_$2"
  exit $?
fi

DEADLINE=$((SECONDS + ${MQBENCH_GPU_DEADLINE_S:-560}))
STAGES=("$@")
[ ${#STAGES[@]} -eq 0 ] && STAGES=(build pytest bench sanitizer)
for s in "${STAGES[@]}"; do
  case "$s" in build|pytest|sanitizer|bench|qat|ddp|llm|ctest) ;;
    *) echo "gpu_check: unknown stage '$s' (build pytest sanitizer bench qat ddp llm ctest)" >&2
       exit 2 ;;
  esac
done
mkdir -p "$DEPS"
for f in .gpudeps/*.deb; do [ -e "$f" ] && dpkg -x "$f" "$DEPS"; done
SUMMARY="$LOGS/summary.txt"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__,
    "cuda", torch.version.cuda, "gpu", torch.cuda.is_available())'
  nvcc --version | tail -2
  echo "stages: ${STAGES[*]}"
} 2>&1 | tee -a "$SUMMARY"

rc=0
built=yes
for s in "${STAGES[@]}"; do
  left=$((DEADLINE - SECONDS)) t0=$SECONDS status=0
  if [ "$built" = no ]; then  # the later stages would test an older mqbench._C, or none
    echo "gpu_check: $s SKIPPED (the build failed)" | tee -a "$SUMMARY"
    continue
  fi
  if [ "$left" -lt 30 ]; then
    echo "gpu_check: $s SKIPPED (${left} s left of the deadline)" | tee -a "$SUMMARY"
    rc=1
    continue
  fi
  timeout --kill-after=10 "$left" bash "$SELF" --stage "$s" || status=$?
  how="exit $status"
  if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then how="TIMED OUT after ${left} s"; fi
  echo "gpu_check: $s $how ($((SECONDS - t0)) s)" | tee -a "$SUMMARY"
  [ "$status" -eq 0 ] || rc=1
  if [ "$s" = build ] && [ "$status" -ne 0 ]; then built=no; fi
done
echo "gpu_check: done in $SECONDS s, exit $rc" | tee -a "$SUMMARY"
exit $rc
