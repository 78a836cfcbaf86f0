#!/usr/bin/env bash
# Runs a whole parameter-server job on this machine: 1 scheduler, the
# config's servers and workers, each a separate process on loopback.
#
#   deploy/local/demo.sh [CONFIG]      (default examples/ctr/async.pbtxt)
#
# Installs the job's missing Debian packages (deploy/install_deps.sh: the
# build and the runtime, none of the test suite's) and builds first, unless
# PS_BIN_DIR points at prebuilt binaries (scheduler_main, server_main,
# trainer). A
# config with launch { worker_command: [...] } runs that command for every
# worker instead of the trainer (e.g. examples/python/lr_numpy.pbtxt, a
# NumPy model on the Python package), as deploy/README.md's "The worker
# command" says: --config and --scheduler appended, PS_* variables set
# (PS_SUMMARY_OUT: where a summary line may go); PYTHONPATH then has the
# checkout's python/ (or $PS_PYTHONPATH) in front. For a "python3" command
# the demo picks the interpreter: $PS_PYTHON if set, else the first of
# PATH's python3 and /usr/bin/python3 that imports what the script imports
# of NumPy and PyTorch (the ps package needs NumPy, ps.torch PyTorch);
# when none does, it installs Debian's python3-numpy (and python3-torch)
# for /usr/bin/python3 (install_deps.sh --python [--torch]) unless
# PS_BIN_DIR or PS_PYTHON is set, and otherwise stops with one line naming
# the interpreters and the fix (deploy/choose_python.sh, which ps.sbatch
# shares).
# Worker progress goes to the terminal; every process's log goes to
# $PS_RUN_DIR (default: a new directory under .runs/). Every process started
# is stopped on exit, Ctrl-C or failure. The last line of output is the
# job's JSON summary.
#
# A job whose workers all exit 0 succeeded; when none wrote a summary the
# demo says so and prints no JSON line. A job that cannot continue (its
# processes exit 5) ends the demo with exit 5 and one line giving the
# scheduler's reason.
#
# Environment: PS_RUN_DIR, PS_BIN_DIR, PS_PYTHON, PS_PYTHONPATH,
# PS_DEMO_TIMEOUT (seconds, default 900),
# PS_TIMEOUT_SCALE (a whole factor on the timeout, default 1: .bazelrc's
# tsan config sets it for the tests, whose processes run 5-15 times slower).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CONFIG="${1:-$ROOT/examples/ctr/async.pbtxt}"
[ -f "$CONFIG" ] || { echo "demo: no config file '$CONFIG'" >&2; exit 2; }
CONFIG="$(cd "$(dirname "$CONFIG")" && pwd)/$(basename "$CONFIG")"
TIMEOUT="${PS_DEMO_TIMEOUT:-900}"
SCALE="${PS_TIMEOUT_SCALE:-1}"
case "$SCALE" in
  '' | *[!0-9]* | 0) ;;
  *) TIMEOUT=$((TIMEOUT * SCALE)) ;;
esac

