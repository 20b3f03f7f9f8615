#!/usr/bin/env bash
# Installs the system packages mqbench needs (Debian bookworm; see docs/design/0001-fake-quantize-ops.md) and the
# npm packages of the tests. Idempotent: when everything is present it only checks and exits.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  build-essential cmake ninja-build ccache
  libtorch-dev libsleef-dev python3-torch python3-torchvision
  pybind11-dev python3-pybind11 python3-dev
  libonnx-dev python3-onnx libprotobuf-dev protobuf-compiler
  nlohmann-json3-dev
  libgtest-dev python3-pytest
  python3-sklearn python3-tqdm python3-numpy
)

# Node and npm run the onnxruntime checks; take Debian's only where no node is installed
# (a NodeSource nodejs already bundles npm, and Debian's npm would conflict with it).
command -v npm >/dev/null || APT_PACKAGES+=(nodejs npm)

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

# onnxruntime for the tests, from the npm registry. --ignore-scripts: the package's install
# script would download GPU binaries; the CPU runtime ships inside the package.
if [ ! -f node_modules/onnxruntime-node/package.json ]; then
  echo "setup: installing onnxruntime-node from the npm registry"
  npm install --ignore-scripts --no-audit --no-fund --loglevel=error
else
  echo "setup: onnxruntime-node present"
fi
