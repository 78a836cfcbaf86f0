#!/usr/bin/env bash
# Issue 9: a real job with security on. Keys from deploy/security/
# make_job_keys.sh; the CTR example (scheduler, 2 servers, 2 workers,
# separate processes) with security.tls (mutual TLS on the gRPC control
# plane) and security.curve (CURVE on the data plane) must train to its
# normal summary. Against a scheduler with TLS, psctl with the job's files
# is answered; psctl in plaintext, with a certificate of another CA, or
# with no certificate at all is refused (exit 1, a message naming TLS) and
# the scheduler logs every refusal.
set -euo pipefail
R="$TEST_SRCDIR/$TEST_WORKSPACE"
T="$TEST_TMPDIR"
BIN="$T/bin"
mkdir -p "$BIN"
cp "$R/scheduler/scheduler_main" "$R/server/server_main" "$R/worker/trainer" "$BIN/"
PSCTL="$R/scheduler/psctl"

"$R/deploy/security/make_job_keys" "$T/keys" > "$T/snippet.txt"
"$R/deploy/security/make_job_keys" --tls_only "$T/other" > /dev/null
for f in ca.pem ca.key job.pem job.key curve.pub curve.key; do
  [ "$(stat -c %a "$T/keys/$f")" = "600" ] || { echo "$f is not mode 0600"; exit 1; }
done
grep -q "^security {" "$T/snippet.txt" && grep -q "curve {" "$T/snippet.txt" ||
  { echo "no config snippet:"; cat "$T/snippet.txt"; exit 1; }

CONFIG="$T/secure.pbtxt"
sed -e 's/num_train: 1000000/num_train: 200000/' \
    -e 's/num_test: 100000/num_test: 50000/' \
    "$R/examples/ctr/async.pbtxt" > "$CONFIG"
grep -v "^#" "$T/snippet.txt" >> "$CONFIG"
grep -q "num_train: 200000" "$CONFIG" || { echo "could not shrink the config"; exit 1; }

# --- Refusals, against a scheduler of the same config that waits for nodes.
"$BIN/scheduler_main" --config="$CONFIG" --port_file="$T/sched.port" > /dev/null 2> "$T/sched.log" &
SCHED=$!
trap 'kill $SCHED 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -s "$T/sched.port" ] && break; sleep 0.05; done
[ -s "$T/sched.port" ] || { echo "scheduler wrote no port:"; cat "$T/sched.log"; exit 1; }
ADDR="127.0.0.1:$(cat "$T/sched.port")"

"$PSCTL" --scheduler="$ADDR" --config="$CONFIG" status > "$T/ok.out" 2>&1 ||
  { echo "psctl with the job's certificate failed:"; cat "$T/ok.out"; exit 1; }
grep -q "^job: STARTING" "$T/ok.out" || { echo "no status:"; cat "$T/ok.out"; exit 1; }
"$PSCTL" --scheduler="$ADDR" --tls_ca="$T/keys/ca.pem" --tls_cert="$T/keys/job.pem" \
  --tls_key="$T/keys/job.key" status > /dev/null 2>&1 || { echo "psctl --tls_* failed"; exit 1; }

refused() {  # NAME ARGS...: psctl must exit 1 with a message naming TLS
  local name=$1; shift
  local rc=0
  "$PSCTL" --scheduler="$ADDR" --timeout_ms=3000 "$@" status > "$T/$name.out" 2>&1 || rc=$?
  [ $rc -eq 1 ] || { echo "$name: psctl exit $rc, want 1:"; cat "$T/$name.out"; exit 1; }
  grep -q "UNAVAILABLE" "$T/$name.out" && grep -qi "TLS" "$T/$name.out" ||
    { echo "$name: unclear message:"; cat "$T/$name.out"; exit 1; }
  echo "$name refused: $(grep -m1 "scheduler $ADDR" "$T/$name.out")"
}
before=$(grep -c "TLS handshake failed, peer refused" "$T/sched.log" || true)
# The scheduler refuses a plaintext client and one presenting a
# certificate of another CA (it trusts the job CA, so it gets as far as
# sending its certificate).
refused plaintext
grep -q "peer refused.*wrong version number" "$T/sched.log" ||
  { echo "plaintext refusal not logged:"; cat "$T/sched.log"; exit 1; }
refused other_cert --tls_ca="$T/keys/ca.pem" --tls_cert="$T/other/job.pem" --tls_key="$T/other/job.key"
grep -q "peer refused.*certificate verify failed" "$T/sched.log" ||
  { echo "other-CA client refusal not logged:"; cat "$T/sched.log"; exit 1; }
# A client wholly of another job refuses the scheduler's certificate itself.
refused other_ca --tls_ca="$T/other/ca.pem" --tls_cert="$T/other/job.pem" --tls_key="$T/other/job.key"
grep -q "certificate verify failed" "$T/other_ca.out" || { echo "unclear other_ca message"; exit 1; }
after=$(grep -c "TLS handshake failed, peer refused" "$T/sched.log" || true)
echo "scheduler logged $((after - before)) refusals:"
grep "peer refused" "$T/sched.log"
# A config whose key file is readable by everyone is refused at start.
cp "$T/keys/job.key" "$T/open.key"; chmod 0644 "$T/open.key"
sed "s|$T/keys/job.key|$T/open.key|" "$CONFIG" > "$T/open.pbtxt"
if "$BIN/scheduler_main" --config="$T/open.pbtxt" --describe > "$T/open.out" 2>&1; then
  echo "a world-readable key was accepted"; exit 1
fi
grep -q "readable by every user" "$T/open.out" || { echo "unclear:"; cat "$T/open.out"; exit 1; }
kill $SCHED; wait $SCHED 2>/dev/null || true
trap - EXIT

# --- The job trains with TLS and CURVE on.
OUT="$T/demo.out"
PS_BIN_DIR="$BIN" PS_RUN_DIR="$T/run" PS_DEMO_TIMEOUT=150 \
  bash "$R/deploy/local/demo.sh" "$CONFIG" > "$OUT" 2> "$T/demo.err" || {
  echo "job failed:"; cat "$T/demo.err"; exit 1; }
SUMMARY="$(tail -n 1 "$OUT")"
echo "summary: $SUMMARY"
field() { echo "$SUMMARY" | sed -n "s/.*\"$1\":\([^,}]*\).*/\1/p" | tr -d '"'; }
[ "$(field workers)" = "2" ] && [ "$(field servers)" = "2" ] || { echo "wrong counts"; exit 1; }
[ "$(field rank0_examples)" = "300000" ] || { echo "wrong example count"; exit 1; }
auc="$(field test_auc)"; oracle="$(field oracle_auc)"
gap=$(( $(printf '%.0f' "$(echo "$oracle" | tr -d .)") - $(printf '%.0f' "$(echo "$auc" | tr -d .)") ))
echo "AUC gap x 1e5: $gap"
[ "$gap" -lt 1000 ] || { echo "test AUC $auc is not within 0.01 of oracle $oracle"; exit 1; }
served=$(cat "$T"/run/*.log | grep -c "serving .* (CURVE)" || true)
[ "$served" -ge 2 ] || { echo "servers did not report CURVE ($served lines)"; exit 1; }
if grep -l "peer refused\|refused a data-plane connection" "$T"/run/*.log; then
  echo "a job process refused a peer"; exit 1
fi
echo PASS
