#!/usr/bin/env bash
# Training from files, end to end: make_data writes a
# Criteo-format data set (3 training files) and a libsvm one, each with
# malformed lines; 2 workers train on each (1 scheduler, 2 servers, 2
# workers as processes); every malformed line must be reported with its
# file and line number, and the job must still finish. The Criteo job
# exports its model; `predict` must score the test file with exactly the
# job's test AUC, and refuse a corrupted model file with a clear error.
set -euo pipefail
source "$TEST_SRCDIR/$TEST_WORKSPACE/tests/testing/test_lib.sh"
stage_binaries
MAKE_DATA="$R/examples/ctr/make_data"
PREDICT="$R/worker/predict"

# job NAME FORMAT MODEL SPARSE_DIM: trains on $T/NAME.* and prints the summary.
job() {
  local name="$1" format="$2" model="$3" dim="$4"
  cat > "$T/$name.pbtxt" <<CONFIG
cluster { num_servers: 2 num_workers: 2 }
consistency { mode: ASYNC }
tables { id: 0 name: "sparse" sparse { dim: $dim }
         optimizer { adagrad { learning_rate: 0.05 initial_accumulator: 1e-6 } } }
tables { id: 1 name: "dense" dense { size: 0 }
         optimizer { adagrad { learning_rate: 0.05 initial_accumulator: 1e-6 } } }
data { files { format: $format train_files: "$T/$name.train*.txt"
               test_files: "$T/$name.test.txt" } }
training { batch_size: 256 epochs: 1 sparse_table: "sparse" dense_table: "dense"
           export_path: "$T/$name.model" metrics_file: "$T/$name.metrics"
           model { $model } }
CONFIG
  run_demo "$name" "$T/$name.pbtxt" 120
}

# check_bad_lines NAME: every bad line make_data reported is named in a
# worker's log, and the workers' counts add up.
check_bad_lines() {
  local name="$1" expected
  expected=$(grep -c "make_data: bad line" "$T/$name.gen")
  [ "$expected" -gt 0 ] || fail "$name: make_data wrote no bad lines"
  while read -r _ _ _ where _; do
    where="${where%:}"
    grep -q "$where: " "$T"/run-"$name"/worker*.log || fail "$name: bad line $where not reported"
  done < <(grep "make_data: bad line" "$T/$name.gen")
  local counted
  counted=$(grep -ho "skipped [0-9]* malformed" "$T"/run-"$name"/worker*.log |
            awk '{ s += $2 } END { print s + 0 }')
  [ "$counted" -eq "$expected" ] || fail "$name: workers counted $counted bad lines, expected $expected"
  echo "$name: all $expected bad lines reported with file:line"
}

"$MAKE_DATA" --format=criteo --out_prefix="$T/criteo" --num_train=60000 --num_test=20000 \
  --shards=3 --bad_lines=12 --missing_rate=0.05 --interaction_rank=4 2> "$T/criteo.gen"
summary="$(job criteo CRITEO "kind: FM embedding_dim: 4" 5)"
echo "criteo: $summary"
check_bad_lines criteo
auc="$(json_field "$summary" test_auc)"
check "$auc > 0.6" "criteo: test AUC $auc: the model did not learn"
[ -s "$T/criteo.metrics" ] || fail "criteo: no metrics file"

# The exported model scores the test file exactly as the job's evaluation did.
"$PREDICT" --model="$T/criteo.model" --data="$T/criteo.test.txt" --out="$T/scores.txt" \
  > "$T/predict.out"
cat "$T/predict.out"
[ "$(wc -l < "$T/scores.txt")" -eq 20000 ] || fail "predict wrote $(wc -l < "$T/scores.txt") scores"
expect_field "$(cat "$T/predict.out")" auc "$auc" "predict AUC differs from the job's $auc"
# A corrupted model is refused, naming the problem.
cp "$T/criteo.model" "$T/bad.model"
printf 'xx' | dd of="$T/bad.model" bs=1 seek=100 conv=notrunc 2>/dev/null
if "$PREDICT" --model="$T/bad.model" --data="$T/criteo.test.txt" 2> "$T/bad.err"; then
  fail "predict accepted a corrupted model"
fi
grep -q "checksum mismatch\|corrupt" "$T/bad.err" || { cat "$T/bad.err"; fail "no clear error for a corrupted model"; }

"$MAKE_DATA" --format=libsvm --out_prefix="$T/libsvm" --num_train=40000 --num_test=10000 \
  --bad_lines=8 2> "$T/libsvm.gen"
summary="$(job libsvm LIBSVM "kind: LR" 1)"
echo "libsvm: $summary"
check_bad_lines libsvm
auc="$(json_field "$summary" test_auc)"
check "$auc > 0.6" "libsvm: test AUC $auc: the model did not learn"
echo PASS
