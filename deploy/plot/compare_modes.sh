#!/usr/bin/env bash
# Trains the same sparse CTR job (examples/ctr) under ASYNC, BSP and SSP(2)
# one after the other on this machine, with rank 0 evaluating every
# EVAL_STEPS of its steps, and plots the three runs into one PNG.
#
#   deploy/plot/compare_modes.sh [OUT.png]     (default docs/consistency.png)
#
# Environment: EVAL_STEPS (default 100), PS_BIN_DIR (prebuilt binaries, as
# for deploy/local/demo.sh). Each run's logs and metrics file stay in
# .runs/compare-*/.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${1:-$ROOT/docs/consistency.png}"
EVAL_STEPS="${EVAL_STEPS:-100}"
[[ "$EVAL_STEPS" =~ ^[1-9][0-9]*$ ]] || { echo "compare_modes: EVAL_STEPS must be a positive integer" >&2; exit 2; }
RUNS="$ROOT/.runs/compare-$(date +%Y%m%d-%H%M%S)-$$"
mkdir -p "$RUNS"

series=()
for mode in async bsp ssp; do
  dir="$RUNS/$mode"; mkdir -p "$dir"
  config="$dir/job.pbtxt"
  # The example's config plus where to write metrics and how often to
  # evaluate (text format: the fields go inside the training block).
  sed "s|^training {|training {\n  metrics_file: \"$dir/metrics.jsonl\"\n  eval_interval_steps: $EVAL_STEPS|" \
    "$ROOT/examples/ctr/$mode.pbtxt" >"$config"
  grep -q metrics_file "$config" || { echo "compare_modes: no training block in $mode.pbtxt" >&2; exit 1; }
  echo "compare_modes: $mode ..." >&2
  PS_RUN_DIR="$dir/logs" "$ROOT/deploy/local/demo.sh" "$config" | tail -n 1 >"$dir/summary.json"
  cat "$dir/summary.json"
  label="$(echo "$mode" | tr a-z A-Z)"
  [ "$mode" = ssp ] && label="SSP($(sed -n 's/^ *staleness: *\([0-9]*\).*/\1/p' "$config" | head -n1))"
  series+=("$label=$dir/metrics.jsonl")
done

"$ROOT/deploy/plot/plot_metrics.sh" --title="examples/ctr: ASYNC vs BSP vs SSP, 2 servers, 2 workers" \
  "$OUT" "${series[@]}"
