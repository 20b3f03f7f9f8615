#!/usr/bin/env bash
# Installs what the build and the tests need, idempotently (quick when all is present):
#  * Debian packages: compilers (gcc; clang for the sanitizer and fuzzer build), CMake, Ninja,
#    ccache, and the C++ libraries of the deploy part and the tests (protobuf + libonnx,
#    nlohmann_json, GoogleTest);
#  * a virtual environment (.venv, override with MQBENCH_VENV) made from python3 on PATH, with
#    the Python packages of requirements-dev.txt (torch 2.14.1 and torchvision 0.29.1 among
#    them). docs/design/0005-torch-wheels.md says why each comes from where.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  build-essential cmake ninja-build ccache
  libprotobuf-dev protobuf-compiler libonnx-dev
  nlohmann-json3-dev libgtest-dev
  # the sanitized deploy build and the fuzzer (tests/sanitized_builds.cmake): clang and its runtimes
  clang-14 libclang-rt-14-dev
)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "setup: all ${#APT_PACKAGES[@]} system packages present"
fi

VENV="${MQBENCH_VENV:-.venv}"
PYTHON="${MQBENCH_PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 9))' || {
    echo "setup: $PYTHON is $("$PYTHON" --version 2>&1); mqbench needs Python >= 3.9 (set MQBENCH_PYTHON)" >&2
    exit 1
  }
  echo "setup: creating $VENV with $("$PYTHON" --version 2>&1)"
  "$PYTHON" -m venv "$VENV"
fi
# Reinstall only when requirements-dev.txt changed since the last successful install.
stamp="$VENV/.mqbench-requirements"
if ! cmp -s requirements-dev.txt "$stamp"; then
  echo "setup: installing requirements-dev.txt into $VENV (torch is a large wheel: minutes)"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r requirements-dev.txt
  cp requirements-dev.txt "$stamp"
else
  echo "setup: $VENV has requirements-dev.txt"
fi
