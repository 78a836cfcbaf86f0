#!/usr/bin/env bash
# Builds and runs every test in the repository, then prints one line:
#   N passed, N failed
# counting individual test cases (gtest cases; one per shell test). A test
# target that failed without reporting its cases (did not build, crashed,
# timed out) counts as one failure. Exits non-zero when anything failed.
#
# Extra arguments go to `bazel test`, e.g. tests/run_all.sh --config=asan.
# Environment:
#   PS_BAZEL_OUTPUT_BASE  bazel's output base (a startup option, also given to
#                         `bazel info`): sanitizer builds use their own so the
#                         shared opt build is not invalidated, e.g.
#     PS_BAZEL_OUTPUT_BASE=$HOME/.cache/ps-asan-base tests/run_all.sh --config=asan
#   PS_TEST_EXCLUDE       test targets left out, separated by spaces.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# The job's packages and the test suite's (Chromium, Prometheus, Slurm, ...).
"$ROOT/deploy/install_deps.sh" --tests || { echo "0 passed, 1 failed"; exit 1; }

CONFIG_ARGS=("$@")
[ ${#CONFIG_ARGS[@]} -eq 0 ] && CONFIG_ARGS=(--config=opt)

BAZEL=(bazel)
[ -n "${PS_BAZEL_OUTPUT_BASE:-}" ] && BAZEL+=("--output_base=$PS_BAZEL_OUTPUT_BASE")
# Every package of the checkout, as //... would name them, but one top-level
# directory at a time: //... also walks the bazel-<directory name> symlink
# that another output base's build left in the checkout (a sanitizer run
# after the opt one; the name follows the clone's directory, so
# .bazelignore cannot list it), and fails on the Bazel packages it finds
# there. Excluding it with -//bazel-x/... still loads them.
TARGETS=()
[ -f BUILD ] && TARGETS+=("//:all")
for dir in */; do
  dir="${dir%/}"
  [ -L "$dir" ] && continue
  [ -n "$(find "$dir" \( -name BUILD -o -name BUILD.bazel \) -print -quit)" ] || continue
  TARGETS+=("//$dir/...")
done
for t in ${PS_TEST_EXCLUDE:-}; do TARGETS+=("-$t"); done

LOG="$(mktemp)"
trap 'rm -f "$LOG"' EXIT
"${BAZEL[@]}" test "${CONFIG_ARGS[@]}" --keep_going --noshow_progress -- "${TARGETS[@]}" 2>&1 | tee "$LOG"
bazel_status=${PIPESTATUS[0]}

passed=0
failed=0
skipped=0
TESTLOGS="$("${BAZEL[@]}" info "${CONFIG_ARGS[@]}" bazel-testlogs 2>/dev/null)"
# Lines like "//server:server_test    PASSED in 0.4s" or "(cached) PASSED".
while read -r target status; do
  xml="$TESTLOGS/$(echo "${target#//}" | tr ':' '/')/test.xml"
  t=0; f=0
  if [ -f "$xml" ]; then
    # gtest's <testsuites ...> carries the totals; pytest's (python/tests)
    # is a bare <testsuites> around one <testsuite ...>.
    head=$(grep -o '<testsuites [^>]*>\|<testsuite [^>]*>' "$xml" | head -n 1)
    t=$(echo "$head" | sed -n 's/.* tests="\([0-9]*\)".*/\1/p')
    f=$(echo "$head" | sed -n 's/.* failures="\([0-9]*\)".*/\1/p')
    e=$(echo "$head" | sed -n 's/.* errors="\([0-9]*\)".*/\1/p')
    t=${t:-0}; f=$(( ${f:-0} + ${e:-0} ))
    # Cases that skipped themselves (GPU tests without a GPU, torch tests
    # without torch) are neither passed nor failed: gtest marks them
    # result="skipped", pytest with a <skipped> element.
    s=$(( $(grep -o 'result="skipped"' "$xml" | wc -l) + $(grep -o '<skipped' "$xml" | wc -l) ))
    t=$((t - ${s:-0})); skipped=$((skipped + ${s:-0}))
  fi
  if [ "$status" = "PASSED" ]; then
    [ "$t" -eq 0 ] && t=1
    passed=$((passed + t - f)); failed=$((failed + f))
  else
    # Failed targets whose report shows no failing case still count as one.
    [ "$f" -eq 0 ] && f=1
    [ "$t" -lt "$f" ] && t=$f
    passed=$((passed + t - f)); failed=$((failed + f))
  fi
done < <(grep -E '^//[^ ]+ +(\(cached\) )?(PASSED|FAILED|TIMEOUT|NO STATUS|FLAKY|INCOMPLETE|FAILED TO BUILD)' "$LOG" \
          | sed -E 's/^(\/\/[^ ]+) +(\(cached\) )?([A-Z ]+[A-Z]).*/\1 \3/' | sed 's/ TO BUILD$/_TO_BUILD/; s/NO STATUS/NO_STATUS/')

if [ "$bazel_status" -ne 0 ] && [ "$failed" -eq 0 ]; then
  # The build itself failed before any test ran.
  failed=1
fi
[ "$skipped" -gt 0 ] && echo "$skipped skipped (see the test logs for why; GPU tests skip without a GPU)"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$bazel_status" -eq 0 ]
