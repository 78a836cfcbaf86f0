# Shared helpers of the shell tests in tests/. An sh_test lists this file in
# its data and sources it right after `set -euo pipefail`:
#
#   source "$TEST_SRCDIR/$TEST_WORKSPACE/tests/testing/test_lib.sh"
#
# It sets R (the runfiles root), T ($TEST_TMPDIR), BIN ($T/bin, filled by
# stage_binaries), SCHEDULER, SERVER and TRAINER (the binaries in the
# runfiles), PIDS (processes started by spawn) and an EXIT trap that SIGKILLs
# whatever of PIDS is still running; a test that sets its own EXIT trap calls
# kill_spawned from it.
#
# Every helper that checks something ends the test through fail (exit 1).
# Run inside $(...), a helper ends only that subshell; the test still stops
# because the assignment fails under set -e. The exit status of $(...) is
# lost inside [ ... ], in arguments and in `local x="$(...)"`: assign the
# result of json_field to a variable first, or use expect_field.
#
# Needs bash and Debian's /usr/bin/python3 (its json module), which
# deploy/install_deps.sh --tests installs.

R="$TEST_SRCDIR/$TEST_WORKSPACE"
T="$TEST_TMPDIR"
BIN="$T/bin"
SCHEDULER="$R/scheduler/scheduler_main"
SERVER="$R/server/server_main"
TRAINER="$R/worker/trainer"
# Bazel runs tests with a fixed PATH: an absolute path.
PYTHON=/usr/bin/python3

# ---------------------------------------------------------------- failing

# fail MESSAGE...: prints "FAIL: MESSAGE" on stderr and exits 1. When
# FAIL_LOGS is set, a glob relative to $T (e.g. '*/*.log'), it first shows
# the last FAIL_LOG_LINES (default 15) lines of every file it matches.
fail() {
  echo "FAIL: $*" >&2
  if [ -n "${FAIL_LOGS:-}" ]; then
    local f
    for f in "$T"/$FAIL_LOGS; do
      [ -f "$f" ] || continue
      echo "---- last lines of $f" >&2
      tail -n "${FAIL_LOG_LINES:-15}" "$f" >&2
    done
  fi
  exit 1
}

# check CONDITION MESSAGE: CONDITION is an awk expression (numbers compare
# as numbers: "0.8663 >= 0.85"); fails with MESSAGE unless it holds.
check() { awk "BEGIN { exit !($1) }" || fail "$2"; }

# ---------------------------------------------------------------- JSON

# The reader behind json_field: argv is KEY and "one" (stdin is one JSON
# document) or "lines" (stdin is JSON lines; one value a line). Numbers keep
# the text they were written with, because tests compare that text and do
# integer arithmetic on it (0.87600 must not come back as 0.876).
_TEST_LIB_JSON_PY='
import json, sys

key, mode = sys.argv[1], sys.argv[2]

class Number(str):
    pass

def fail(message, text):
    shown = text if len(text) <= 2000 else text[:2000] + "..."
    sys.stderr.write("json_field: %s; the input was: %s\n" % (message, shown))
    sys.exit(1)

def compact(v):
    if isinstance(v, Number):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)
    if v is True or v is False or v is None:
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ",".join(compact(x) for x in v) + "]"
    return "{" + ",".join(json.dumps(k) + ":" + compact(x) for k, x in v.items()) + "}"

def field(text, where):
    if not text.strip():
        fail("no JSON%s, looking for key \"%s\"" % (where, key), text)
    try:
        v = json.loads(text, parse_int=Number, parse_float=Number,
                       parse_constant=Number)
    except ValueError as e:
        fail("not valid JSON%s (%s), looking for key \"%s\"" % (where, e, key), text)
    for part in key.split("."):
        if isinstance(v, dict) and part in v:
            v = v[part]
        elif isinstance(v, list) and part.isdigit() and int(part) < len(v):
            v = v[int(part)]
        else:
            missing = "" if part == key else " (no \"%s\" there)" % part
            fail("no key \"%s\"%s%s" % (key, missing, where), text)
    return v if isinstance(v, str) and not isinstance(v, Number) else compact(v)

data = sys.stdin.buffer.read().decode("utf-8", "replace")
if mode == "one":
    values = [field(data, "")]
else:
    lines = data[:-1].split("\n") if data.endswith("\n") else data.split("\n")
    values = [field(l, " on line %d" % (i + 1)) for i, l in enumerate(lines)]
