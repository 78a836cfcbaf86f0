#!/usr/bin/env bash
# Tests deploy/plot/plot_metrics.sh on hand-written metrics files: a PNG of
# the right size comes out for two runs, and unusable input is refused with
# exit status 2 and no PNG.
set -uo pipefail

PLOT="$(dirname "$0")/plot_metrics.sh"
[ -x "$PLOT" ] || PLOT="$TEST_SRCDIR/$TEST_WORKSPACE/deploy/plot/plot_metrics.sh"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# Lines as worker/trainer.cc writes them, deliberately out of time order
# and with one line of a run that had no test data (null metrics).
cat >"$TMP/async.jsonl" <<'J'
{"step":200,"rank":0,"examples":204800,"time":1700000002.0,"seconds":2.0,"train_loss":0.37,"test_examples":1000,"test_auc":0.86,"test_logloss":0.36,"test_accuracy":0.83}
{"step":100,"rank":0,"examples":102400,"time":1700000001.0,"seconds":1.0,"train_loss":0.38,"test_examples":1000,"test_auc":0.85,"test_logloss":0.37,"test_accuracy":0.82}
{"step":300,"rank":0,"examples":307200,"time":1700000003.0,"seconds":3.0,"train_loss":0.36,"test_examples":1000,"test_auc":0.87,"test_logloss":0.35,"test_accuracy":0.84}
J
cat >"$TMP/bsp.jsonl" <<'J'
{"step":100,"rank":0,"examples":102400,"time":1700000001.5,"seconds":1.5,"train_loss":0.39,"test_examples":1000,"test_auc":0.84,"test_logloss":0.38,"test_accuracy":0.81}
{"step":200,"rank":0,"examples":204800,"time":1700000003.1,"seconds":3.1,"train_loss":null,"test_examples":1000,"test_auc":0.86,"test_logloss":0.36,"test_accuracy":0.83}
J
cat >"$TMP/empty.jsonl" <<'J'
{"step":100,"rank":0,"examples":102400,"time":1.0,"seconds":1.0,"train_loss":0.3,"test_examples":0,"test_auc":null,"test_logloss":null,"test_accuracy":null}
J

out="$TMP/two.png"
if ! "$PLOT" --title="two runs" "$out" ASYNC="$TMP/async.jsonl" "$TMP/bsp.jsonl" 2>"$TMP/err"; then
  fail "two runs: exit $? ($(cat "$TMP/err"))"
fi
if [ -f "$out" ]; then
  magic="$(head -c 8 "$out" | od -An -tx1 | tr -d ' \n')"
  [ "$magic" = "89504e470d0a1a0a" ] || fail "not a PNG (magic $magic)"
  # 1400x900, big enough to hold four plotted panels rather than an
  # empty canvas (an empty 1400x900 pngcairo image is about 10 KB).
  w=$((16#$(od -An -tx1 -j16 -N4 "$out" | tr -d ' \n')))
  h=$((16#$(od -An -tx1 -j20 -N4 "$out" | tr -d ' \n')))
  [ "$w" -eq 1400 ] && [ "$h" -eq 900 ] || fail "size ${w}x${h}, want 1400x900"
  size=$(stat -c %s "$out")
  [ "$size" -gt 40000 ] || fail "PNG only $size bytes: panels missing?"
else
  fail "no PNG written"
fi
grep -q "wrote $out (2 runs)" "$TMP/err" || fail "no 'wrote' line: $(cat "$TMP/err")"

expect_usage_error() {
  local what="$1"; shift
  rm -f "$TMP/bad.png"
  "$PLOT" "$TMP/bad.png" "$@" 2>"$TMP/err"
  local status=$?
  [ $status -eq 2 ] || fail "$what: exit $status, want 2"
  [ ! -f "$TMP/bad.png" ] || fail "$what: a PNG was written"
}
expect_usage_error "only null metrics" "$TMP/empty.jsonl"
grep -q "no evaluation with test metrics" "$TMP/err" || fail "null metrics: message $(cat "$TMP/err")"
expect_usage_error "missing file" "$TMP/nonexistent.jsonl"
grep -q "cannot read" "$TMP/err" || fail "missing file: message $(cat "$TMP/err")"
"$PLOT" 2>/dev/null; [ $? -eq 2 ] || fail "no arguments: want exit 2"

[ $failures -eq 0 ] && echo "PASS" || { echo "$failures failure(s)"; exit 1; }
