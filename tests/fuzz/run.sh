#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) in a separate Bazel
# output base, so the shared gcc one is never switched to another compiler,
# and runs each for SECONDS from a writable copy of its seed corpus.
#
#   tests/fuzz/run.sh SECONDS [TARGET...]
#
# TARGET: wire_decoder, config, checkpoint_reader, data_readers (default:
# all). Prints per target the executions, coverage and any finding, then a
# JSON line per target; exits 1 if any target found something (a crash, a
# sanitizer report, a leak, a timeout, an out-of-memory or a broken
# invariant: its input is in the results directory), 2 on a usage or build
# error.
#
# Environment: PS_FUZZ_OUTPUT_BASE (default ~/.cache/ps-fuzz-bazel),
# PS_FUZZ_RESULTS (default /tmp/ps-fuzz-results-<UTC time>), PS_FUZZ_RSS_MB
# (default 2048), PS_FUZZ_ARGS (more libFuzzer flags).
set -u -o pipefail

ALL_TARGETS=(wire_decoder config checkpoint_reader data_readers)

if [[ $# -lt 1 || ! "$1" =~ ^[0-9]+$ || "$1" -eq 0 ]]; then
  echo "usage: $0 SECONDS [TARGET...]   (targets: ${ALL_TARGETS[*]})" >&2
  exit 2
fi
seconds=$1
shift
targets=("$@")
[[ ${#targets[@]} -eq 0 ]] && targets=("${ALL_TARGETS[@]}")
for t in "${targets[@]}"; do
  if [[ ! " ${ALL_TARGETS[*]} " =~ " $t " ]]; then
    echo "unknown target '$t' (targets: ${ALL_TARGETS[*]})" >&2
    exit 2
  fi
done

root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
output_base=${PS_FUZZ_OUTPUT_BASE:-$HOME/.cache/ps-fuzz-bazel}
results=${PS_FUZZ_RESULTS:-/tmp/ps-fuzz-results-$(date -u +%Y%m%dT%H%M%SZ)}
rss_mb=${PS_FUZZ_RSS_MB:-2048}

labels=()
for t in "${targets[@]}"; do labels+=("//tests/fuzz:${t}_fuzzer"); done
echo "building ${labels[*]} (clang, --config=fuzz, output base $output_base)"
if ! bazel --output_base="$output_base" build --config=fuzz --repo_env=CC=clang \
    "${labels[@]}" >"$results.build.log" 2>&1; then
  tail -40 "$results.build.log" >&2
  echo "fuzzer build failed (log: $results.build.log)" >&2
  exit 2
fi
bin_dir=$(bazel --output_base="$output_base" info --config=fuzz --repo_env=CC=clang \
  bazel-bin 2>/dev/null)
mkdir -p "$results"
mv "$results.build.log" "$results/build.log"

findings=0
json=()
for t in "${targets[@]}"; do
  dir="$results/$t"
  mkdir -p "$dir/corpus" "$dir/artifacts"
  cp -r "tests/fuzz/corpus/$t/." "$dir/corpus/"
  seeds=$(find "$dir/corpus" -type f | wc -l)
  echo "== $t: ${seconds}s from $seeds seeds"
  # shellcheck disable=SC2086
  "$bin_dir/tests/fuzz/${t}_fuzzer" -max_total_time="$seconds" -rss_limit_mb="$rss_mb" \
    -malloc_limit_mb="$rss_mb" -timeout=25 -print_final_stats=1 \
    -artifact_prefix="$dir/artifacts/" ${PS_FUZZ_ARGS:-} "$dir/corpus" >"$dir/log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$dir/log" | tail -1)
  covline=$(grep -E '^#[0-9]+.*cov: ' "$dir/log" | tail -1)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$covline")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$covline")
  units=$(sed -n 's/.* corp: \([0-9]*\)\/.*/\1/p' <<<"$covline")
  artifact=$(find "$dir/artifacts" -type f | head -1)
  finding=""
  if [[ $rc -ne 0 || -n "$artifact" ]]; then
    findings=$((findings + 1))
    finding=${artifact:-"exit status $rc, see $dir/log"}
    grep -m1 -E 'ERROR: (AddressSanitizer|UndefinedBehaviorSanitizer|LeakSanitizer|libFuzzer)|runtime error|FUZZ INVARIANT' \
      "$dir/log" || true
  fi
  echo "   executions ${execs:-?} (${rate:-?}/s), coverage cov ${cov:-?} ft ${ft:-?}," \
    "corpus ${units:-?} units, finding: ${finding:-none}"
  json+=("{\"target\":\"$t\",\"seconds\":$seconds,\"executions\":${execs:-0},\"exec_per_sec\":${rate:-0},\"cov\":${cov:-0},\"ft\":${ft:-0},\"corpus_units\":${units:-0},\"seeds\":$seeds,\"exit_status\":$rc,\"finding\":$( [[ -n "$finding" ]] && printf '"%s"' "$finding" || echo null)}")
done
for line in "${json[@]}"; do echo "$line"; done
echo "results: $results"
[[ $findings -eq 0 ]] || exit 1
