#!/usr/bin/env bash
# The README's main-job command: installs what is missing, builds, and runs the demo (train,
# quantize, QAT, deploy, verify in onnxruntime: examples/deploy_demo.py; --help for flags; the
# flags go to it), then its LLM part (GPTQ INT4 saved as a compressed-tensors checkpoint and
# loaded back by plain transformers: examples/llm_serving.py).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" "${MQBENCH_VENV:-.venv}/bin/python" \
  examples/deploy_demo.py "$@"
PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" "${MQBENCH_VENV:-.venv}/bin/python" \
  examples/llm_serving.py --output-dir out/llm_serving
