#!/usr/bin/env bash
# Runs deploy/local/demo.sh on prebuilt binaries with a smaller data set and
# checks its JSON summary: the job must finish, every process must exit, and
# the model must come close to the oracle. Rank 0 also evaluates every 50
# steps into a metrics file, which must plot (deploy/plot/plot_metrics.sh).
set -euo pipefail
R="$TEST_SRCDIR/$TEST_WORKSPACE"
BIN="$TEST_TMPDIR/bin"
mkdir -p "$BIN"
cp "$R/scheduler/scheduler_main" "$R/server/server_main" "$R/worker/trainer" "$BIN/"
CONFIG="$TEST_TMPDIR/small.pbtxt"
sed -e 's/num_train: 1000000/num_train: 200000/' \
    -e 's/num_test: 100000/num_test: 50000/' \
    -e "s|^training {|training {\n  metrics_file: \"$TEST_TMPDIR/metrics.jsonl\"\n  eval_interval_steps: 50|" \
    "$R/examples/ctr/async.pbtxt" > "$CONFIG"
grep -q "num_train: 200000" "$CONFIG" || { echo "could not shrink the config"; exit 1; }

OUT="$TEST_TMPDIR/demo.out"
PS_BIN_DIR="$BIN" PS_RUN_DIR="$TEST_TMPDIR/run" PS_DEMO_TIMEOUT=120 \
  bash "$R/deploy/local/demo.sh" "$CONFIG" > "$OUT" 2> "$TEST_TMPDIR/demo.err" || {
  echo "demo failed:"; cat "$TEST_TMPDIR/demo.err"; exit 1; }
SUMMARY="$(tail -n 1 "$OUT")"
echo "summary: $SUMMARY"

field() { echo "$SUMMARY" | sed -n "s/.*\"$1\":\([^,}]*\).*/\1/p" | tr -d '"'; }
[ "$(field mode)" = "ASYNC" ] || { echo "mode is not ASYNC"; exit 1; }
[ "$(field workers)" = "2" ] && [ "$(field servers)" = "2" ] || { echo "wrong counts"; exit 1; }
[ "$(field rank0_examples)" = "300000" ] || { echo "wrong example count"; exit 1; }
auc="$(field test_auc)"; oracle="$(field oracle_auc)"
# Integer arithmetic on AUC x 100000: the gap must be under 0.01.
gap=$(( $(printf '%.0f' "$(echo "$oracle" | tr -d .)") - $(printf '%.0f' "$(echo "$auc" | tr -d .)") ))
echo "AUC gap x 1e5: $gap"
[ "$gap" -lt 1000 ] || { echo "test AUC $auc is not within 0.01 of oracle $oracle"; exit 1; }
grep -q "progress\|epoch 1 done" "$TEST_TMPDIR/demo.err" || { echo "no progress lines shown"; exit 1; }

# Rank 0 trains 3 epochs of 100000 examples in batches of 1024: 3 x 98 = 294
# steps. Evaluations at steps 50..250 and one after training, with examples
# and seconds growing.
METRICS="$TEST_TMPDIR/metrics.jsonl"
lines=$(wc -l < "$METRICS")
[ "$lines" -eq 6 ] || { echo "metrics file has $lines lines, want 6:"; cat "$METRICS"; exit 1; }
mfield() { sed -n "s/.*\"$1\":\([^,}]*\).*/\1/p" "$METRICS"; }
[ "$(mfield step | tr '\n' ' ')" = "50 100 150 200 250 294 " ] || { echo "steps: $(mfield step | tr '\n' ' ')"; exit 1; }
[ "$(mfield examples | tail -n 1)" = "300000" ] || { echo "last examples: $(mfield examples | tail -n 1)"; exit 1; }
mfield seconds | sort -g -c || { echo "seconds not growing: $(mfield seconds | tr '\n' ' ')"; exit 1; }
bash "$R/deploy/plot/plot_metrics.sh" "$TEST_TMPDIR/run.png" ASYNC="$METRICS" || { echo "plot failed"; exit 1; }
[ "$(head -c 4 "$TEST_TMPDIR/run.png" | od -An -c | tr -d ' ')" = "211PNG" ] || { echo "not a PNG"; exit 1; }
echo PASS