if [ -z "${PS_BIN_DIR:-}" ]; then
  "$ROOT/deploy/install_deps.sh"
  echo "demo: building (bazel build --config=opt) ..." >&2
  (cd "$ROOT" && bazel build --config=opt --noshow_progress \
      //scheduler:scheduler_main //server:server_main //worker:trainer \
      //scheduler:psctl //python:libps_native.so >&2)
  BIN="$ROOT/bazel-bin"
  SCHEDULER="$BIN/scheduler/scheduler_main"
  SERVER="$BIN/server/server_main"
  TRAINER="$BIN/worker/trainer"
  PSCTL="$BIN/scheduler/psctl"
else
  SCHEDULER="$PS_BIN_DIR/scheduler_main"
  SERVER="$PS_BIN_DIR/server_main"
  TRAINER="$PS_BIN_DIR/trainer"
  PSCTL="$PS_BIN_DIR/psctl"
fi

RUN_DIR="${PS_RUN_DIR:-$ROOT/.runs/$(date +%Y%m%d-%H%M%S)-$$}"
mkdir -p "$RUN_DIR"

# Validates the config before anything starts, and sizes the job.
DESCRIPTION="$("$SCHEDULER" --config="$CONFIG" --describe)" || {
  echo "demo: invalid config $CONFIG" >&2; exit 2; }
log_interval_s=5
eval "$DESCRIPTION"   # sets servers, workers, mode, log_interval_s, worker_command

# shellcheck source=deploy/choose_python.sh
. "$ROOT/deploy/choose_python.sh"

# The config's launch.worker_command (a Python script on the ps package, say)
# runs instead of the trainer, given the same flags and PS_* variables.
CONFIG_DIR="$(dirname "$CONFIG")"
WORKER=("$TRAINER")
if [ ${#worker_command[@]} -gt 0 ]; then
  WORKER=("${worker_command[@]//\{config_dir\}/$CONFIG_DIR}")
  if [ "${WORKER[0]}" = python3 ]; then
    # Debian's python3 gets NumPy and PyTorch from Debian, like the job's
    # other packages: installed only when this demo builds the job itself.
    installer=""
    [ -z "${PS_BIN_DIR:-}" ] && [ -z "${PS_PYTHON:-}" ] && installer="$ROOT/deploy/install_deps.sh"
    choose_python demo "${WORKER[1]:-}" "$installer" || exit 1
    WORKER[0]="$PYTHON"
  fi
  export PYTHONPATH="${PS_PYTHONPATH:-$ROOT/python}${PYTHONPATH:+:$PYTHONPATH}"
fi
echo "demo: $mode job, $servers servers, $workers workers ($(basename "${WORKER[0]}")${WORKER[1]:+ $(basename "${WORKER[1]}")}); logs in $RUN_DIR" >&2

PIDS=()
cleanup() {
  local status=$?
  trap - EXIT INT TERM
  local alive=()
  for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && alive+=("$pid"); done
  if [ ${#alive[@]} -gt 0 ]; then
    kill -TERM "${alive[@]}" 2>/dev/null || true
    for _ in $(seq 30); do
      local left=0
      for pid in "${alive[@]}"; do kill -0 "$pid" 2>/dev/null && left=1; done
      [ $left -eq 0 ] && break
      sleep 0.1
    done
    kill -KILL "${alive[@]}" 2>/dev/null || true
  fi
  exit $status
}
trap cleanup EXIT
trap 'echo "demo: interrupted" >&2; exit 130' INT TERM

# Exit 5 with the scheduler's reason when the job failed (a process exited
# 5: it cannot continue); returns otherwise.
job_failed() {
  [ "$1" -eq 5 ] || return 0
  local why
  why="$(sed -n 's/.*the job cannot continue: \(.*\); every process exits 5.*/\1/p' \
    "$RUN_DIR/scheduler.log" | head -n 1)"
  echo "demo: the job failed: ${why:-see $RUN_DIR/scheduler.log}" >&2
  exit 5
}

fail() {
  echo "demo: $*" >&2
  for f in "$RUN_DIR"/*.log; do
    echo "---- last lines of $f" >&2
    tail -n 15 "$f" >&2
  done
  exit 1
}

# A port file or a summary left by an earlier run in the same directory
# would be read as this job's.
rm -f "$RUN_DIR/scheduler.port" "$RUN_DIR/summary.json"
# A new launch id per run, so this run never resumes the journal of an
# earlier one; the same command (scheduler.cmd) restarts the scheduler in
# place, taking the job back.
SCHEDULER_CMD=("$SCHEDULER" --config="$CONFIG" --port_file="$RUN_DIR/scheduler.port"
  --launch_id="$(date +%s%N)-$$")
printf '%q ' "${SCHEDULER_CMD[@]}" >"$RUN_DIR/scheduler.cmd"
"${SCHEDULER_CMD[@]}" >"$RUN_DIR/scheduler.log" 2>&1 &
SCHEDULER_PID=$!
PIDS+=("$SCHEDULER_PID")
for _ in $(seq 100); do
  [ -s "$RUN_DIR/scheduler.port" ] && break
  kill -0 "$SCHEDULER_PID" 2>/dev/null || fail "scheduler exited at start"
  sleep 0.05
done
[ -s "$RUN_DIR/scheduler.port" ] || fail "scheduler did not report its port"
ADDRESS="127.0.0.1:$(cat "$RUN_DIR/scheduler.port")"

SERVER_PIDS=()
for i in $(seq 0 $((servers - 1))); do
  "$SERVER" --config="$CONFIG" --scheduler="$ADDRESS" >"$RUN_DIR/server$i.log" 2>&1 &
  SERVER_PIDS+=($!)
  PIDS+=($!)
done

# The workers' progress lines go to the terminal too, except on a
# terminal, where the job's progress line (psctl watch, below) takes their
# place: their warnings and errors still show.
SHOWN="trainer|worker:"
[ -t 2 ] && SHOWN=" [WEC] "
WORKER_PIDS=()
for i in $(seq 0 $((workers - 1))); do
  # Progress lines go to the terminal and to the log. Log files are numbered
  # in launch order; the rank each worker got is in its log lines.
  PS_CONFIG="$CONFIG" PS_SCHEDULER="$ADDRESS" PS_NUM_SERVERS="$servers" PS_NUM_WORKERS="$workers" \
  PS_SUMMARY_OUT="$RUN_DIR/summary.json" \
  "${WORKER[@]}" --config="$CONFIG" --scheduler="$ADDRESS" \
    > "$RUN_DIR/worker$i.out" 2> >(tee "$RUN_DIR/worker$i.log" | grep --line-buffered -E "$SHOWN" >&2) &
  WORKER_PIDS+=($!)
  PIDS+=($!)
done

# The job's progress and time left, as the scheduler computes them: one
# line rewritten in place on a terminal, otherwise one line per
# training.log_interval_s (psctl watch; it ends with the job).
if [ -x "${PSCTL:-}" ]; then
  interval="$log_interval_s"
  [ "$interval" -gt 0 ] 2>/dev/null || interval=5
  [ -t 2 ] && interval=1
  "$PSCTL" --scheduler="$ADDRESS" watch --interval_s="$interval" \
    --give_up_s=30 >&2 2>>"$RUN_DIR/watch.log" &
  PIDS+=($!)
fi

start=$(date +%s)
# Workers finish on their own; a server or the scheduler dying first is a
# failure that would otherwise leave workers waiting for their timeouts.
while true; do
  running=0
  for pid in "${WORKER_PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && running=1; done
  [ $running -eq 0 ] && break
  for pid in "$SCHEDULER_PID" "${SERVER_PIDS[@]}"; do
    kill -0 "$pid" 2>/dev/null && continue
    # At the end of a job the last worker leaves, the scheduler ends the
    # job and the servers exit, possibly before that worker's process has
    # exited: give the workers 2 s before calling it a failure.
    for _ in $(seq 20); do
      running=0
      for w in "${WORKER_PIDS[@]}"; do kill -0 "$w" 2>/dev/null && running=1; done
      [ $running -eq 0 ] && break
      sleep 0.1
    done
    [ $running -eq 0 ] && break 2
    code=0
    wait "$pid" || code=$?
    job_failed "$code"
    fail "process $pid (scheduler or server) died during training"
  done
  [ $(( $(date +%s) - start )) -lt "$TIMEOUT" ] || fail "timed out after ${TIMEOUT}s"
  sleep 0.2
done
for i in "${!WORKER_PIDS[@]}"; do
  code=0
  wait "${WORKER_PIDS[$i]}" || code=$?
  job_failed "$code"
  [ "$code" -eq 0 ] || fail "worker $i failed (exit $code)"
done
# The scheduler tells the servers the job is over; all exit by themselves.
for pid in "${SERVER_PIDS[@]}" "$SCHEDULER_PID"; do
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  code=0
  wait "$pid" || code=$?
  job_failed "$code"
  [ "$code" -eq 0 ] || fail "process $pid exited with an error"
done

# Ranks come from the scheduler, so any of the processes may be rank 0,
# the one that evaluates and writes the summary. Every worker exited 0: the
# job succeeded, whether its command writes a summary or not.
SUMMARY="$(cat "$RUN_DIR/summary.json" 2>/dev/null || true)"
if [ -z "$SUMMARY" ]; then
  echo "demo: finished in $(( $(date +%s) - start ))s, every worker exited 0;" \
       "no summary (no worker wrote one to PS_SUMMARY_OUT); logs in $RUN_DIR" >&2
  exit 0
fi
echo "demo: finished in $(( $(date +%s) - start ))s; logs in $RUN_DIR" >&2
echo "$SUMMARY"
