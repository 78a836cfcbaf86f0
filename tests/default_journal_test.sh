#!/usr/bin/env bash
# The demo's job (examples/ctr/async.pbtxt, as deploy/local/demo.sh starts
# it: no checkpoint.dir, no cluster.scheduler_state_dir, the scheduler on a
# port of its choosing written to --port_file) survives its scheduler being
# SIGKILLed mid-job and started again with the same command: the journal
# is kept by default in the job's state directory
# ($HOME/.local/state/ps/ctr-async), the new scheduler listens on the port
# the nodes know, and every process exits 0 with the normal summary.
# Then a new launch of the same job is never taken for a restart: neither
# after a finished job nor right after one that was SIGKILLed whole.
set -euo pipefail
source "$TEST_SRCDIR/$TEST_WORKSPACE/tests/testing/test_lib.sh"

export HOME="$T/home"
unset XDG_STATE_HOME
STATE="$HOME/.local/state/ps/ctr-async"
CONFIG="$T/ctr.pbtxt"
# The training set is half again the demo's (so the job is still training
# when its scheduler is killed, on a fast machine too) and the test set
# smaller; the cluster and everything else is the demo's.
shrink_config "$R/examples/ctr/async.pbtxt" "$CONFIG" 1500000 50000
grep -q "scheduler_state_dir\|checkpoint" "$CONFIG" && fail "the demo config names a state dir"
FAIL_LOGS='run*/*.log'
WAIT_S=$((300 * ${PS_TIMEOUT_SCALE:-1}))

# launch DIR LAUNCH_ID: the demo's processes (scheduler, 2 servers, 2
# workers) in DIR; sets SCHED_CMD, SCHED_PID, SERVER_PIDS, WORKER_PIDS.
launch() {
  local dir="$1" id="$2" i
  mkdir -p "$dir"
  SCHED_CMD=("$SCHEDULER" --config="$CONFIG" --port_file="$dir/scheduler.port"
             --launch_id="$id")
  spawn "$dir/scheduler.log" "$dir/scheduler.log" "${SCHED_CMD[@]}"
  SCHED_PID=$LAST_PID
  wait_until 20 _scheduler_listening "$dir" || fail "the scheduler wrote no port"
  ADDRESS="127.0.0.1:$(cat "$dir/scheduler.port")"
  SERVER_PIDS=()
  WORKER_PIDS=()
  for i in 0 1; do
    start_server "$dir" "$CONFIG" "server$i"
    SERVER_PIDS+=("$LAST_PID")
  done
  for i in 0 1; do
    start_worker "$dir" "$CONFIG" "worker$i"
    WORKER_PIDS+=("$LAST_PID")
  done
}

# training DIR: the job runs (every node registered) and the workers have
# reported steps.
training() { [ "$(grep -c "registered" "$1/scheduler.log")" -ge 4 ] && sleep 1; }

# expect_clean_finish DIR: every process exits 0, one summary, the normal
# one.
expect_clean_finish() {
  local dir="$1" pid code
  for pid in "${WORKER_PIDS[@]}" "${SERVER_PIDS[@]}" "$SCHED_PID"; do
    code=0
    wait_exit "$pid" "$WAIT_S" || code=$?
    [ "$code" -eq 0 ] || fail "process $pid exited $code in $dir"
  done
  local summary
  summary="$(cat "$dir"/worker*.out | grep '^{' | tail -n 1)"
  echo "summary: $summary"
  # Rank 0 trains its half of 1500000 examples 3 times.
  expect_ctr_summary "$summary" 2250000
}

# 1. SIGKILL the scheduler mid-job; start it again with the same command.
launch "$T/run1" launch-1
wait_until 120 training "$T/run1" || fail "the job did not start training"
[ -s "$STATE/scheduler.journal" ] || fail "no journal in the default state dir $STATE"
grep -q "journal: $STATE/scheduler.journal" "$T/run1/scheduler.log" ||
  fail "the scheduler did not say where its journal is"
PORT="$(cat "$T/run1/scheduler.port")"
kill -KILL "$SCHED_PID" 2>/dev/null ||
  fail "the scheduler was gone before the kill (the job finished too soon?)"
wait_exit "$SCHED_PID" 10 >/dev/null || true
spawn "$T/run1/scheduler.2.log" "$T/run1/scheduler.2.log" "${SCHED_CMD[@]}"
SCHED_PID=$LAST_PID
wait_until 20 grep -q "took the job back" "$T/run1/scheduler.2.log" ||
  fail "the restarted scheduler did not take the job back"
[ "$(cat "$T/run1/scheduler.port")" = "$PORT" ] ||
  fail "the restarted scheduler listens on $(cat "$T/run1/scheduler.port"), the nodes know $PORT"
expect_clean_finish "$T/run1"
echo "run 1: the job survived its scheduler's SIGKILL"

# 2. The same job launched again after it finished: a new job.
launch "$T/run2" launch-2
wait_until 120 training "$T/run2" || fail "the second launch did not start training"
grep -q "took the job back" "$T/run2/scheduler.log" && fail "a new launch resumed a finished job"
# Then everything is SIGKILLed at once, leaving a live, unfinished journal.
kill -KILL "$SCHED_PID" "${SERVER_PIDS[@]}" "${WORKER_PIDS[@]}"
for pid in "$SCHED_PID" "${SERVER_PIDS[@]}" "${WORKER_PIDS[@]}"; do
  wait_exit "$pid" 10 >/dev/null || true
done

# 3. Launched again at once: still a new job, trained from the start.
launch "$T/run3" launch-3
grep -q "took the job back" "$T/run3/scheduler.log" && fail "a new launch resumed a killed one"
grep -q "is of launch 'launch-2'" "$T/run3/scheduler.log" ||
  fail "the killed launch's journal was not set aside"
expect_clean_finish "$T/run3"
echo PASS
