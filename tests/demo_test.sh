#!/usr/bin/env bash
# Runs deploy/local/demo.sh on prebuilt binaries with a smaller data set and
# checks its JSON summary: the job must finish, every process must exit, and
# the model must come close to the oracle. Rank 0 also evaluates every 50
# steps into a metrics file, which must plot (deploy/plot/plot_metrics.sh).
# Then a job whose launch.worker_command parses its arguments strictly and
# writes no summary (tests/testing/strict_worker.py) must succeed too.
set -euo pipefail
source "$TEST_SRCDIR/$TEST_WORKSPACE/tests/testing/test_lib.sh"
stage_binaries
CONFIG="$T/small.pbtxt"
shrink_config "$R/examples/ctr/async.pbtxt" "$CONFIG" 200000 50000 \
  "s|^training {|training {\n  metrics_file: \"$T/metrics.jsonl\"\n  eval_interval_steps: 50|"

SUMMARY="$(run_demo demo "$CONFIG" 120)"
echo "summary: $SUMMARY"
expect_field "$SUMMARY" mode ASYNC "mode is not ASYNC"
expect_ctr_summary "$SUMMARY"
grep -q "progress\|epoch 1 done" "$T/demo.err" || fail "no progress lines shown"

# Rank 0 trains 3 epochs of 100000 examples in batches of 1024: 3 x 98 = 294
# steps. Evaluations at steps 50..250 and one after training, with examples
# and seconds growing.
METRICS="$T/metrics.jsonl"
lines=$(wc -l < "$METRICS")
[ "$lines" -eq 6 ] || { cat "$METRICS"; fail "metrics file has $lines lines, want 6"; }
steps="$(json_field_lines "$METRICS" step | tr '\n' ' ')"
[ "$steps" = "50 100 150 200 250 294 " ] || fail "steps: $steps"
examples="$(json_field_lines "$METRICS" examples)"
[ "$(echo "$examples" | tail -n 1)" = "300000" ] || fail "last examples: $(echo "$examples" | tail -n 1)"
seconds="$(json_field_lines "$METRICS" seconds)"
echo "$seconds" | sort -g -c || fail "seconds not growing: $(echo "$seconds" | tr '\n' ' ')"
bash "$R/deploy/plot/plot_metrics.sh" "$T/run.png" ASYNC="$METRICS" || fail "plot failed"
[ "$(head -c 4 "$T/run.png" | od -An -c | tr -d ' ')" = "211PNG" ] || fail "not a PNG"

# The launcher passes --config and --scheduler, nothing else, and the
# summary's path in PS_SUMMARY_OUT; workers that exit 0 without writing a
# summary make a job that succeeded.
STRICT="$T/strict.pbtxt"
shrink_config "$R/examples/ctr/async.pbtxt" "$STRICT" 40000 10000 \
  "\$a launch { worker_command: [\"python3\", \"$R/tests/testing/strict_worker.py\", \"--trainer\", \"$TRAINER\"] }"
run_demo strict "$STRICT" 120 >/dev/null
grep -q "strict_worker: .* PS_SUMMARY_OUT=$T/run-strict/summary.json" "$T/run-strict"/worker*.log ||
  fail "the worker command was not given PS_SUMMARY_OUT"
[ ! -e "$T/run-strict/summary.json" ] || fail "a summary was written"
grep -q "demo: finished .*no summary" "$T/strict.err" || fail "the demo did not say that no summary was written"
echo PASS
