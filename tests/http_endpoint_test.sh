#!/usr/bin/env bash
# The HTTP endpoint of every process (common/http_endpoint.h), on a real
# job on loopback (1 scheduler, 2 servers, 2 SSP workers):
#   1. a server that registered while the job is still starting is alive
#      (/healthz 200) but not ready (/readyz 503 naming the missing slot
#      map); once every server is there it is ready;
#   2. while the workers train, /metrics of the scheduler, a server and a
#      worker pass `promtool check metrics` and show the job: nodes alive,
#      worker clocks, requests and latencies by op, table rows, steps,
#      staleness (never above the SSP bound), bytes;
#   3. /healthz and /readyz answer 200 on every process; a worker started
#      with --http_port=-1 serves nothing and says so;
#   4. the scheduler's /status page, loaded by headless Chromium, names
#      every node, and its screenshot is a real PNG (kept as status.png in
#      the test's undeclared outputs);
#   5. on SIGTERM every process leaves and exits 0 (the endpoint does not
#      hold it up).
set -euo pipefail
source "$TEST_SRCDIR/$TEST_WORKSPACE/tests/testing/test_lib.sh"
source "$TEST_SRCDIR/$TEST_WORKSPACE/tests/testing/http_lib.sh"
OUT_DIR="${TEST_UNDECLARED_OUTPUTS_DIR:-$T/outputs}"
mkdir -p "$OUT_DIR"
# Bazel runs tests with a fixed PATH: an absolute path (deploy/install_deps.sh
# installs it).
PROMTOOL=/usr/bin/promtool
# fail shows the end of every process's log.
FAIL_LOGS='*.log'
FAIL_LOG_LINES=15

# http_port LOG: the port, once the process logged it.
http_port() { wait_until 10 logged_port "$1" || fail "no 'http endpoint on' line in $1"; }
# metric FILE LINE_PREFIX: the value of the first sample line starting so.
metric() {
  awk -v p="$2" 'index($0, p) == 1 { print $NF; exit }' "$1"
}
# body_matches PORT PATH PATTERN: PATH answers 200 with a body matching.
body_matches() { [ "$(http_get "$1" "$2")" = 200 ] && grep -q "$3" "$T/body"; }
# wait_for PORT PATH PATTERN SECONDS: until the body matches.
wait_for() {
  wait_until "$4" body_matches "$1" "$2" "$3" ||
    fail "port $1 $2 never matched '$3'; last body: $(head -c 400 "$T/body")"
}

CONFIG="$T/job.pbtxt"
cat > "$CONFIG" <<'CONFIG'
name: "http-test"
cluster { num_servers: 2 num_workers: 2 num_slots: 256
          heartbeat_interval_ms: 200 heartbeat_timeout_ms: 5000 }
consistency { mode: SSP staleness: 2 }
tables { id: 0 name: "sparse" sparse { dim: 1 }
         optimizer { adagrad { learning_rate: 0.1 initial_accumulator: 1e-6 } }
         init { kind: ZEROS } }
tables { id: 1 name: "dense" dense { size: 14 }
         optimizer { adagrad { learning_rate: 0.1 initial_accumulator: 1e-6 } }
         init { kind: ZEROS } }
data { synthetic_ctr { num_train: 4000000 num_test: 1000 seed: 3 } }
training { batch_size: 256 epochs: 5 log_interval_s: 5
           sparse_table: "sparse" dense_table: "dense" }
CONFIG

# ---- scheduler
start_scheduler "$T" "$CONFIG"
SCHED_HTTP="$(http_port "$T/scheduler.log")"
echo "scheduler at $ADDRESS, http port $SCHED_HTTP"
[ "$(http_get "$SCHED_HTTP" /healthz)" = 200 ] || fail "scheduler /healthz"
[ "$(http_get "$SCHED_HTTP" /nothing)" = 404 ] || fail "scheduler /nothing is not 404"

# ---- 1. one server of two: alive, not ready
start_server "$T" "$CONFIG" server0
SERVER0_PID=$LAST_PID
S0_HTTP="$(http_port "$T/server0.log")"
wait_until 10 grep -q "registered as server" "$T/server0.log" || true
[ "$(http_get "$S0_HTTP" /healthz)" = 200 ] || fail "server 0 /healthz while starting"
code="$(http_get "$S0_HTTP" /readyz)"
[ "$code" = 503 ] || fail "server 0 /readyz is $code before the job runs, want 503"
grep -q "slot map" "$T/body" || fail "server 0 /readyz says '$(cat "$T/body")'"
echo "server 0 before the job runs: /readyz 503 '$(cat "$T/body")'"

