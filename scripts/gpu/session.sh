#!/usr/bin/env bash
# The calls of one session on the lent H200 machine (../shared/device/README.md: set-up).
#   bash scripts/gpu/session.sh start     # versions, dequantize, start the plan's runs on
#                                             # every GPU (the last one after the update
#                                             # benchmark), then wait and collect
#   bash scripts/gpu/session.sh bench     # versions, dequantize; the plan's runs on GPUs 1..
#                                             # and, alone on GPU 0, solo.sh: the engine
#                                             # benchmark, then the recipe with --engine hf / vllm
#   bash scripts/gpu/session.sh collect   # wait and collect (another 9 minutes)
#   bash scripts/gpu/session.sh stop      # collect, stopping the runs still going
# Env: PLAN (grid.py plan), WAIT (s of the call to fill), BENCH=0 (no update benchmark),
# GPU_DELAY, STOP_AT_END=1. Everything comes back under $OUT; run folders stay in $HOME/runs
# between calls (while the machine stays warm).
set -u
MODE=${1:-start}
WAIT=${WAIT:-540}
M=${LABKIT_MODEL:-$HOME/labkit-device/model.gguf}
D=${LABKIT_GSM8K:-.device/gsm8k}
R=$HOME/runs
export LABKIT_CACHE=${LABKIT_CACHE:-$HOME/labkit-cache}
mkdir -p "$OUT/logs"
T0=$(date +%s)
left() { echo $(( WAIT - ($(date +%s) - T0) )); }

if [ "$MODE" = start ] || [ "$MODE" = bench ]; then
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
  # the runs use a frozen copy of the code: later calls re-send the working tree
  F=$HOME/frozen && rm -rf "$F" && mkdir -p "$F" && cp -r labkit benchmarks scripts "$F"/ && D=$(realpath "$D")
  if [ "$MODE" = start ]; then
    GPUS=$(seq -s, 0 $((NG - 1))) DELAY="$((NG - 1))=${GPU_DELAY:-170}"
  else
    GPUS=$(seq -s, 1 $((NG - 1))) DELAY="1=0"
  fi
  if [ -n "$GPUS" ]; then
    python "$F/scripts/gpu/grid.py" start --plan "${PLAN:-group-size}" --model "$M" --data "$D" \
      --runs-dir "$R" --gpus "$GPUS" --per-gpu 2 --gpu-delay "$DELAY" > "$OUT/logs/start.log" 2>&1
  fi
fi
if [ "$MODE" = start ] && [ "${BENCH:-1}" = 1 ]; then
  # the update benchmark on the last GPU, before that GPU takes runs
  CUDA_VISIBLE_DEVICES=$((NG - 1)) timeout 160 python benchmarks/bench_update.py --model "$M" \
    --samples 256 --out "$OUT/logs/bench_update.json" > "$OUT/logs/bench_update.log" 2>&1
fi
if [ "$MODE" = bench ]; then
  # GPU 0 to itself, detached so it outlives this call (scripts/gpu/solo.sh)
  GPU=0 SOLO=$HOME/solo M=$M D=$D JOBS=${JOBS:-} setsid nohup bash "$F/scripts/gpu/solo.sh" \
    > /dev/null 2>&1 < /dev/null &
  mkdir -p "$HOME/solo" && echo $! > "$HOME/solo/pid"
  echo "solo queue started on GPU 0, pid $!" >> "$OUT/logs/start.log"
fi
STOP=""
if [ "$MODE" = stop ] && [ -f "$HOME/solo/pid" ]; then
  kill -TERM -- "-$(cat "$HOME/solo/pid")" 2>/dev/null && sleep 45  # its run stops after the step
fi
{ [ "$MODE" = stop ] || [ "${STOP_AT_END:-0}" = 1 ]; } && STOP="--stop --stop-wait 45"
python scripts/gpu/grid.py collect --runs-dir "$R" --out "$OUT" --wait "$(left)" $STOP \
  > "$OUT/logs/collect.log" 2>&1
if [ -d "$HOME/solo" ]; then
  # wait for the solo queue too (the time left, if the grid finished first)
  while [ "$(left)" -gt 20 ] && ! grep -q "all done" "$HOME/solo/logs/solo.log" 2>/dev/null; do sleep 5; done
  mkdir -p "$OUT/logs/solo"
  cp "$HOME"/solo/logs/* "$OUT/logs/solo/" 2>/dev/null
  for r in "$HOME"/solo/runs/*/; do
    [ -d "$r" ] || continue
    mkdir -p "$OUT/logs/solo/$(basename "$r")"
    cp "$r"/*.json "$r"/*.jsonl "$OUT/logs/solo/$(basename "$r")/" 2>/dev/null
  done
fi
nvidia-smi --query-gpu=index,temperature.gpu,memory.used,utilization.gpu --format=csv > "$OUT/logs/gpu-now.txt" 2>&1
df -h "$HOME" > "$OUT/logs/disk.txt"
tar -czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$OUT/logs"
ls -la "$OUT"
