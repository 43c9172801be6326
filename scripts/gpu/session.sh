#!/usr/bin/env bash
# The calls of one session on a lent GPU machine (../shared/device/README.md: set-up).
#   bash scripts/gpu/session.sh start     # versions, dequantize, then detached: solo.sh on
#                                         # GPU 0 (benchmarks, timed recipe runs, then run
#                                         # queues) and QUEUES run queues on every other GPU;
#                                         # then wait (WAIT s) and collect
#   bash scripts/gpu/session.sh collect   # wait (WAIT s) and collect
#   bash scripts/gpu/session.sh stop      # stop what still runs (each run after its step), collect
# Env: PLAN (plans.py), WAIT (s of the call to fill, 540), QUEUES (per GPU, 2), JOBS (solo.sh),
# QUEUE_SHARE (queue_runs.py --share: each run set as one of that many on its GPU).
# Everything comes back under $OUT as one tarball; run folders stay in $HOME/runs and
# $HOME/solo between calls (while the machine stays warm).
set -u
MODE=${1:-start}
WAIT=${WAIT:-540}
M=${LABKIT_MODEL:-$HOME/labkit-device/model.gguf}
D=${LABKIT_GSM8K:-.device/gsm8k}
R=$HOME/runs
SOLO=$HOME/solo
export LABKIT_CACHE=${LABKIT_CACHE:-$HOME/labkit-cache}
mkdir -p "$OUT/logs" "$R" "$SOLO"
[ "$MODE" = start ] && rm -f "$R/.stop"
T0=$(date +%s)
left() { echo $(( WAIT - ($(date +%s) - T0) )); }

if [ "$MODE" = start ]; then
  nvidia-smi > "$OUT/logs/nvidia-smi.txt" 2>&1
  python - > "$OUT/logs/versions.txt" 2>&1 <<'PY'
import torch, transformers, vllm, platform
print("python", platform.python_version(), "torch", torch.__version__, "transformers", transformers.__version__, "vllm", vllm.__version__)
print("gpus", torch.cuda.device_count(), torch.cuda.get_device_name(0))
PY
  sha256sum "$M" >> "$OUT/logs/versions.txt"
  # where an HTTP weight sync's file can go: /dev/shm (memory) if it has room, else the temp folder
  { echo "== /dev/shm and the temp folder"; df -h /dev/shm "${TMPDIR:-/tmp}"
    grep -E " (/dev/shm|${TMPDIR:-/tmp}|/) " /proc/mounts; echo "ulimit -l $(ulimit -l)"; } >> "$OUT/logs/versions.txt" 2>&1
  python -c "from labkit.models import resolve_model; print(resolve_model('$M'))" > "$OUT/logs/dequantize.log" 2>&1
  echo "dequantize: $(( $(date +%s) - T0 )) s" >> "$OUT/logs/versions.txt"
  NG=$(python -c "import torch; print(torch.cuda.device_count())")
  # the runs use a frozen copy of the code: later calls re-send the working tree
  F=$HOME/frozen && rm -rf "$F" && mkdir -p "$F" && cp -r labkit benchmarks scripts data tests pyproject.toml $([ -d notebooks ] && echo notebooks) "$F"/
  D=$(realpath "$D")
  export PYTHONPATH=$F${PYTHONPATH:+:$PYTHONPATH}  # the frozen labkit first, for every job
  ( cd "$F" && GPU=0 SOLO=$SOLO M=$M D=$D R=$R QUEUES=${QUEUES:-2} JOBS=${JOBS:-} \
      setsid nohup bash scripts/gpu/solo.sh > /dev/null 2>&1 < /dev/null & echo $! > "$SOLO/pid" )
  for g in $(seq 1 $((NG - 1))); do
    for q in $(seq 1 "${QUEUES:-2}"); do
      ( cd "$F" && CUDA_VISIBLE_DEVICES=$g setsid nohup python scripts/gpu/queue_runs.py \
          --plan "${PLAN:-held-out}" --model "$M" --data "$D" --runs-dir "$R" --name "gpu$g-q$q" \
          --share "${QUEUE_SHARE:-0}" \
          >> "$R/queue-gpu$g-q$q.log" 2>&1 < /dev/null & )
      sleep 25
    done
  done
  echo "started: solo on GPU 0, ${QUEUES:-2} queues on each of GPUs 1..$((NG - 1))" > "$OUT/logs/start.log"
fi
if [ "$MODE" = stop ]; then  # SIGTERM: each run stops after its step, its log complete
  touch "$R/.stop"  # and no queue claims another run
  pkill -TERM -f scripts/gpu/queue_runs.py; pkill -TERM -f "labkit launch"; pkill -TERM -f benchmarks/bench_
  sleep 45
fi
while [ "$MODE" != stop ] && [ "$(left)" -gt 25 ] && pgrep -f "scripts/gpu/(queue|solo)" > /dev/null; do sleep 5; done
# collect the light files of every run folder, the queue and solo logs
C=$OUT/collect && mkdir -p "$C"
for r in "$R"/*/ "$SOLO"/runs/*/; do
  [ -d "$r" ] || continue
  dest="$C/runs/$(basename "$r")" && mkdir -p "$dest"
  cp "$r"/*.json "$r"/*.jsonl "$dest/" 2>/dev/null
done
cp "$R"/*.log "$C/" 2>/dev/null
mkdir -p "$C/solo" && cp -r "$SOLO"/logs/* "$C/solo/" 2>/dev/null
cp "$SOLO"/runs/*.log "$C/solo/" 2>/dev/null  # each side-by-side run's own output
cp -r "$OUT/logs" "$C/" && rm -rf "$OUT/logs"
nvidia-smi --query-gpu=index,temperature.gpu,memory.used,utilization.gpu --format=csv > "$C/gpu-now.txt" 2>&1
tar -czf "$OUT/collect.tar.gz" -C "$OUT" collect && rm -rf "$C"
for f in "$R"/queue-*.log; do echo "== $f"; tail -4 "$f"; done
tail -20 "$SOLO/logs/solo.log" 2>/dev/null
ls -la "$OUT"
