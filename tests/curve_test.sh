#!/usr/bin/env bash
# A real job with CURVE on the data plane: the CTR example (scheduler, 2
# servers with replication 2, 2 workers, separate processes) with
# security.curve naming a key pair made by //deploy/security:curve_keygen.
# Workers reach the servers and primaries forward to their backups only
# through CURVE with the job key pair (a plaintext link would be refused and
# the job would not finish). The job must train to its normal summary
# (every example once, AUC near the oracle), the servers must say they
# serve CURVE, and no server may have refused a connection.
set -euo pipefail
R="$TEST_SRCDIR/$TEST_WORKSPACE"
BIN="$TEST_TMPDIR/bin"
KEYS="$TEST_TMPDIR/keys"
mkdir -p "$BIN" "$KEYS"
cp "$R/scheduler/scheduler_main" "$R/server/server_main" "$R/worker/trainer" "$BIN/"
"$R/deploy/security/curve_keygen" "$KEYS/curve.pub" "$KEYS/curve.key"
[ "$(stat -c %a "$KEYS/curve.key")" = "600" ] || { echo "secret key file is not 0600"; exit 1; }
[ "$(head -n 1 "$KEYS/curve.pub" | tr -d '\n' | wc -c)" = "40" ] || { echo "public key is not 40 Z85 characters"; exit 1; }

CONFIG="$TEST_TMPDIR/curve.pbtxt"
sed -e 's/num_train: 1000000/num_train: 200000/' \
    -e 's/num_test: 100000/num_test: 50000/' \
    -e 's/^  num_workers: 2$/  num_workers: 2\n  replication: 2/' \
    "$R/examples/ctr/async.pbtxt" > "$CONFIG"
cat >> "$CONFIG" <<CFG
security {
  curve {
    public_key_file: "$KEYS/curve.pub"
    secret_key_file: "$KEYS/curve.key"
  }
}
CFG
grep -q "num_train: 200000" "$CONFIG" && grep -q "replication: 2" "$CONFIG" ||
  { echo "could not rewrite the config"; exit 1; }

OUT="$TEST_TMPDIR/demo.out"
ERR="$TEST_TMPDIR/demo.err"
PS_BIN_DIR="$BIN" PS_RUN_DIR="$TEST_TMPDIR/run" PS_DEMO_TIMEOUT=150 \
  bash "$R/deploy/local/demo.sh" "$CONFIG" > "$OUT" 2> "$ERR" || {
  echo "job failed:"; cat "$ERR"; exit 1; }
SUMMARY="$(tail -n 1 "$OUT")"
echo "summary: $SUMMARY"

field() { echo "$SUMMARY" | sed -n "s/.*\"$1\":\([^,}]*\).*/\1/p" | tr -d '"'; }
[ "$(field workers)" = "2" ] && [ "$(field servers)" = "2" ] || { echo "wrong counts"; exit 1; }
[ "$(field rank0_examples)" = "300000" ] || { echo "wrong example count"; exit 1; }
auc="$(field test_auc)"; oracle="$(field oracle_auc)"
gap=$(( $(printf '%.0f' "$(echo "$oracle" | tr -d .)") - $(printf '%.0f' "$(echo "$auc" | tr -d .)") ))
echo "AUC gap x 1e5: $gap"
[ "$gap" -lt 1000 ] || { echo "test AUC $auc is not within 0.01 of oracle $oracle"; exit 1; }

# Both servers served CURVE, replication ran, nothing was refused.
logs="$ERR $(find "$TEST_TMPDIR/run" -type f 2>/dev/null | tr '\n' ' ')"
served=$(cat $logs | grep -c "serving .* (CURVE)" || true)
[ "$served" -ge 2 ] || { echo "servers did not report CURVE ($served lines)"; cat "$ERR"; exit 1; }
# Each server copied its slots to its backup over a CURVE link.
caught=$(cat $logs | grep -c "caught up with" || true)
[ "$caught" -ge 2 ] || { echo "no catch-up between the servers ($caught lines)"; exit 1; }
if cat $logs | grep -q "refused a data-plane connection"; then
  echo "a server refused a connection:"; cat $logs | grep "refused a data-plane"; exit 1
fi
echo PASS