sys.stdout.buffer.write("".join(v + "\n" for v in values).encode("utf-8"))
'

# json_field JSON KEY: prints the value of KEY in the JSON document JSON
# (e.g. a job's summary line). A dotted KEY reaches into nested objects
# ("eval.auc"), a numeric part into arrays ("shards_trained.0"). Strings
# print without quotes, numbers exactly as written, true, false and null as
# in JSON, objects and arrays as compact JSON. When JSON is empty or not
# valid JSON, or has no KEY, it prints a message naming KEY and showing the
# input on stderr and returns 1.
json_field() {
  [ $# -eq 2 ] || { echo "json_field: usage: json_field JSON KEY" >&2; return 2; }
  printf '%s' "$1" | "$PYTHON" -c "$_TEST_LIB_JSON_PY" "$2" one
}

# json_field_lines FILE KEY: json_field for every line of FILE (JSON lines,
# e.g. a metrics file), one value a line; returns 1 (naming the line) when
# any line is not valid JSON or has no KEY.
json_field_lines() {
  [ $# -eq 2 ] || { echo "json_field_lines: usage: json_field_lines FILE KEY" >&2; return 2; }
  "$PYTHON" -c "$_TEST_LIB_JSON_PY" "$2" lines < "$1"
}

# expect_field JSON KEY VALUE MESSAGE: fails with MESSAGE unless KEY of JSON
# is exactly VALUE (as json_field prints it).
expect_field() {
  local got
  got="$(json_field "$1" "$2")" || fail "$4"
  [ "$got" = "$3" ] || fail "$4 ($2 is '$got', want '$3')"
}

# ---------------------------------------------------------------- waiting

# wait_until WAIT_S COMMAND...: runs COMMAND every 0.1 s, WAIT_S x 10 times
# and once more at the end, until it succeeds; returns 1 if it never did.
wait_until() {
  local wait_s="$1" i
  shift
  for ((i = 0; i < wait_s * 10; i++)); do
    "$@" && return 0
    sleep 0.1
  done
  "$@"
}

# wait_exit PID WAIT_S: waits up to WAIT_S seconds for the child PID to exit
# and returns its exit status, or 124 if it is still running.
wait_exit() {
  local pid="$1" i
  for ((i = 0; i < $2 * 10; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -0 "$pid" 2>/dev/null && return 124
  wait "$pid"
}

# ---------------------------------------------------------------- processes

PIDS=()
# kill_spawned: SIGKILLs every process spawn started (those gone are skipped).
kill_spawned() {
  local pid
  for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
}
trap kill_spawned EXIT

# spawn STDOUT STDERR COMMAND...: starts COMMAND in the background with its
# output in the files STDOUT and STDERR (one file when they are the same),
# adds it to PIDS and sets LAST_PID. Call it from the test's shell, not
# inside $(...), or the process escapes PIDS.
spawn() {
  local out="$1" err="$2"
  shift 2
  if [ "$out" = "$err" ]; then
    "$@" > "$out" 2>&1 &
  else
    "$@" > "$out" 2> "$err" &
  fi
  LAST_PID=$!
  PIDS+=("$LAST_PID")
}

# start_scheduler DIR CONFIG [WAIT_S]: starts $SCHEDULER on CONFIG with its
# output in DIR/scheduler.log and waits up to WAIT_S seconds (default 10)
# for DIR/scheduler.port; fails if it exits first or writes no port. Sets
# SCHED_PID and ADDRESS (127.0.0.1:PORT). Unless the config names one, the
# scheduler journals in DIR/scheduler-state: a scheduler started again in
# DIR takes back a job whose scheduler died there.
start_scheduler() {
  local dir="$1" config="$2" wait_s="${3:-10}"
  mkdir -p "$dir"
  rm -f "$dir/scheduler.port"
  spawn "$dir/scheduler.log" "$dir/scheduler.log" \
    "$SCHEDULER" --config="$config" --port_file="$dir/scheduler.port" \
    --state_dir="$dir/scheduler-state"
  SCHED_PID=$LAST_PID
  if ! wait_until "$wait_s" _scheduler_listening "$dir"; then
    tail -n 20 "$dir/scheduler.log" >&2
    fail "the scheduler wrote no port in $wait_s s"
  fi
  ADDRESS="127.0.0.1:$(cat "$dir/scheduler.port")"
}
_scheduler_listening() {
  [ -s "$1/scheduler.port" ] && return 0
  kill -0 "$SCHED_PID" 2>/dev/null || fail "scheduler exited at start"
  return 1
}

# start_server DIR CONFIG NAME [FLAG...]: starts $SERVER on CONFIG against
# the scheduler at ADDRESS, its output in DIR/NAME.log; sets LAST_PID.
start_server() {
  local dir="$1" config="$2" name="$3"
  shift 3
  spawn "$dir/$name.log" "$dir/$name.log" \
    "$SERVER" --config="$config" --scheduler="$ADDRESS" "$@"
}

# start_worker DIR CONFIG NAME [FLAG...]: starts $TRAINER on CONFIG against
# the scheduler at ADDRESS, its stdout (the summary) in DIR/NAME.out, its log
# in DIR/NAME.log; sets LAST_PID.
start_worker() {
  local dir="$1" config="$2" name="$3"
  shift 3
  spawn "$dir/$name.out" "$dir/$name.log" \
    "$TRAINER" --config="$config" --scheduler="$ADDRESS" "$@"
}

# ---------------------------------------------------------------- demo jobs

# stage_binaries: copies scheduler_main, server_main and trainer into $BIN,
# the one directory deploy/local/demo.sh takes them from (PS_BIN_DIR).
stage_binaries() {
  mkdir -p "$BIN"
  cp "$SCHEDULER" "$SERVER" "$TRAINER" "$BIN/"
}

# shrink_config SRC DEST NUM_TRAIN NUM_TEST [SED_EXPR...]: writes DEST, the
# example config SRC with its synthetic data set (num_train: 1000000,
# num_test: 100000) cut to NUM_TRAIN and NUM_TEST examples and each SED_EXPR
# applied; fails if the data set was not changed.
shrink_config() {
  local src="$1" dest="$2" train="$3" test="$4" e
  shift 4
  local args=(-e "s/num_train: 1000000/num_train: $train/"
              -e "s/num_test: 100000/num_test: $test/")
  for e in "$@"; do args+=(-e "$e"); done
  sed "${args[@]}" "$src" > "$dest"
  grep -q "num_train: $train" "$dest" && grep -q "num_test: $test" "$dest" ||
    fail "could not shrink $(basename "$src")"
}

# run_demo NAME CONFIG TIMEOUT_S: runs the job CONFIG with
# deploy/local/demo.sh on the staged binaries ($BIN), within TIMEOUT_S
# seconds (PS_DEMO_TIMEOUT, which demo.sh scales by PS_TIMEOUT_SCALE); the
# processes' logs go to $T/run-NAME, demo.sh's output to $T/NAME.out and
# $T/NAME.err. Prints the job's summary (the last line of the output). When
# the job fails it shows the end of NAME.err and every error line, and fails.
run_demo() {
  local name="$1" config="$2" timeout="$3"
  PS_BIN_DIR="$BIN" PS_RUN_DIR="$T/run-$name" PS_DEMO_TIMEOUT="$timeout" \
    bash "$R/deploy/local/demo.sh" "$config" > "$T/$name.out" 2> "$T/$name.err" || {
    tail -n 30 "$T/$name.err" >&2
    grep -h " E \[\|demo:" "$T/$name.err" "$T/$name.out" "$T/run-$name"/*.log >&2 || true
    fail "the job $name ($(basename "$config")) failed"
  }
  tail -n 1 "$T/$name.out"
}

# expect_ctr_summary SUMMARY [RANK0_EXAMPLES]: the normal end of the CTR
# example (examples/ctr/async.pbtxt, by default cut to 200000 training
# examples): 2 workers and 2 servers, rank 0 trained its half of the
# training set 3 times (RANK0_EXAMPLES, default 300000), and the test AUC is
# within 0.01 of the oracle's.
expect_ctr_summary() {
  local summary="$1" examples="${2:-300000}" auc oracle gap
  expect_field "$summary" workers 2 "wrong counts"
  expect_field "$summary" servers 2 "wrong counts"
  expect_field "$summary" rank0_examples "$examples" "wrong example count"
  auc="$(json_field "$summary" test_auc)"
  oracle="$(json_field "$summary" oracle_auc)"
  # Integer arithmetic on AUC x 100000 (both have 5 decimals): the gap must
  # be under 0.01.
  gap=$(( $(printf '%.0f' "$(echo "$oracle" | tr -d .)") - $(printf '%.0f' "$(echo "$auc" | tr -d .)") ))
  echo "AUC gap x 1e5: $gap"
  [ "$gap" -lt 1000 ] || fail "test AUC $auc is not within 0.01 of oracle $oracle"
}
