#!/usr/bin/env bash
# A real job with security on. Keys from deploy/security/
# make_job_keys.sh; the CTR example (scheduler, 2 servers, 2 workers,
# separate processes) with security.tls (mutual TLS on the gRPC control
# plane) and security.curve (CURVE on the data plane) must train to its
# normal summary. Against a scheduler with TLS, psctl with the job's files
# is answered; psctl in plaintext, with a certificate of another CA, or
# with no certificate at all is refused (exit 1, a message naming TLS) and
# the scheduler logs every refusal.
set -euo pipefail
source "$TEST_SRCDIR/$TEST_WORKSPACE/tests/testing/test_lib.sh"
stage_binaries
PSCTL="$R/scheduler/psctl"

"$R/deploy/security/make_job_keys" "$T/keys" > "$T/snippet.txt"
"$R/deploy/security/make_job_keys" --tls_only "$T/other" > /dev/null
for f in ca.pem ca.key job.pem job.key curve.pub curve.key; do
  [ "$(stat -c %a "$T/keys/$f")" = "600" ] || fail "$f is not mode 0600"
done
grep -q "^security {" "$T/snippet.txt" && grep -q "curve {" "$T/snippet.txt" ||
  { cat "$T/snippet.txt"; fail "no config snippet"; }

CONFIG="$T/secure.pbtxt"
shrink_config "$R/examples/ctr/async.pbtxt" "$CONFIG" 200000 50000
grep -v "^#" "$T/snippet.txt" >> "$CONFIG"

# --- Refusals, against a scheduler of the same config that waits for nodes.
start_scheduler "$T" "$CONFIG" 5
ADDR="$ADDRESS"

"$PSCTL" --scheduler="$ADDR" --config="$CONFIG" status > "$T/ok.out" 2>&1 ||
  { cat "$T/ok.out"; fail "psctl with the job's certificate failed"; }
grep -q "^job: STARTING" "$T/ok.out" || { cat "$T/ok.out"; fail "no status"; }
"$PSCTL" --scheduler="$ADDR" --tls_ca="$T/keys/ca.pem" --tls_cert="$T/keys/job.pem" \
  --tls_key="$T/keys/job.key" status > /dev/null 2>&1 || fail "psctl --tls_* failed"

refused() {  # NAME ARGS...: psctl must exit 1 with a message naming TLS
  local name=$1; shift
  local rc=0
  "$PSCTL" --scheduler="$ADDR" --timeout_ms=3000 "$@" status > "$T/$name.out" 2>&1 || rc=$?
  [ $rc -eq 1 ] || { cat "$T/$name.out"; fail "$name: psctl exit $rc, want 1"; }
  grep -q "UNAVAILABLE" "$T/$name.out" && grep -qi "TLS" "$T/$name.out" ||
    { cat "$T/$name.out"; fail "$name: unclear message"; }
  echo "$name refused: $(grep -m1 "scheduler $ADDR" "$T/$name.out")"
}
SCHED_LOG="$T/scheduler.log"
before=$(grep -c "TLS handshake failed, peer refused" "$SCHED_LOG" || true)
# The scheduler refuses a plaintext client and one presenting a
# certificate of another CA (it trusts the job CA, so it gets as far as
# sending its certificate).
refused plaintext
grep -q "peer refused.*wrong version number" "$SCHED_LOG" ||
  { cat "$SCHED_LOG"; fail "plaintext refusal not logged"; }
refused other_cert --tls_ca="$T/keys/ca.pem" --tls_cert="$T/other/job.pem" --tls_key="$T/other/job.key"
grep -q "peer refused.*certificate verify failed" "$SCHED_LOG" ||
  { cat "$SCHED_LOG"; fail "other-CA client refusal not logged"; }
# A client wholly of another job refuses the scheduler's certificate itself.
refused other_ca --tls_ca="$T/other/ca.pem" --tls_cert="$T/other/job.pem" --tls_key="$T/other/job.key"
grep -q "certificate verify failed" "$T/other_ca.out" || fail "unclear other_ca message"
after=$(grep -c "TLS handshake failed, peer refused" "$SCHED_LOG" || true)
echo "scheduler logged $((after - before)) refusals:"
grep "peer refused" "$SCHED_LOG"
# A config whose key file is readable by everyone is refused at start.
cp "$T/keys/job.key" "$T/open.key"; chmod 0644 "$T/open.key"
sed "s|$T/keys/job.key|$T/open.key|" "$CONFIG" > "$T/open.pbtxt"
if "$BIN/scheduler_main" --config="$T/open.pbtxt" --describe > "$T/open.out" 2>&1; then
  fail "a world-readable key was accepted"
fi
grep -q "readable by every user" "$T/open.out" || { cat "$T/open.out"; fail "unclear"; }
kill "$SCHED_PID"; wait "$SCHED_PID" 2>/dev/null || true
PIDS=()

# --- The job trains with TLS and CURVE on.
SUMMARY="$(run_demo demo "$CONFIG" 150)"
echo "summary: $SUMMARY"
expect_ctr_summary "$SUMMARY"
served=$(cat "$T"/run-demo/*.log | grep -c "serving .* (CURVE)" || true)
[ "$served" -ge 2 ] || fail "servers did not report CURVE ($served lines)"
if grep -l "peer refused\|refused a data-plane connection" "$T"/run-demo/*.log; then
  fail "a job process refused a peer"
fi
echo PASS
