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
source "$TEST_SRCDIR/$TEST_WORKSPACE/tests/testing/test_lib.sh"
KEYS="$T/keys"
mkdir -p "$KEYS"
stage_binaries
"$R/deploy/security/curve_keygen" "$KEYS/curve.pub" "$KEYS/curve.key"
[ "$(stat -c %a "$KEYS/curve.key")" = "600" ] || fail "secret key file is not 0600"
[ "$(head -n 1 "$KEYS/curve.pub" | tr -d '\n' | wc -c)" = "40" ] || fail "public key is not 40 Z85 characters"

CONFIG="$T/curve.pbtxt"
shrink_config "$R/examples/ctr/async.pbtxt" "$CONFIG" 200000 50000 \
  's/^  num_workers: 2$/  num_workers: 2\n  replication: 2/'
cat >> "$CONFIG" <<CFG
security {
  curve {
    public_key_file: "$KEYS/curve.pub"
    secret_key_file: "$KEYS/curve.key"
  }
}
CFG
grep -q "replication: 2" "$CONFIG" || fail "could not rewrite the config"

SUMMARY="$(run_demo demo "$CONFIG" 150)"
echo "summary: $SUMMARY"
expect_ctr_summary "$SUMMARY"

# Both servers served CURVE, replication ran, nothing was refused.
ERR="$T/demo.err"
logs="$ERR $(find "$T/run-demo" -type f 2>/dev/null | tr '\n' ' ')"
served=$(cat $logs | grep -c "serving .* (CURVE)" || true)
[ "$served" -ge 2 ] || { cat "$ERR"; fail "servers did not report CURVE ($served lines)"; }
# Each server copied its slots to its backup over a CURVE link.
caught=$(cat $logs | grep -c "caught up with" || true)
[ "$caught" -ge 2 ] || fail "no catch-up between the servers ($caught lines)"
if cat $logs | grep -q "refused a data-plane connection"; then
  cat $logs | grep "refused a data-plane"; fail "a server refused a connection"
fi
echo PASS
