#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, then runs every test through
# CTest (GoogleTest binaries, pytest on both CPU kernel paths, the installed-package consumer,
# the pip wheel and the examples), printing each runner's own summary.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
BUILD_DIR="${BUILD_DIR:-build}"
ctest --test-dir "$BUILD_DIR" --output-on-failure --no-tests=error -V
