#!/usr/bin/env bash
# The update alone on one GPU, in one short call: its time and whole-process GPU memory with
# the chunked LM head against the full logits, one process alone, then N processes side by
# side (what N runs of a sweep do in their update). The model is the recipe's architecture
# with random weights (bench_update.py --model random:qwen2.5-0.5b): nothing to carry, the
# update's cost does not depend on the weights. No vLLM: a run's engine adds its own share.
#
#   OUT=out BUDGET=12288 N=4 OLD=.old bash scripts/gpu/update_side_by_side.sh
#
# OLD (optional): a folder holding an older checkout's `labkit/` (git archive), timed on the
# same rollout. Writes under $OUT: solo.json / solo.log, side.json / side.log (one line per
# process and its updates' wall-clock spans), smi.csv (nvidia-smi per process, every 250 ms,
# with a line naming each phase), old.json. Each phase has a time limit; what finished stays.
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

phase "solo: chunked at $BUDGET and $((2 * BUDGET)), full logits at $BUDGET"
timeout 120 "${BENCH[@]}" --budgets "$BUDGET,$((2 * BUDGET))" --full-logits "$BUDGET" --repeats 2 \
  --out "$OUT/solo.json" >> "$OUT/solo.log" 2>&1
echo "solo exit $?" >> "$OUT/solo.log"

phase "side: $N processes, chunked at $BUDGET"
pids=()
for i in $(seq 1 "$N"); do
  (timeout 150 "${BENCH[@]}" --budgets "$BUDGET" --repeats 3 --out "$OUT/side$i.part" 2>&1 \
     | sed "s/^/[p$i] /" >> "$OUT/side.log") &
  pids+=($!)
done
wait "${pids[@]}"
python3 - "$OUT" "$N" <<'EOF'
import json, pathlib, sys
out, n = pathlib.Path(sys.argv[1]), int(sys.argv[2])
parts = {f"p{i}": json.loads(p.read_text()) if (p := out / f"side{i}.part").exists() else None
         for i in range(1, n + 1)}
(out / "side.json").write_text(json.dumps(parts, indent=1))
for p in out.glob("side*.part"):
    p.unlink()
EOF

if [ -n "${OLD:-}" ] && [ -d "$OLD/labkit" ]; then
  phase "old: $OLD's update at $BUDGET"
  PYTHONPATH=$OLD:$PYTHONPATH timeout 90 "${BENCH[@]}" --budgets "$BUDGET" --repeats 2 \
    --out "$OUT/old.json" >> "$OUT/solo.log" 2>&1
  echo "old exit $?" >> "$OUT/solo.log"
fi
phase done
