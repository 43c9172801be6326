#!/usr/bin/env bash
# One GPU to itself, one job after another, then two run queues on it (queue_runs.py):
#   bench_vllm      labkit's vLLM engine against raw vLLM (seeds, log-probs), one engine
#   recipe_rerun    the recipe, synchronous, seed 1, timed alone; then a rerun in the same
#                   process with 4 answers (benchmarks/bench_rerun.py): start-up cold and kept
#   recipe_overlap  the recipe with --overlap-rollout, seed 1, timed alone
#   bench_update    the update's memory/time curve over --max-tokens-per-gpu
#   bench_lean      the update on the recipe's architecture (random weights): chunked head vs
#                   full logits over several budgets; then the same rollout under an older
#                   checkout in $OLD (PYTHONPATH), for the before/after pair
#   bench_shared    the update on the recipe's architecture (random weights, 8 answers a prompt):
#                   a row per sample against a group's answers after one copy of their prompt
#                   (--share-prompt), plain at 12,288 tokens and checkpointed at 24,576
#   bench_packed    the update on the recipe's architecture (random weights): a row per sample
#                   against the padding-free layout (--padding-free), plain at 12,288 tokens and
#                   checkpointed at 24,576, under sdpa; then the padding-free pair under flex attention;
#                   then both pairs with packed rows through torch's varlen kernel (--attn varlen)
#   solo_default    the recipe as a user types it, alone (sleep mode, default budget)
#   solo_kv8        one run alone with the settings a sweep gives each run (fixed 8 GiB KV
#                   cache, no sleep): its whole-GPU memory is one run's share
#   sweep4, sweep2  4 and 2 recipe runs side by side (`labkit sweep`, seeds 1-4 / 1-2); sweep4 cold
#   sweep4_mps      sweep4 with NVIDIA MPS (`labkit sweep --mps`), cold
#   lesson_sweep    lesson 1.3's GPU cell: 4, 8 and 16 answers side by side, 24 steps, held-out
#                   accuracy at both ends, cold: an earlier job's start result, vLLM's and inductor's compile
#                   caches are set aside first (LESSON_EXTRA: flags added to it)
#   lesson_mps      the same with NVIDIA MPS (`labkit sweep --mps`)
#   lesson_overlap  the same with --overlap-rollout, without MPS (each run trains one step off-policy)
#   lesson_mps_overlap
#                   the same with MPS and --overlap-rollout (each run trains one step off-policy)
#   lesson_mps_compile
#                   the same with MPS and --torch-compile (each decoder layer compiled for the update;
#                   liger-kernel's layers off, as --torch-compile sets them)
#   lesson_stagger, lesson_mps_stagger
#                   the same with --stagger-starts (the 16-answer run starts alone, the others once
#                   it is ready, taking vLLM's compiled graphs from its cache), without and with MPS
#   study           the group-size study as one command: `labkit sweep --rm-type math
#                   --n-samples-per-prompt 4,8,16 --seed 1,2,3` (nine recipe runs, 24 steps,
#                   held-out accuracy and each problem's outcome at both ends), as many at once
#                   as the memory plan seats, the longest first (STUDY_EXTRA: flags added)
#   bench_mps       4 processes decoding side by side (Qwen2.5-0.5B's shapes, CUDA graphs), without
#                   and with NVIDIA MPS (benchmarks/bench_mps.py: the server `labkit sweep --mps` starts)
#   update_probe    the update alone, one process and 4 side by side (update_side_by_side.sh)
#   update_kernels  the update alone (recipe's architecture, random weights), plain at 12,288 tokens
#                   and checkpointed at 24,576: labkit's layers and liger-kernel's
#                   (--use-liger-kernel) in turn, two processes each, then each layer compiled
#   gpu_tests       the tests that need a GPU (tests/test_liger.py: the update with liger's kernels
#                   against the update without)
#   alone_liger, side4_liger
#                   alone and side4 with --use-liger-kernel
#   alone, side2 ... side6
#                   the recipe as a user types it, STEPS steps, no evaluation: one run alone
#                   (seed 21), then `labkit sweep --seed 21,22,...` with 2 to 6 seeds (side6_mps and
#                   the like: the same with --mps),
#                   each run a process with the sweep's memory plan (its runs get torch's
#                   expandable segments); side4p is side4 with torch's plain allocator
#   alone_packed    alone with the padding-free update (--padding-free)
#   alone_full      alone with every answer through the update (--no-skip-zero-advantage)
#   alone_compile   alone with each decoder layer compiled for the update (--torch-compile)
#   alone_lean      one run alone as a shared run is set: checkpointed at 24,576 tokens, a fixed
#                   8 GiB KV cache, no sleep mode (its whole-GPU memory is what one run needs)
#   alone24         one run alone, plain update at 24,576 tokens a micro-batch
#   lessons         the three lessons in a Jupyter kernel each (scripts/gpu/lessons.py), the gpu
#                   profile, lesson 1.3's rerun cell stopped once and run again (LESSONS: which
#                   notebooks, in order; default all three); then the light files of their runs
#   http2           the recipe through `labkit serve`: 2 vLLM engines on this GPU (a share of its
#                   memory each, started one by one) behind vllm-router, then `labkit launch
#                   --rollout-mode http --http-sync-check` at 32 x 8 and at 32 x 16 (512 requests
#                   open), STEPS steps each, no evaluation (scripts/gpu/http_run.sh); the
#                   colocated baseline is `alone` (and `alone16` at 32 x 16)
#                   (HTTP2_RUNS: which of n8 and n16, default both)
#   http1, http1d   the same with one engine behind the router, and one engine used directly
#                   (--router none); 32 x 8 only. Each http run's weight syncs are summed up in
#                   $L/RUN.sync.txt (where the file went, gathering, file, the engines' loads)
#   bench_write     the weights file of a sync, the previous write against labkit's
#                   (benchmarks/bench_weights_write.py): Qwen2.5-0.5B's shape, float32 on the
#                   GPU to a bfloat16 file, into /dev/shm and into the temp folder
#   burst503        503 bursts with 512 requests open over a matrix of settings (open-request
#                   limit, the router's limits, the engines' --max-num-seqs, one engine paused
#                   by weight syncs): benchmarks/bench_router_bursts.py, one JSON row a setting
# session.sh starts it detached (setsid) so it outlives the 10-minute calls; logs go to
# $SOLO/logs, run folders to $SOLO/runs; `session.sh collect` brings them back.
#   GPU=0 SOLO=$HOME/solo M=model.gguf D=gsm8k-folder R=$HOME/runs bash scripts/gpu/solo.sh
# Env: JOBS (default: all four, in that order), QUEUES (run queues after the jobs: 2),
# QUEUE_SHARE (queued runs set as one of that many on a GPU: queue_runs.py --share),
# QUEUE_EXTRA (flags for every queued run), QUEUE_ALLOC (their PYTORCH_CUDA_ALLOC_CONF).
# Each job has its own limit (timeout; SIGTERM first, so a labkit run stops after its step
# with its log complete). Whole-GPU memory is sampled by nvidia-smi every second: the
# trainer's perf/max_gpu_memory_gb counts torch's allocator only, not vLLM's.
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

