#!/usr/bin/env bash
# End-to-end model quality, each job 1 scheduler,
# 2 servers and 2 workers as separate processes (deploy/local/demo.sh):
#   dlrm_vs_lr: on synthetic click data whose true model has pairwise
#     interactions, DLRM-lite beats logistic regression by >= 0.01 test AUC
#     (examples/ctr/{dlrm,lr_interactions}.pbtxt on a smaller data set).
#   fashion_mnist: the MLP of examples/fashion_mnist/mlp.pbtxt, 2 workers,
#     BSP, 3 epochs, reaches >= 0.85 test accuracy (measured: 0.866).
#   tiered: examples/ctr/tiered.pbtxt (an FM whose embeddings far outgrow
#     each server's memory budget, the rest on the disk tier) reaches the
#     test AUC of the same job without a budget within 0.001 (BSP: the same
#     parameters, so in practice the same AUC); the same budget without a
#     disk tier, which drops rows, is reported beside them.
# Usage (Bazel passes one): models_test.sh dlrm_vs_lr|fashion_mnist|tiered
set -euo pipefail
source "$TEST_SRCDIR/$TEST_WORKSPACE/tests/testing/test_lib.sh"
stage_binaries
# The CUDA backend next to the trainer, where the trainer looks for it.
cp "$R/worker/compute/libps_cuda.so" "$BIN/" 2>/dev/null || true

case "${1:-}" in
  dlrm_vs_lr)
    declare -A AUC
    for name in lr_interactions dlrm; do
      config="$T/$name.pbtxt"
      shrink_config "$R/examples/ctr/$name.pbtxt" "$config" 400000 50000
      summary="$(run_demo "$name" "$config" 240)"
      echo "$name: $summary"
      AUC[$name]="$(json_field "$summary" test_auc)"
    done
    lr=${AUC[lr_interactions]}; dlrm=${AUC[dlrm]}
    awk -v d="$dlrm" -v l="$lr" 'BEGIN { printf "DLRM - LR: %.5f\n", d - l }'
    check "$dlrm - $lr >= 0.01" "DLRM's test AUC $dlrm does not beat LR's $lr by 0.01"
    ;;
  fashion_mnist)
    config="$T/mlp.pbtxt"
    sed -e 's/epochs: 4/epochs: 3/' -e 's/eval_interval_steps: 500/eval_interval_steps: 0/' \
      "$R/examples/fashion_mnist/mlp.pbtxt" > "$config"
    grep -q "epochs: 3" "$config" || fail "could not change mlp.pbtxt"
    summary="$(run_demo mlp "$config" 240)"
    echo "mlp: $summary"
    expect_field "$summary" mode BSP "did not run BSP"
    expect_field "$summary" workers 2 "not 2 workers"
    acc="$(json_field "$summary" test_accuracy)"
    check "$acc >= 0.85" "test accuracy $acc is below 0.85"
    ;;
  tiered)
    declare -A AUC
    src="$R/examples/ctr/tiered.pbtxt"
    tier="s|dir: \"/var/tmp/ps-tier\"|dir: \"$T/tier\" buffered_io: true|"
    # The table's sparse block without the budget (unbounded), and with the
    # budget but no disk tier (rows dropped).
    unbounded='/^  sparse {$/,/^  }$/c\  sparse { dim: 9 admit_after_pushes: 1 }'
    dropping='/^  sparse {$/,/^  }$/c\  sparse { dim: 9 admit_after_pushes: 1 memory_budget_bytes: 2097152 eviction: EVICT_LFU }'
    shrink_config "$src" "$T/tiered.pbtxt" 150000 30000 "$tier" \
      "s/num_train: 300000/num_train: 150000/" "s/num_test: 50000/num_test: 30000/"
    for name in unbounded dropping; do
      sed -e "s/num_train: 300000/num_train: 150000/" -e "s/num_test: 50000/num_test: 30000/" \
        -e "${!name}" "$src" > "$T/$name.pbtxt"
      grep -q disk_tier "$T/$name.pbtxt" && fail "could not take the disk tier out of $name"
    done
    grep -q "$T/tier" "$T/tiered.pbtxt" || fail "could not move the disk tier to $T"
    for name in tiered unbounded dropping; do
      summary="$(run_demo "$name" "$T/$name.pbtxt" 300)"
      echo "$name: $summary"
      AUC[$name]="$(json_field "$summary" test_auc)"
    done
    grep -h "disk tier:" "$T/run-tiered"/server*.log
    grep -q "disk tier: [1-9][0-9]* cold rows" "$T/run-tiered"/server*.log ||
      fail "the tiered job's servers kept no rows on disk"
    t=${AUC[tiered]}; u=${AUC[unbounded]}; d=${AUC[dropping]}
    awk -v t="$t" -v u="$u" -v d="$d" \
      'BEGIN { printf "test AUC: tiered %.5f, unbounded %.5f, dropping rows %.5f\n", t, u, d }'
    check "$t - $u <= 0.001 && $u - $t <= 0.001" \
      "the tiered job's test AUC $t is not within 0.001 of the unbounded job's $u"
    ;;
  *) echo "usage: models_test.sh dlrm_vs_lr|fashion_mnist|tiered" >&2; exit 2 ;;
esac
echo PASS
