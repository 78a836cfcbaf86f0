#!/usr/bin/env bash
# The helpers of tests/testing/test_lib.sh on their own, no job: json_field
# reads what the shell tests' old sed `field` got wrong (a missing key, a
# nested key, a value with a comma, a line that is not JSON) and the test
# shows the sed did get them wrong; check, expect_field, wait_until,
# wait_exit and the EXIT trap that kills spawned processes.
set -euo pipefail
LIB="$TEST_SRCDIR/$TEST_WORKSPACE/tests/testing/test_lib.sh"
source "$LIB"

# The sed every shell test used before test_lib.sh.
old_field() { echo "$1" | sed -n "s/.*\"$2\":\([^,}]*\).*/\1/p" | tr -d '"'; }

# same WHAT GOT WANT
same() { [ "$2" = "$3" ] || fail "$1: got '$2', want '$3'"; }
# refused WHAT COMMAND...: COMMAND must fail and say why on stderr.
refused() {
  local what="$1" rc=0
  shift
  "$@" > "$T/out" 2> "$T/err" || rc=$?
  [ "$rc" -ne 0 ] || fail "$what: exit 0 (printed '$(cat "$T/out")')"
  [ -s "$T/err" ] || fail "$what: failed without a message"
  echo "$what: exit $rc: $(head -n 1 "$T/err")"
}

# ---- A missing key: the sed printed nothing and exited 0, so a test
# compared an empty string; json_field fails naming the key and the line.
S='{"model":"FM","mode":"BSP","workers":2,"test_auc":0.87600,"oracle_auc":null}'
same "old sed, missing key" "$(old_field "$S" test_accuracy)" ""
old_field "$S" test_accuracy > /dev/null || fail "the old sed failed on a missing key"
refused "missing key" json_field "$S" test_accuracy
grep -q 'no key "test_accuracy"' "$T/err" || fail "the message does not name the key: $(cat "$T/err")"
grep -qF "$S" "$T/err" || fail "the message does not show the line: $(cat "$T/err")"
# Inside $(...) under set -e the test stops at the assignment.
rc=0
bash -c "set -euo pipefail; source '$LIB'; v=\"\$(json_field '$S' test_accuracy)\"; echo went on" \
  > "$T/out" 2> /dev/null || rc=$?
[ "$rc" -ne 0 ] && ! grep -q "went on" "$T/out" ||
  fail "an assignment from json_field of a missing key did not stop the script"

# ---- Plain values: strings without quotes, numbers exactly as written
# (the tests do integer arithmetic on "0.87600"), null as null.
same "string" "$(json_field "$S" mode)" BSP
same "integer" "$(json_field "$S" workers)" 2
same "number text kept" "$(json_field "$S" test_auc)" 0.87600
same "null" "$(json_field "$S" oracle_auc)" null
same "old sed agrees on plain values" "$(old_field "$S" test_auc)" 0.87600

# ---- Nested objects: a dotted key reaches in. The sed cannot address a
# nested key: it took the last "auc" anywhere in the line, and for the
# object itself printed its first fragment.
N='{"train":{"auc":0.91000,"loss":0.3},"test":{"auc":0.85000,"loss":0.4},"shards":[3,4]}'
same "nested test.auc" "$(json_field "$N" test.auc)" 0.85000
same "nested train.auc" "$(json_field "$N" train.auc)" 0.91000
same "an object as compact JSON" "$(json_field "$N" train)" '{"auc":0.91000,"loss":0.3}'
same "an array" "$(json_field "$N" shards)" "[3,4]"
same "an array element" "$(json_field "$N" shards.1)" 4
same "old sed, nested: the last auc whatever the object" "$(old_field "$N" auc)" 0.85000
same "old sed, an object: a fragment" "$(old_field "$N" train)" "{auc:0.91000"
same "old sed, an array: a fragment" "$(old_field "$N" shards)" "[3"
refused "missing nested key" json_field "$N" test.accuracy
grep -q 'no key "test.accuracy" (no "accuracy" there)' "$T/err" || fail "unclear: $(cat "$T/err")"
refused "a key below a number" json_field "$N" test.auc.x

# ---- A string holding a comma, a brace and a quote: the sed stopped at
# the first comma.
C='{"name":"ctr, small {v2} \"b\"","n":3}'
same "comma in a string" "$(json_field "$C" name)" 'ctr, small {v2} "b"'
same "after the string" "$(json_field "$C" n)" 3
same "old sed, comma in a string: cut" "$(old_field "$C" name)" "ctr"