cold() {  # the next job as a first sweep on the machine: an earlier start result, vLLM's
  local stamp ind  # compile cache and torch inductor's (--torch-compile) set aside
  stamp=$(date +%s) ind=${TORCHINDUCTOR_CACHE_DIR:-/tmp/torchinductor_$(whoami)}
  mv "$SOLO/runs/.start" "$SOLO/runs/.start-$stamp" 2>/dev/null
  mv "$HOME/.cache/vllm" "$HOME/.cache/vllm-$stamp" 2>/dev/null
  mv "$ind" "$ind-$stamp" 2>/dev/null
}
alone() {  # alone JOB FLAGS...: the recipe as a user types it, seed 21, STEPS steps, one run on
  local name=$1; shift  # the GPU, run folder named for the job (alone_full -> alone-full)
  job "$name" 300 python -m labkit launch "${SHORT[@]}" --seed 21 --model "$M" --data "$D" \
    --output-dir "$SOLO/runs" --run-name "${name//_/-}" "$@"
}
RECIPE=(--rollout-batch-size 32 --n-samples-per-prompt 8 --global-batch-size 256 --rm-type math
        --rollout-max-response-len 1024 --lr 1e-6 --seed 1 --num-rollout 24 --no-progress
        --save-interval -1 --engine vllm --rollout-gpu-memory-fraction 0.5)

