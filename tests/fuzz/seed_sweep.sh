#!/usr/bin/env bash
# Replays CI's short fuzz runs (tests/fuzz/CMakeLists.txt: 3000 inputs per translator from the
# checked-in corpus, an empty scratch corpus) with other seeds, and stops at the first finding.
# A red CI run whose log lost the finding's input can be reproduced this way: CI's own run
# explored slightly different inputs from the same seed (tests/fuzz/README.md), and other seeds
# explore others. CI's Vitis finding of 2026-11-29 took seeds 2-23 here (about 4 minutes).
#
#   tests/fuzz/seed_sweep.sh [FUZZER] [BACKENDS] [FIRST_SEED] [LAST_SEED]
#
# FUZZER: the sanitized fuzzer (default build/tests/sanitized_deploy/tests/fuzz/
# mqbench_deploy_fuzzer, which `scripts/test.sh` builds); BACKENDS: comma-separated translators
# (default: the 12 of CI); seeds 2 to 200 by default. The finding's input lands in
# fuzz-sweep/<backend>-s<seed>-crash-*, its log beside it; exit code 1 when something was found.
set -uo pipefail
cd "$(dirname "$0")/../.."
fuzzer="${1:-build/tests/sanitized_deploy/tests/fuzz/mqbench_deploy_fuzzer}"
backends="${2:-Academic,Tensorrt,SNPE,PPLW8A16,NNIE,Vitis,ONNX_QNN,PPLCUDA,OPENVINO,Tengine_u8,STPU,QDQ}"
first="${3:-2}"
last="${4:-200}"
if [[ ! -x "$fuzzer" ]]; then
  echo "seed_sweep: $fuzzer is missing: build the sanitized deploy (tests/fuzz/README.md)" >&2
  exit 2
fi
out=fuzz-sweep
mkdir -p "$out"
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
export ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:exitcode=86
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:exitcode=86
for ((seed = first; seed <= last; ++seed)); do
  for backend in ${backends//,/ }; do
    rm -rf "$scratch/corpus" && mkdir "$scratch/corpus"
    log="$out/$backend-s$seed.log"
    MQBENCH_FUZZ_BACKEND="$backend" "$fuzzer" -seed="$seed" -runs=3000 -max_total_time=120 \
      -timeout=20 -rss_limit_mb=4096 -artifact_prefix="$out/$backend-s$seed-" \
      "$scratch/corpus" tests/fuzz/corpus > "$log" 2>&1
    rc=$?
    if [[ $rc -ne 0 ]]; then
      echo "seed_sweep: backend $backend, seed $seed: exit code $rc; input and log in $out/:"
      grep -aE "deploy_fuzzer: backend|SUMMARY: |runtime error:|ERROR: " "$log" | head -5
      exit 1
    fi
    rm -f "$log"
    echo "seed $seed $backend: nothing found"
  done
done
echo "seed_sweep: nothing found for seeds $first-$last"
