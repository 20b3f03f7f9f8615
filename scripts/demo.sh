#!/usr/bin/env bash
# The README's main-job command: installs what is missing, builds, and runs the demo (train,
# quantize, QAT, deploy, verify in onnxruntime: examples/deploy_demo.py; --help for flags).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" "${MQBENCH_VENV:-.venv}/bin/python" \
  examples/deploy_demo.py "$@"
