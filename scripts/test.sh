#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, then runs every test through
# CTest (GoogleTest binaries, pytest on both CPU kernel paths, the installed-package consumer,
# the pip wheel and the examples), printing each runner's own summary.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
BUILD_DIR="${BUILD_DIR:-build}"
rc=0
ctest --test-dir "$BUILD_DIR" --output-on-failure --no-tests=error -V || rc=$?
# A sanitizer or fuzzer finding, with its input, again at the very end of the log
# (tests/sanitized_builds.cmake writes it; tests/fuzz/README.md says how to replay an input).
findings="$BUILD_DIR/tests/sanitized_deploy/findings.txt"
if [[ $rc -ne 0 && -s "$findings" ]]; then
  echo "== findings of the sanitized deploy (deploy_sanitized_and_fuzzed) =="
  cat "$findings"
fi
exit $rc