# ---- Not JSON, or nothing at all: the sed still found a "value".
B='epoch 1 done, "test_auc":0.71234, training goes on'
same "old sed on a line that is not JSON" "$(old_field "$B" test_auc)" 0.71234
refused "not JSON" json_field "$B" test_auc
grep -q "not valid JSON" "$T/err" || fail "unclear: $(cat "$T/err")"
refused "an empty summary" json_field "" test_auc
refused "two documents" json_field $'{"a":1}\n{"a":2}' a
refused "usage" json_field "$S"

# ---- JSON lines.
printf '{"step":50,"seconds":1.5}\n{"step":100,"seconds":2.25}\n' > "$T/m.jsonl"
same "json_field_lines" "$(json_field_lines "$T/m.jsonl" step | tr '\n' ' ')" "50 100 "
printf '{"step":50}\n{"steps":100}\n' > "$T/bad.jsonl"
refused "json_field_lines, a line without the key" json_field_lines "$T/bad.jsonl" step
grep -q "on line 2" "$T/err" || fail "does not name the line: $(cat "$T/err")"
printf '{"step":50}\n\n{"step":100}\n' > "$T/blank.jsonl"
refused "json_field_lines, a blank line" json_field_lines "$T/blank.jsonl" step

# ---- expect_field and check end the test with the message.
expect_field "$S" mode BSP "mode"
refused "expect_field, another value" bash -c "source '$LIB'; expect_field '$S' mode ASYNC 'not ASYNC'"
grep -q "FAIL: not ASYNC (mode is 'BSP', want 'ASYNC')" "$T/err" || fail "unclear: $(cat "$T/err")"
refused "expect_field, no key" bash -c "source '$LIB'; expect_field '$S' epochs 3 'no epochs'"
grep -q "FAIL: no epochs" "$T/err" || fail "unclear: $(cat "$T/err")"
check "0.87600 - 0.86 < 0.02" "check of a true condition"
refused "check, false" bash -c "source '$LIB'; check '0.8 >= 0.85' 'below 0.85'"
grep -q "FAIL: below 0.85" "$T/err" || fail "unclear: $(cat "$T/err")"
refused "check, an empty value" bash -c "source '$LIB'; check ' >= 0.85' 'no value'"

# ---- fail shows the logs FAIL_LOGS names.
mkdir -p "$T/run"
printf 'line 1\nline 2\nline 3\n' > "$T/run/a.log"
refused "fail with logs" bash -c "source '$LIB'; FAIL_LOGS='run/*.log' FAIL_LOG_LINES=2; fail boom"
grep -q "^FAIL: boom" "$T/err" && grep -q "^line 3" "$T/err" && ! grep -q "^line 1" "$T/err" ||
  fail "fail did not show the last 2 lines: $(cat "$T/err")"

# ---- Waiting with a bound.
start=$(date +%s%N)
if wait_until 1 false; then fail "wait_until of false succeeded"; fi
ms=$(( ($(date +%s%N) - start) / 1000000 ))
[ "$ms" -ge 1000 ] && [ "$ms" -lt 5000 ] || fail "wait_until 1 took $ms ms"
(sleep 0.3; touch "$T/flag") &
wait_until 5 test -e "$T/flag" || fail "wait_until missed the file"
sleep 0.2 &
pid=$!
rc=0; wait_exit "$pid" 5 || rc=$?
same "wait_exit of a process that ends" "$rc" 0
(exit 3) &
pid=$!
rc=0; wait_exit "$pid" 5 || rc=$?
same "wait_exit returns the exit status" "$rc" 3
spawn "$T/sleep.out" "$T/sleep.out" sleep 30
rc=0; wait_exit "$LAST_PID" 1 || rc=$?
same "wait_exit of a process still running" "$rc" 124

# ---- The EXIT trap kills what spawn started, also when the test fails.
bash -c "source '$LIB'; spawn '$T/s.out' '$T/s.err' sleep 60; echo \$LAST_PID > '$T/s.pid'; fail stop" 2> /dev/null || true
victim=$(cat "$T/s.pid")
# gone PID: no such process, or only a zombie not yet reaped.
gone() { [ ! -e "/proc/$1" ] || grep -q '^[0-9]* ([^)]*) Z' "/proc/$1/stat" 2> /dev/null; }
wait_until 5 gone "$victim" || fail "process $victim outlived its test"

echo PASS