start_server "$T" "$CONFIG" server1
SERVER1_PID=$LAST_PID
S1_HTTP="$(http_port "$T/server1.log")"
start_worker "$T" "$CONFIG" worker0
WORKER0_PID=$LAST_PID
W0_HTTP="$(http_port "$T/worker0.log")"
start_worker "$T" "$CONFIG" worker1 --http_port=-1
WORKER1_PID=$LAST_PID
wait_for "$S0_HTTP" /readyz ready 20
echo "server 0 ready once both servers registered"

# ---- 2. metrics while training
wait_for "$W0_HTTP" /metrics '^ps_worker_steps_total [1-9][0-9]' 90
wait_for "$S0_HTTP" /metrics '^ps_server_table_rows{table="sparse"} [1-9]' 20
# The scheduler learns worker clocks from heartbeats (every 200 ms here), so
# it lags the worker's own counter: a loaded machine scraped it at 0.
wait_for "$SCHED_HTTP" /metrics '^ps_scheduler_worker_clock{rank="0"} [1-9]' 20
for name in scheduler:$SCHED_HTTP server0:$S0_HTTP worker0:$W0_HTTP; do
  port="${name#*:}"
  [ "$(http_get "$port" /metrics)" = 200 ] || fail "${name%%:*} /metrics"
  cp "$T/body" "$T/${name%%:*}.prom"
  cp "$T/body" "$OUT_DIR/${name%%:*}.prom"
  "$PROMTOOL" check metrics < "$T/${name%%:*}.prom" > "$T/promtool.out" 2>&1 ||
    fail "promtool check metrics on ${name%%:*}: $(cat "$T/promtool.out")"
  echo "${name%%:*}: $(grep -c '^ps_' "$T/${name%%:*}.prom") samples, promtool OK"
done
# Every metric the Grafana dashboard queries is exported by some process
# (a histogram's _bucket series by its base name).
DASH="$TEST_SRCDIR/$TEST_WORKSPACE/deploy/grafana/ps-dashboard.json"
names="$(grep -o 'ps_[a-z_]*' "$DASH" | sed -E 's/_(bucket|sum|count)$//' | sort -u)"
[ "$(echo "$names" | wc -l)" -ge 20 ] || fail "dashboard: only $(echo "$names" | wc -l) metric names"
for n in $names; do
  grep -qE "^# TYPE $n " "$T/scheduler.prom" "$T/server0.prom" "$T/worker0.prom" ||
    fail "dashboard queries $n, which no process exports"
done
echo "dashboard: $(echo "$names" | wc -l) metric names, all exported"
M="$T/scheduler.prom"
[ "$(metric "$M" 'ps_scheduler_nodes{role="server",state="alive"}')" = 2 ] || fail "scheduler: servers alive"
[ "$(metric "$M" 'ps_scheduler_nodes{role="worker",state="alive"}')" = 2 ] || fail "scheduler: workers alive"
[ "$(metric "$M" 'ps_scheduler_job_state{state="running"}')" = 1 ] || fail "scheduler: job not running"
[ "$(metric "$M" 'ps_scheduler_consistency_mode{mode="ssp"}')" = 1 ] || fail "scheduler: mode"
[ "$(metric "$M" 'ps_scheduler_worker_clock{rank="0"}')" -gt 0 ] || fail "scheduler: worker 0 clock"
[ "$(metric "$M" 'ps_scheduler_heartbeats_received_total')" -gt 0 ] || fail "scheduler: heartbeats"
M="$T/server0.prom"
[ "$(metric "$M" 'ps_server_requests_total{op="push",outcome="ok"}')" -gt 0 ] || fail "server: pushes"
[ "$(metric "$M" 'ps_server_request_duration_seconds_count{op="pull"}')" -gt 0 ] || fail "server: pull latency"
[ "$(metric "$M" 'ps_server_received_bytes_total')" -gt 0 ] || fail "server: bytes in"
[ "$(metric "$M" 'ps_server_view_epoch')" -gt 0 ] || fail "server: epoch"
[ "$(metric "$M" 'ps_server_rank')" = 0 ] || fail "server: rank"
M="$T/worker0.prom"
steps="$(metric "$M" 'ps_worker_steps_total')"
[ "$steps" -ge 10 ] || fail "worker: steps $steps"
[ "$(metric "$M" 'ps_worker_examples_total')" -ge $(( (steps - 1) * 256 )) ] || fail "worker: examples"
[ "$(metric "$M" 'ps_worker_step_duration_seconds_count')" -ge "$steps" ] || fail "worker: step times"
[ "$(metric "$M" 'ps_worker_request_duration_seconds_count{op="pull"}')" -gt 0 ] || fail "worker: pull latency"
[ "$(metric "$M" 'ps_worker_request_duration_seconds_count{op="push"}')" -gt 0 ] || fail "worker: push latency"
pulls="$(metric "$M" 'ps_worker_staleness_clocks_count')"
[ "$pulls" -gt 0 ] || fail "worker: staleness"
# SSP with staleness 2: a pull at clock c is answered only once every live
# worker reached c - 2, so no answered pull was more than 2 clocks ahead.
[ "$(metric "$M" 'ps_worker_staleness_clocks_bucket{le="2"}')" = "$pulls" ] ||
  fail "worker: pulls more than 2 clocks ahead of the slowest under SSP 2"
