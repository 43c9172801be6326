#!/usr/bin/env bash
# The update alone on one GPU, in one short call: its time and whole-process GPU memory, one
# process alone, then N processes side by side (what N runs of a sweep do in their update).
# The model is the recipe's architecture with random weights (bench_update.py --model
# random:qwen2.5-0.5b): nothing to carry, the update's cost does not depend on the weights.
# No vLLM: a run's engine adds its own share.
#
#   OUT=out BUDGET=12288 N=4 OLD=.old bash scripts/gpu/update_side_by_side.sh
#
# SOLO: the variants of the process alone (default: plain and checkpointed at BUDGET, and
# checkpointed at twice and four times it); SIDE: the variant each of the N processes runs
# (default: checkpointed at BUDGET, as a sweep's runs are). LIGER=1: the process alone again
# with liger-kernel's Qwen2 kernels (RMSNorm, SwiGLU, RoPE), where it imports.
# OLD (optional): a folder holding an older checkout's `labkit/` (git archive), timed on the
# same rollout. Writes under $OUT: solo.json / solo.log, side.json / side.log (one line per
# process and its updates' wall-clock spans), smi.csv (nvidia-smi per process, every 250 ms,
# with a line naming each phase), side_expandable.json / .log (the same with torch's
# expandable segments; EXPANDABLE=0 skips it), old.json. Each phase has a time limit; what
# finished stays.
set -u
OUT=${OUT:-out}; N=${N:-4}; BUDGET=${BUDGET:-12288}
mkdir -p "$OUT"
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
PY=${PY:-python3}
BENCH=("$PY" benchmarks/bench_update.py --model random:qwen2.5-0.5b --samples 256 --dynamic-only)
phase() { echo "# phase $1 $(date +%s.%N)" >> "$OUT/smi.csv"; echo "[$(date +%T)] $1" >> "$OUT/solo.log"; }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >> "$OUT/solo.log"
nvidia-smi --query-compute-apps=timestamp,pid,used_memory --format=csv,noheader -lms 250 \
  >> "$OUT/smi.csv" 2>/dev/null &
SMI=$!
trap 'kill $SMI 2>/dev/null' EXIT

SOLO=${SOLO:-"--budgets $BUDGET --checkpointed $BUDGET,$((2 * BUDGET)),$((4 * BUDGET))"}
SIDE=${SIDE:-"--budgets= --checkpointed $BUDGET"}
phase "solo: $SOLO"
# shellcheck disable=SC2086 # the variants are words
timeout 150 "${BENCH[@]}" $SOLO --repeats 2 --out "$OUT/solo.json" >> "$OUT/solo.log" 2>&1
echo "solo exit $?" >> "$OUT/solo.log"

if [ "${LIGER:-0}" = 1 ] && "$PY" -c "import liger_kernel" 2>/dev/null; then
  phase "solo_liger: $SOLO, with liger-kernel's Qwen2 kernels"
  # shellcheck disable=SC2086
  timeout 150 "${BENCH[@]}" ${LIGER_SOLO:-$SOLO} --liger --repeats 2 --out "$OUT/solo_liger.json" >> "$OUT/solo.log" 2>&1
  echo "solo_liger exit $?" >> "$OUT/solo.log"
fi

side() {  # side NAME [ENV=VALUE ...]: N processes at once, chunked at the budget
  local name=$1 pids=() i; shift
  phase "$name: $N processes, $SIDE $*"
  for i in $(seq 1 "$N"); do
    # shellcheck disable=SC2086
    (env "$@" timeout 150 "${BENCH[@]}" $SIDE --repeats 3 --out "$OUT/$name$i.part" 2>&1 \
       | sed "s/^/[p$i] /" >> "$OUT/$name.log") &
    pids+=($!)
  done
  wait "${pids[@]}"
  python3 - "$OUT" "$N" "$name" <<'PYEOF'
import json, pathlib, sys
out, n, name = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
parts = {f"p{i}": json.loads(p.read_text()) if (p := out / f"{name}{i}.part").exists() else None
         for i in range(1, n + 1)}
(out / f"{name}.json").write_text(json.dumps(parts, indent=1))
for p in out.glob(f"{name}*.part"):
    p.unlink()
PYEOF
}
side side
# the same with torch's expandable segments: what the allocator then reserves beyond its tensors
if [ "${EXPANDABLE:-1}" = 1 ]; then side side_expandable PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; fi

if [ -n "${OLD:-}" ] && [ -d "$OLD/labkit" ]; then
  phase "old: $OLD's update at $BUDGET"
  PYTHONPATH=$OLD:$PYTHONPATH timeout 90 "${BENCH[@]}" --budgets "$BUDGET" --repeats 2 \
    --out "$OUT/old.json" >> "$OUT/solo.log" 2>&1
  echo "old exit $?" >> "$OUT/solo.log"
fi
phase done
