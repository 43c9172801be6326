#!/usr/bin/env bash
# The recipe through `labkit serve` (solo.sh's http jobs): serve, one launch per run, replay, stop.
#   bash scripts/gpu/http_run.sh NAME "SERVE FLAGS" RUN "LAUNCH FLAGS" [RUN "LAUNCH FLAGS" ...]
# Starts `python -m labkit serve SERVE FLAGS` in the background (they may end with
# --engine-args, which takes the rest of the line) (logs and serve.json in
# $L/NAME-serve), waits for serve.json, then runs `python -m labkit launch LAUNCH FLAGS
# --rollout-mode http --router-url URL --output-dir $SOLO/runs --run-name RUN` for each run,
# one after another, and replays each run's client.jsonl through the watchdog
# ($L/RUN.replay.txt: 503 bursts, stalls; the timeline PNG beside it). Stops the engines and
# the router at the end, also on SIGTERM (solo.sh's time limit: the run in progress stops
# after its step, then serve stops). Env: L, SOLO (solo.sh's), SERVE_WAIT (s, 300).
# A serve that does not come up leaves $L/serve-failed: solo.sh then skips the jobs that
# serve (an engine that hangs at start would hang in each of them).
# The launches get --http-sync-check from their flags (solo.sh passes it). After each launch
# $L/RUN.sync.txt (also in this job's log) sums up its weight syncs: where the file went
# (memory or disk), gathering the tensors, the file, the engines' loads (scripts/gpu/sync_summary.py).
set -u
L=${L:-$SOLO/logs}  # solo.sh's log folder
name=$1 serve_flags=$2
shift 2
logs=$L/$name-serve
rm -rf "$logs" && mkdir -p "$logs"
say() { echo "[$(date +%T)] $name: $*"; }
serve_pid="" launch_pid="" stopped=0
stop_serve() {  # one SIGTERM: labkit serve stops its engines and the router (a second would cut that short)
  if [ -n "$serve_pid" ] && kill -0 "$serve_pid" 2>/dev/null; then
    kill -TERM "$serve_pid"; wait "$serve_pid"; say "serve stopped (exit $?)"
  fi
  serve_pid=""
}
# SIGTERM (solo.sh's time limit signals the whole group): the launch got it too and stops
# after its step; wait for that, then stop serve, which runs in a session of its own so
# that it outlives the launch it serves
on_term() {
  stopped=1; say "SIGTERM"
  [ -n "$launch_pid" ] && wait "$launch_pid"
  stop_serve; exit 143
}
trap on_term TERM

# shellcheck disable=SC2086  # the flags are one string on purpose
setsid python -m labkit serve --log-dir "$logs" $serve_flags > "$logs/serve.out" 2>&1 < /dev/null &
serve_pid=$!
echo "$serve_pid" > "$logs/serve.pid"  # solo.sh stops a serve left behind by this pid
t0=$(date +%s)
until [ -f "$logs/serve.json" ]; do
  if ! kill -0 "$serve_pid" 2>/dev/null; then
    say "serve exited before it was up:"; tail -30 "$logs/serve.out"; touch "$L/serve-failed"; exit 1
  fi
  if [ $(( $(date +%s) - t0 )) -gt "${SERVE_WAIT:-300}" ]; then
    say "serve not up in ${SERVE_WAIT:-300} s"; tail -30 "$logs"/*.log; stop_serve
    touch "$L/serve-failed"; exit 1
  fi
  sleep 2
done
url=$(python -c "import json,sys; print(json.load(open(sys.argv[1]))['url'])" "$logs/serve.json")
say "serve up in $(( $(date +%s) - t0 )) s at $url"
nvidia-smi --query-gpu=memory.used --format=csv,noheader 2>/dev/null | sed "s/^/$name: GPU memory with the engines idle: /"

code=0
while [ $# -ge 2 ]; do
  run=$1 flags=$2
  shift 2
  say "launch $run"
  t1=$(date +%s)
  # shellcheck disable=SC2086
  python -m labkit launch $flags --rollout-mode http --router-url "$url" \
    --output-dir "$SOLO/runs" --run-name "$run" &
  launch_pid=$!
  wait "$launch_pid"; rc=$?; launch_pid=""
  say "launch $run exit $rc in $(( $(date +%s) - t1 )) s"
  [ "$rc" = 0 ] || code=$rc
  log=$SOLO/runs/$run/client.jsonl
  [ -f "$log" ] && python -m labkit replay "$log" --out "$L/$run-replay" > "$L/$run.replay.txt" 2>&1
  # the syncs' parts and where the file went; the rollout against the colocated `alone` if it ran
  python scripts/gpu/sync_summary.py "$SOLO/runs/$run" \
    $([ -d "$SOLO/runs/alone" ] && echo --baseline "$SOLO/runs/alone") 2>&1 | tee "$L/$run.sync.txt"
  [ "$rc" -ge 128 ] && { say "stopped by a signal; no more runs"; break; }
  if ! kill -0 "$serve_pid" 2>/dev/null; then say "serve is gone; no more runs"; code=1; break; fi
done
stop_serve
rm -f "$logs/serve.pid"
exit $code
