#!/usr/bin/env bash
# The calls of one session on the lent H200 machine (../shared/device/README.md: set-up).
#   bash benchmarks/h200_session.sh start     # versions, dequantize, start the plan's runs on
#                                             # GPU 0 (and GPU 1 after the update benchmark),
#                                             # then wait and collect until the call's end
#   bash benchmarks/h200_session.sh collect   # wait and collect (another 9 minutes)
#   bash benchmarks/h200_session.sh stop      # collect, stopping the runs still going
# Everything it writes comes back under $OUT; run folders stay in $HOME/runs between calls.
set -u
MODE=${1:-start}
WAIT=${WAIT:-540}
M=${LABKIT_MODEL:-$HOME/labkit-device/model.gguf}
D=${LABKIT_GSM8K:-.device/gsm8k}
R=$HOME/runs
export LABKIT_CACHE=${LABKIT_CACHE:-$HOME/labkit-cache}
mkdir -p "$OUT/logs"
T0=$(date +%s)
if [ "$MODE" = start ]; then
  nvidia-smi > "$OUT/logs/nvidia-smi.txt" 2>&1
  python - > "$OUT/logs/versions.txt" 2>&1 <<'PY'
import torch, transformers, vllm, platform
print("python", platform.python_version(), "torch", torch.__version__, "transformers", transformers.__version__, "vllm", vllm.__version__)
print("gpus", torch.cuda.device_count(), torch.cuda.get_device_name(0))
PY
  sha256sum "$M" >> "$OUT/logs/versions.txt"
  python -c "from labkit.models import resolve_model; print(resolve_model('$M'))" > "$OUT/logs/dequantize.log" 2>&1
  echo "dequantize: $(( $(date +%s) - T0 )) s" >> "$OUT/logs/versions.txt"
  NG=$(python -c "import torch; print(torch.cuda.device_count())")
  GPUS=$(seq -s, 0 $((NG - 1)))
  # the runs use a frozen copy of the code: later calls re-send the working tree
  F=$HOME/frozen && rm -rf "$F" && mkdir -p "$F" && cp -r labkit benchmarks "$F"/ && D=$(realpath "$D")
  python "$F/benchmarks/h200_grid.py" start --plan "${PLAN:-group-size}" --model "$M" --data "$D" --runs-dir "$R" \
    --gpus "$GPUS" --per-gpu 2 --gpu-delay "$((NG - 1))=${GPU_DELAY:-170}" > "$OUT/logs/start.log" 2>&1
  # the update benchmark (issue 10) on the last GPU, before that GPU takes runs
  [ "${BENCH:-1}" = 1 ] && CUDA_VISIBLE_DEVICES=$((NG - 1)) timeout 160 python benchmarks/bench_update.py --model "$M" \
    --samples 256 --out "$OUT/logs/bench_update.json" > "$OUT/logs/bench_update.log" 2>&1
fi
STOP=""
{ [ "$MODE" = stop ] || [ "${STOP_AT_END:-0}" = 1 ]; } && STOP="--stop --stop-wait 45"
python benchmarks/h200_grid.py collect --runs-dir "$R" --out "$OUT" \
  --wait "$(( WAIT - ($(date +%s) - T0) ))" $STOP > "$OUT/logs/collect.log" 2>&1
nvidia-smi --query-gpu=index,temperature.gpu,memory.used,utilization.gpu --format=csv > "$OUT/logs/gpu-now.txt" 2>&1
df -h "$HOME" > "$OUT/logs/disk.txt"
tar -czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$OUT/logs"
ls -la "$OUT"
