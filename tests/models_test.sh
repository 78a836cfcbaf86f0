#!/usr/bin/env bash
# End-to-end model quality, each job 1 scheduler,
# 2 servers and 2 workers as separate processes (deploy/local/demo.sh):
#   dlrm_vs_lr: on synthetic click data whose true model has pairwise
#     interactions, DLRM-lite beats logistic regression by >= 0.01 test AUC
#     (examples/ctr/{dlrm,lr_interactions}.pbtxt on a smaller data set).
#   fashion_mnist: the MLP of examples/fashion_mnist/mlp.pbtxt, 2 workers,
#     BSP, 3 epochs, reaches >= 0.85 test accuracy (measured: 0.866).
# Usage (Bazel passes one): models_test.sh dlrm_vs_lr|fashion_mnist
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
  *) echo "usage: models_test.sh dlrm_vs_lr|fashion_mnist" >&2; exit 2 ;;
esac
echo PASS