STEPS=${STEPS:-12}
SHORT=(--rollout-batch-size 32 --rollout-max-response-len 1024 --lr 1e-6 --num-rollout "$STEPS"
       --no-progress --save-interval -1 --engine vllm --eval-split-size 0 --rm-type math)
for j in ${JOBS:-bench_vllm recipe_rerun recipe_overlap bench_update}; do
  case $j in
    bench_vllm) job bench_vllm 300 python benchmarks/bench_vllm_engine.py --model "$M" --prompts 32 \
      --n 8 --max-tokens 1024 --gpu-memory-fraction 0.5 --repeats 3 --out "$L/bench_vllm.json" ;;
    recipe_rerun) job recipe_rerun 420 python benchmarks/bench_rerun.py --model "$M" --data "$D" \
      --out "$SOLO/runs" --result "$L/rerun.json" -- "${RECIPE[@]}" ;;
    recipe_overlap) job recipe_overlap 360 python -m labkit launch "${RECIPE[@]}" --model "$M" \
      --data "$D" --overlap-rollout --output-dir "$SOLO/runs" --run-name overlap ;;
    bench_update) job bench_update 240 python benchmarks/bench_update.py --model "$M" --samples 256 \
      --dynamic-only --budgets 8192,12288,16384,24576 --out "$L/bench_update.json" ;;
    bench_lean) job bench_lean 420 bash -c "python benchmarks/bench_update.py --model random:qwen2.5-0.5b \
        --samples 256 --dynamic-only --budgets 4096,8192,12288,16384,24576 --full-logits 12288 --repeats 3 \
        --out $L/bench_lean.json && PYTHONPATH=$OLD:\$PYTHONPATH python benchmarks/bench_update.py \
        --model random:qwen2.5-0.5b --samples 256 --dynamic-only --budgets 8192,12288 --repeats 3 \
        --out $L/bench_before.json" ;;
    bench_shared) job bench_shared 300 python benchmarks/bench_update.py --model random:qwen2.5-0.5b \
      --samples 256 --dynamic-only --budgets 12288 --shared 12288 --checkpointed 24576 \
      --shared-checkpointed 24576 --repeats 3 --out "$L/bench_shared.json" ;;
    bench_packed) job bench_packed 360 bash -c "python benchmarks/bench_update.py --model random:qwen2.5-0.5b \
        --samples 256 --dynamic-only --budgets 12288 --padding-free 12288 --checkpointed 24576 \
        --padding-free-checkpointed 24576 --repeats 3 --out $L/bench_packed.json && python \
        benchmarks/bench_update.py --model random:qwen2.5-0.5b --samples 256 --dynamic-only --budgets '' \
        --padding-free 12288 --padding-free-checkpointed 24576 --repeats 3 --attn flex_attention \
        --out $L/bench_packed_flex.json && python benchmarks/bench_update.py --model random:qwen2.5-0.5b \
        --samples 256 --dynamic-only --budgets 12288 --padding-free 12288 --checkpointed 24576 \
        --padding-free-checkpointed 24576 --repeats 3 --attn varlen --out $L/bench_packed_varlen.json" ;;
    solo_default) job solo_default 300 python -m labkit launch "${SHORT[@]}" --n-samples-per-prompt 8 \
      --global-batch-size 256 --seed 1 --model "$M" --data "$D" --output-dir "$SOLO/runs" --run-name solo-default ;;
    solo_kv8) job solo_kv8 300 python -m labkit launch "${SHORT[@]}" --n-samples-per-prompt 8 \
      --global-batch-size 256 --seed 1 --model "$M" --data "$D" --output-dir "$SOLO/runs" --run-name solo-kv8 \
      --rollout-kv-cache-gb 8 --no-rollout-sleep --rollout-gpu-memory-fraction 0.125 \
      --max-tokens-per-gpu "${SHARED_TOKENS:-6144}" ;;
    sweep4|sweep4_mps)  # the same sweep, each cold; sweep4_mps with `labkit sweep --mps`
      cold
      job "$j" 420 python -m labkit sweep "${SHORT[@]}" --n-samples-per-prompt 8 --seed "${SWEEP_SEEDS:-1,2,3,4}" \
        --model "$M" --data "$D" --output-dir "$SOLO/runs" --run-name "${j/_/}" $([ "$j" = sweep4_mps ] && echo --mps) ;;
    sweep2) job sweep2 360 python -m labkit sweep "${SHORT[@]}" --n-samples-per-prompt 8 --seed 1,2 \
      --model "$M" --data "$D" --output-dir "$SOLO/runs" --run-name sweep2 ;;
    bench_mps) job bench_mps 300 python benchmarks/bench_mps.py --workers 4 --batch 256 --steps 3000 \
      --out "$L/bench_mps.jsonl" ;;
    update_probe) job update_probe 420 env OUT="$L/update" N=4 BUDGET=12288 EXPANDABLE=1 LIGER=1 \
      SOLO="--budgets 12288 --checkpointed 12288,24576,49152" LIGER_SOLO="--budgets 12288 --checkpointed 12288" \
      bash scripts/gpu/update_side_by_side.sh ;;
    alone) alone alone ;;
    alone_full) alone alone_full --no-skip-zero-advantage ;;
    alone_packed) alone alone_packed --padding-free ;;
    alone_compile) alone alone_compile --torch-compile ;;
    lessons) job lessons 1700 env LABKIT_PROFILE=gpu LABKIT_MODEL="$M" LABKIT_DATA="$D" \
      python scripts/gpu/lessons.py --out "$L/lessons" --stop-after "${LESSON_STOP_AFTER:-120}" ${LESSONS:-}
      for r in runs/*/; do  # the lessons' own runs (the repository's runs/): their light files
        [ -d "$r" ] && mkdir -p "$L/lessons/runs/$(basename "$r")" && cp "$r"/*.json "$r"/*.jsonl "$L/lessons/runs/$(basename "$r")/" 2>/dev/null
      done ;;
    alone_lean) alone alone_lean --gradient-checkpointing --max-tokens-per-gpu 24576 --rollout-kv-cache-gb 8 \
      --no-rollout-sleep ;;
    alone24) alone alone24 --max-tokens-per-gpu 24576 ;;
    side[2-6]|side4p|side[2-6]_mps)
      seeds=$(echo 21,22,23,24,25,26 | cut -d, -f1-"${j:4:1}")
      alloc=$([ "$j" = side4p ] && echo expandable_segments:False)
      mps=$([[ $j == *_mps ]] && echo --mps)
      job "$j" 480 env ${alloc:+PYTORCH_CUDA_ALLOC_CONF=$alloc} python -m labkit sweep "${SHORT[@]}" \
        --seed "$seeds" --model "$M" --data "$D" --output-dir "$SOLO/runs" --run-name "${j//_/-}" $mps ;;
    lesson_sweep|lesson_mps|lesson_overlap|lesson_mps_overlap|lesson_mps_compile|lesson_stagger|lesson_mps_stagger)
      cold  # as a first sweep on the machine: no start result, no compile caches
      flags=()  # the job's name says what it adds: mps, overlap, compile, stagger
      [[ $j == *mps* ]] && flags+=(--mps)
      [[ $j == *stagger* ]] && flags+=(--stagger-starts)
      [[ $j == *overlap* ]] && flags+=(--overlap-rollout)
      [[ $j == *compile* ]] && flags+=(--torch-compile)
      job "$j" 600 python -m labkit sweep --rm-type math --n-samples-per-prompt 4,8,16 \
        --seed "${LESSON_SEED:-11}" --lr 1e-6 --engine vllm --save-interval -1 --no-progress --model "$M" \
        --data "$D" --output-dir "$SOLO/runs" --run-name "$(j=${j/_sweep/}; echo "${j//_/}")" "${flags[@]}" \
        ${LESSON_EXTRA:-} ;;
    study) job study "${STUDY_LIMIT:-1500}" python -m labkit sweep --rm-type math --n-samples-per-prompt 4,8,16 \
      --seed 1,2,3 --save-interval -1 --no-progress --model "$M" --data "$D" --output-dir "$SOLO/runs" \
      --run-name study ${STUDY_EXTRA:-} ;;
    alone16) alone alone16 --n-samples-per-prompt 16 --global-batch-size 512 ;;
    http2|http1|http1d|burst503)
      if [ -f "$L/serve-failed" ]; then say "$j skipped: an earlier job's engines did not come up"; continue; fi ;;&
    http2|http1|http1d)
      # HTTP_SERVE: the engines' flags (their share of the GPU: vLLM checks at start that the
      # share is free, and --one-by-one lets each profile the memory alone); HTTP_EXTRA goes
      # last on each launch's line (a rehearsal's smaller batch)
      serve="--model $M ${HTTP_SERVE:---dtype bfloat16 --max-model-len 2048 --max-num-seqs 512 --one-by-one --startup-timeout-s 240}"
      share=${HTTP_ENGINE_ARGS:---gpu-memory-utilization 0.15 --max-num-batched-tokens 16384}
      run="${SHORT[*]} --seed 21 --model $M --data $D --http-sync-check"
      n8="--n-samples-per-prompt 8 --global-batch-size 256" n16="--n-samples-per-prompt 16 --global-batch-size 512"
      case $j in
        http2)
          runs=()
          for r in ${HTTP2_RUNS:-n8 n16}; do
            case $r in n8) runs+=(http2-n8 "$run $n8 ${HTTP_EXTRA:-}") ;; n16) runs+=(http2-n16 "$run $n16 ${HTTP_EXTRA:-}") ;;
              *) say "http2: unknown run $r (n8, n16)" ;; esac
          done
          job http2 540 bash scripts/gpu/http_run.sh http2 "--engines 2 --port 8100 $serve --engine-args $share" "${runs[@]}" ;;
        http1) job http1 360 bash scripts/gpu/http_run.sh http1 "--engines 1 --port 8110 $serve --engine-args ${share/0.15/0.3}" \
          http1-n8 "$run $n8 ${HTTP_EXTRA:-}" ;;
        http1d) job http1d 360 bash scripts/gpu/http_run.sh http1d "--engines 1 --router none --port 8120 $serve --engine-args ${share/0.15/0.3}" \
          http1d-n8 "$run $n8 ${HTTP_EXTRA:-}" ;;
      esac
      [ -f "$L/$j-serve/serve.pid" ] && kill -TERM "$(cat "$L/$j-serve/serve.pid")" 2>/dev/null && sleep 30
      rm -f "$L/$j-serve/serve.pid" ;;
    bench_write)
      for folder in /dev/shm "${TMPDIR:-/tmp}"; do
        job "bench_write_$(basename "$folder")" 240 python benchmarks/bench_weights_write.py --device cuda \
          --src-dtype float32 --dtype bfloat16 --folder "$folder" --repeats 5 --out "$L/bench_write.jsonl"
      done ;;
    burst503) job burst503 "${BURST_LIMIT:-780}" python benchmarks/bench_router_bursts.py --model "$M" --data "$D" \
      --out "$L/burst503.jsonl" --logs "$L/burst503" ${BURST_ARGS:-} ;;
    update_kernels)  # the update alone: labkit's layers and liger-kernel's in turn, then compiled layers
      UK=(python benchmarks/bench_update.py --model random:qwen2.5-0.5b --samples 256 --dynamic-only
          --budgets 12288 --checkpointed 24576 --repeats 3)
      for k in 1 2; do
        job "update_labkit$k" 150 "${UK[@]}" --out "$L/update_labkit$k.json"
        job "update_liger$k" 150 "${UK[@]}" --liger --out "$L/update_liger$k.json"
      done
      job update_compiled 200 "${UK[@]}" --compile --out "$L/update_compiled.json" ;;
    gpu_tests) job gpu_tests 240 python -m pytest -q -p no:cacheprovider -rs tests/test_liger.py ;;
    alone_liger) alone alone_liger --use-liger-kernel ;;
    side4_liger) job side4_liger 480 python -m labkit sweep "${SHORT[@]}" --seed 21,22,23,24 --model "$M" \
      --data "$D" --output-dir "$SOLO/runs" --run-name side4-liger --use-liger-kernel ;;
    none) say "no jobs: straight to the run queues" ;;
    *) say "unknown job $j" ;;
  esac
done
say "jobs done; ${QUEUES:-2} run queues on GPU $CUDA_VISIBLE_DEVICES"
for q in $(seq 1 "${QUEUES:-2}"); do
  env ${QUEUE_ALLOC:+PYTORCH_CUDA_ALLOC_CONF=$QUEUE_ALLOC} python scripts/gpu/queue_runs.py --model "$M" \
    --data "$D" --runs-dir "$R" --name "gpu$GPU-q$q" --extra "${QUEUE_EXTRA:-}" --share "${QUEUE_SHARE:-0}" \
    >> "$R/queue-gpu$GPU-q$q.log" 2>&1 &
  sleep 25  # vLLM measures memory at start: let the first engine settle
done
wait
say "all done"