[ "$(metric "$M" 'ps_worker_sent_bytes_total')" -gt 0 ] || fail "worker: bytes sent"
echo "worker 0: $steps steps"

# ---- 3. health and readiness everywhere
for port in "$SCHED_HTTP" "$S0_HTTP" "$S1_HTTP" "$W0_HTTP"; do
  [ "$(http_get "$port" /healthz)" = 200 ] && [ "$(cat "$T/body")" = ok ] || fail "port $port /healthz"
  [ "$(http_get "$port" /readyz)" = 200 ] || fail "port $port /readyz: $(cat "$T/body")"
done
grep -q "http endpoint off" "$T/worker1.log" || fail "worker 1 did not say its endpoint is off"
! grep -q "http endpoint on" "$T/worker1.log" || fail "worker 1 serves http despite --http_port=-1"

# ---- 4. the status page in a real browser
[ "$(http_get "$SCHED_HTTP" /status)" = 200 ] || fail "scheduler /status"
grep -q '<meta http-equiv="refresh" content="2">' "$T/body" || fail "/status does not reload itself"
URL="http://127.0.0.1:$SCHED_HTTP/status"
# Chromium cannot reach anything off loopback (tests/testing/http_lib.sh).
chrome() { offline_chromium "$@" 2> "$T/chromium.log"; }
chrome --dump-dom "$URL" > "$T/status.dom" || fail "chromium --dump-dom: $(tail -n 5 "$T/chromium.log")"
for node in server/0 server/1 worker/0 worker/1 http-test RUNNING "SSP (staleness 2)"; do
  grep -qF "$node" "$T/status.dom" || fail "the status page has no '$node'"
done
chrome --screenshot="$T/status.png" --window-size=1200,800 "$URL" > /dev/null ||
  fail "chromium --screenshot: $(tail -n 5 "$T/chromium.log")"
[ "$(head -c 4 "$T/status.png" | od -An -c | tr -d ' ')" = "211PNG" ] || fail "screenshot is not a PNG"
size="$(stat -c %s "$T/status.png")"
# A blank 1200x800 page compresses to a few KB; text and tables take more.
[ "$size" -gt 20000 ] || fail "screenshot is only $size bytes"
cp "$T/status.png" "$OUT_DIR/status.png"
echo "status page: screenshot $size bytes"

# ---- 5. everyone leaves on SIGTERM and exits 0
# Once server 0 left without a checkpoint, its slots have no live copy: the
# job has failed, and what is still running may exit 5 on its own, saying so
# (docs/operations.md, exit codes), before its SIGTERM.
stop() {  # stop PID NAME [LOG: exit 5 with "the job failed" in it is fine]
  kill -TERM "$1" 2>/dev/null || [ -n "${3:-}" ] || fail "$2 is not running"
  local rc=0
  wait_exit "$1" 30 || rc=$?
  [ "$rc" != 124 ] || fail "$2 did not exit within 30 s of SIGTERM"
  if [ "$rc" = 5 ] && [ -n "${3:-}" ] && grep -q "the job failed\|the job cannot continue" "$3"; then
    echo "$2 exited 5: the job failed once server 0 left"
    return
  fi
  [ "$rc" = 0 ] || fail "$2 exited with $rc after SIGTERM"
}
stop "$WORKER0_PID" "worker 0"
stop "$WORKER1_PID" "worker 1"
stop "$SERVER0_PID" "server 0"
stop "$SERVER1_PID" "server 1" "$T/server1.log"
stop "$SCHED_PID" scheduler "$T/scheduler.log"
[ "$(http_get "$SCHED_HTTP" /healthz)" = 000 ] || fail "the scheduler's endpoint still answers"
PIDS=()
echo PASS
