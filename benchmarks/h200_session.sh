#!/usr/bin/env bash
# One 10-minute call on the lent H200 machine (see ../shared/device/README.md for the set-up).
#   bash benchmarks/h200_session.sh bench   # GPU 0: model eval, engine bench, solo recipe steps
#                                           # (vLLM, then transformers); GPU 1 (if any): the grid
#   bash benchmarks/h200_session.sh grid    # every GPU: the grid of runs (resumes unfinished ones)
# Everything it writes comes back under $OUT; run folders stay in $HOME/runs between calls.
set -u
MODE=${1:-bench}
M=${LABKIT_MODEL:-$HOME/labkit-device/model.gguf}
D=${LABKIT_GSM8K:-.device/gsm8k}
export LABKIT_CACHE=${LABKIT_CACHE:-$HOME/labkit-cache}
mkdir -p "$OUT/logs"
nvidia-smi > "$OUT/logs/nvidia-smi.txt" 2>&1
python - > "$OUT/logs/versions.txt" 2>&1 <<'PY'
import torch, transformers, vllm, platform
print("python", platform.python_version(), "torch", torch.__version__, "transformers", transformers.__version__, "vllm", vllm.__version__)
print("gpus", torch.cuda.device_count(), torch.cuda.get_device_name(0))
PY
sha256sum "$M" >> "$OUT/logs/versions.txt"
T0=$(date +%s)
python -c "from labkit.models import resolve_model; print(resolve_model('$M'))" > "$OUT/logs/dequantize.log" 2>&1
echo "dequantize: $(( $(date +%s) - T0 )) s" >> "$OUT/logs/versions.txt"
NG=$(python -c "import torch; print(torch.cuda.device_count())")
left() { echo $(( 560 - ($(date +%s) - T0) )); }
RECIPE="--rollout-batch-size 32 --n-samples-per-prompt 8 --global-batch-size 256 --rm-type math --rollout-max-response-len 1024 --lr 1e-5 --seed 1 --model $M --data $D --no-progress --micro-batch-size 8"
if [ "$MODE" = bench ]; then
  if [ "$NG" -ge 2 ]; then
    python benchmarks/h200_grid.py --model "$M" --data "$D" --runs-dir $HOME/runs --out "$OUT" \
      --deadline "$(( $(left) - 20 ))" --per-gpu 3 --gpus 1 > "$OUT/logs/grid.log" 2>&1 &
  fi
  export CUDA_VISIBLE_DEVICES=0
  timeout 170 python benchmarks/eval_model.py --model "$M" --data "$D" --out "$OUT/logs/eval.json" > "$OUT/logs/eval.log" 2>&1
  timeout 110 python benchmarks/bench_vllm_engine.py --model "$M" --prompts 32 --n 8 --max-tokens 1024 \
    --gpu-memory-fraction 0.5 --repeats 2 --out "$OUT/logs/bench_vllm.json" > "$OUT/logs/bench_vllm.log" 2>&1
  timeout 140 python -m labkit launch $RECIPE --engine vllm --rollout-gpu-memory-fraction 0.5 --num-rollout 6 \
    --output-dir $HOME/solo --run-name recipe-vllm --time-limit 130 > "$OUT/logs/solo_vllm.log" 2>&1
  timeout "$(( $(left) - 10 ))" python -m labkit launch $RECIPE --engine hf --num-rollout 2 \
    --output-dir $HOME/solo --run-name recipe-hf --time-limit "$(( $(left) - 20 ))" > "$OUT/logs/solo_hf.log" 2>&1
  unset CUDA_VISIBLE_DEVICES
  wait
else
  python benchmarks/h200_grid.py --model "$M" --data "$D" --runs-dir $HOME/runs --out "$OUT" \
    --deadline "$(( $(left) - 10 ))" --per-gpu 3 > "$OUT/logs/grid.log" 2>&1
fi
for r in $HOME/solo/*/; do
  [ -d "$r" ] || continue
  mkdir -p "$OUT/logs/solo-$(basename "$r")"
  cp "$r"/*.json "$r"/*.jsonl "$OUT/logs/solo-$(basename "$r")/" 2>/dev/null
done
df -h $HOME > "$OUT/logs/disk.txt"
tar -czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$OUT/logs"
ls -la "$OUT"
