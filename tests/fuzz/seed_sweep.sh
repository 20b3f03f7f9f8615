#!/usr/bin/env bash
# Replays CI's short fuzz runs (tests/fuzz/CMakeLists.txt: MQBENCH_FUZZ_RUNS inputs per
# translator from the checked-in corpus, an empty scratch corpus) with other seeds, and stops at
# the first finding. A red CI run whose log lost the finding's input can be reproduced this way:
# CI's own run explored slightly different inputs from the same seed (tests/fuzz/README.md), and
# other seeds explore others. CI's Vitis finding of 2026-11-29 took seeds 2-23 here (about 4
# minutes).
#
#   tests/fuzz/seed_sweep.sh [FUZZER] [BACKENDS] [FIRST_SEED] [LAST_SEED]
#
# FUZZER: the sanitized fuzzer (default build/tests/sanitized_deploy/tests/fuzz/
# mqbench_deploy_fuzzer, which `scripts/test.sh` builds; a relative path is taken from the
# current directory); BACKENDS: comma-separated translators (default: the 12 of CI); seeds 2 to
# 200 by default; FUZZ_RUNS (environment): inputs per run, 3000 as in CI. A run that fails
# leaves its input (for a finding) and its log in fuzz-sweep/ at the repository's root; the exit
# code is then 1 (a finding, or a fuzzer that failed otherwise: read the log), 2 for bad usage.
set -uo pipefail
fuzzer="${1:-}"
if [[ -n "$fuzzer" && "$fuzzer" != /* ]]; then fuzzer="$PWD/$fuzzer"; fi
cd "$(dirname "$0")/../.." || exit 2
fuzzer="${fuzzer:-$PWD/build/tests/sanitized_deploy/tests/fuzz/mqbench_deploy_fuzzer}"
all="Academic,Tensorrt,SNPE,PPLW8A16,NNIE,Vitis,ONNX_QNN,PPLCUDA,OPENVINO,Tengine_u8,STPU,QDQ"
backends="${2:-$all}"
first="${3:-2}"
last="${4:-200}"
runs="${FUZZ_RUNS:-3000}"
for n in "$first" "$last" "$runs"; do
  if [[ ! "$n" =~ ^[0-9]+$ ]]; then
    echo "seed_sweep: '$n' is not a number (usage: see the header of $0)" >&2
    exit 2
  fi
done
if [[ ! -x "$fuzzer" ]]; then
  echo "seed_sweep: $fuzzer is missing: build the sanitized deploy (tests/fuzz/README.md)" >&2
  exit 2
fi
out="$PWD/fuzz-sweep"
mkdir -p "$out" || exit 2
scratch=$(mktemp -d) || exit 2
trap 'rm -rf "$scratch"' EXIT
export ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:exitcode=86
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:exitcode=86
for ((seed = first; seed <= last; ++seed)); do
  for backend in ${backends//,/ }; do
    rm -rf "$scratch/corpus" && mkdir "$scratch/corpus" || exit 2
    log="$out/$backend-s$seed.log"
    MQBENCH_FUZZ_BACKEND="$backend" "$fuzzer" -seed="$seed" -runs="$runs" -max_total_time=120 \
      -timeout=20 -rss_limit_mb=4096 -artifact_prefix="$out/$backend-s$seed-" \
      "$scratch/corpus" tests/fuzz/corpus > "$log" 2>&1
    rc=$?
    if [[ $rc -ne 0 ]]; then
      echo "seed_sweep: backend $backend, seed $seed: exit code $rc; its log: $log"
      grep -aE "deploy_fuzzer: backend|SUMMARY: |runtime error:|ERROR: " "$log" | head -5
      exit 1
    fi
    rm -f "$log"
    echo "seed $seed $backend: nothing found"
  done
done
echo "seed_sweep: nothing found for seeds $first-$last"
