#!/usr/bin/env bash
# One GPU to itself, one job after another: labkit's vLLM engine against raw vLLM,
# then the recipe for a few steps with --engine hf and with --engine vllm, same model and seed.
# session.sh starts it detached (setsid) so it outlives the 10-minute calls; logs go to
# $SOLO/logs, run folders to $SOLO/runs, and `session.sh collect` brings them back.
#   GPU=0 SOLO=$HOME/solo M=model.gguf D=gsm8k-folder bash scripts/gpu/solo.sh
# Env: JOBS (default "bench_vllm recipe_hf recipe_vllm"), REPEATS (benchmark rounds, 5),
# VLLM_STEPS (8), HF_LIMIT (s, 600).
# Each job has its own limit (timeout; SIGTERM first, so a labkit run stops after its step
# with its log complete). Whole-GPU memory is sampled by nvidia-smi every second: the
# trainer's perf/max_gpu_memory_gb counts torch's allocator only, not vLLM's KV cache.
set -u
export CUDA_VISIBLE_DEVICES=${GPU:-0}
L=$SOLO/logs
mkdir -p "$L" "$SOLO/runs"
say() { echo "[$(date +%T)] $*" >> "$L/solo.log"; }

job() {  # job NAME LIMIT_S CMD...: run CMD with GPU memory sampled, log its exit
  local name=$1 limit=$2; shift 2
  nvidia-smi -i "$CUDA_VISIBLE_DEVICES" --query-gpu=timestamp,memory.used,temperature.gpu,utilization.gpu \
    --format=csv,noheader -lms 1000 > "$L/$name.gpu.csv" 2>&1 &
  local smi=$!
  say "$name start (limit $limit s)"
  timeout -k 60 "$limit" "$@" > "$L/$name.log" 2>&1
  say "$name exit $?"
  kill "$smi" 2>/dev/null
  say "$name peak GPU memory used $(sort -t, -k2 -n "$L/$name.gpu.csv" | tail -1 | cut -d, -f2)"
}

RECIPE=(--rollout-batch-size 32 --n-samples-per-prompt 8 --global-batch-size 256 --rm-type math
        --rollout-max-response-len 1024 --lr 1e-6 --seed 1 --model "$M" --data "$D" --no-progress
        --save-interval -1 --output-dir "$SOLO/runs")

for j in ${JOBS:-bench_vllm recipe_hf recipe_vllm}; do
  case $j in
    bench_vllm) job bench_vllm 300 python benchmarks/bench_vllm_engine.py --model "$M" --prompts 32 \
      --n 8 --max-tokens 1024 --gpu-memory-fraction 0.5 --repeats "${REPEATS:-5}" --out "$L/bench_vllm.json" ;;
    recipe_hf) job recipe_hf "${HF_LIMIT:-600}" python -m labkit launch "${RECIPE[@]}" --engine hf \
      --num-rollout 3 --run-name recipe-hf ;;
    recipe_vllm) job recipe_vllm 300 python -m labkit launch "${RECIPE[@]}" --engine vllm \
      --num-rollout "${VLLM_STEPS:-8}" --rollout-gpu-memory-fraction 0.5 --run-name recipe-vllm ;;
    *) say "unknown job $j" ;;
  esac
done
say "all done"
