#!/usr/bin/env bash
# Installs what the build and the tests need, idempotently (quick when all is present):
#  * Debian packages: compilers (gcc; clang for the sanitizer and fuzzer build), CMake, Ninja,
#    ccache, and the C++ libraries of the deploy part and the tests (protobuf,
#    nlohmann_json, GoogleTest);
#  * a virtual environment (.venv, override with MQBENCH_VENV) made from python3 on PATH, with
#    the Python packages of requirements-dev.txt (torch 2.14.1 and torchvision 0.29.1 among
#    them), then requirements-peers.txt without dependencies. docs/design/build-and-ci.md says
#    why each comes from where;
#  * onnx's C++ source (the PyPI sdist of the pinned onnx) in third_party/, which the deploy
#    library compiles its checker from (docs/design/deploy.md).
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  build-essential cmake ninja-build ccache
  libprotobuf-dev protobuf-compiler
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
# The peers the tests compare files with, whose metadata would move the pins above: without
# their dependencies (requirements-peers.txt says why).
peer_stamp="$VENV/.mqbench-peers"
if ! cmp -s requirements-peers.txt "$peer_stamp"; then
  echo "setup: installing requirements-peers.txt into $VENV (--no-deps)"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
    -r requirements-peers.txt
  cp requirements-peers.txt "$peer_stamp"
else
  echo "setup: $VENV has requirements-peers.txt"
fi

# onnx's C++ library (checker, shape inference, schemas), which the deploy compiles in from its
# source release: the PyPI sdist of the onnx pinned above, checked against its hash and unpacked
# into third_party/ (cmake/OnnxFromSource.cmake; docs/design/deploy.md).
ONNX_VERSION=1.23.2
ONNX_SHA256=008cb0467b2bbee41448acc7da8b6f4e704624cb0d327a2d5adafc7ce19bc5b8
ONNX_DIR="third_party/onnx-$ONNX_VERSION"
if [ ! -f "$ONNX_DIR/onnx/checker.cc" ]; then
  echo "setup: fetching onnx $ONNX_VERSION's source (PyPI sdist) into $ONNX_DIR"
  tmp="$(mktemp -d)"
  "$VENV/bin/python" -m pip download -q --disable-pip-version-check --no-deps \
    --no-binary onnx -d "$tmp" "onnx==$ONNX_VERSION"
  echo "$ONNX_SHA256  $tmp/onnx-$ONNX_VERSION.tar.gz" | sha256sum -c --quiet
  tar -xzf "$tmp/onnx-$ONNX_VERSION.tar.gz" -C third_party
  rm -rf "$tmp"
else
  echo "setup: $ONNX_DIR has onnx's source"
fi
