#!/usr/bin/env bash
# Runs make_data on tiny configs in both formats and checks line counts,
# column counts, that the reported bad lines are exactly the malformed ones,
# that output is deterministic, that shards concatenate to the single file,
# and that bad flags and unwritable paths fail with a message.
set -euo pipefail
MAKE_DATA="$TEST_SRCDIR/$TEST_WORKSPACE/examples/ctr/make_data"
T="$TEST_TMPDIR"

fail() { echo "FAIL: $*" >&2; exit 1; }

# Line numbers (FILE:LINE) that make_data reported as bad, sorted.
reported() { sed -n 's/^make_data: bad line \([^ ]*\): .*$/\1/p' "$1" | sort; }

# --- Criteo -----------------------------------------------------------------
"$MAKE_DATA" --out_prefix="$T/c" --num_train=300 --num_test=50 --bad_lines=8 \
  --missing_rate=0.2 --interaction_rank=8 2> "$T/c.err" || {
  cat "$T/c.err" >&2; fail "criteo run"; }
[ "$(wc -l < "$T/c.train.txt")" -eq 308 ] || fail "criteo train lines"
[ "$(wc -l < "$T/c.test.txt")" -eq 50 ] || fail "criteo test lines"
# A well-formed line: 40 tab-separated columns, label 0/1, 13 integers, 26
# empty-or-8-hex-digit categoricals. Prints FILE:LINE of every other line.
criteo_bad() {
  awk -F'\t' -v f="$1" '{
    ok = NF == 40 && $1 ~ /^[01]$/
    for (i = 2; ok && i <= 14; ++i) ok = $i ~ /^[0-9]+$/
    for (i = 15; ok && i <= 40; ++i) ok = $i ~ /^([0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f])?$/
    if (!ok) print f ":" NR
  }' "$1"
}
criteo_bad "$T/c.train.txt" | sort > "$T/c.bad"
reported "$T/c.err" > "$T/c.reported"
[ "$(wc -l < "$T/c.reported")" -eq 8 ] || fail "criteo: 8 bad lines reported"
diff "$T/c.bad" "$T/c.reported" || fail "criteo: reported bad lines differ"
[ -z "$(criteo_bad "$T/c.test.txt")" ] || fail "criteo: malformed test line"
# Every kind was reported, column counts are 40 except the short line.
for kind in "wrong column count" "bad hex" "bad label" "non-numeric integer"; do
  grep -q ": $kind\$" "$T/c.err" || fail "criteo: no '$kind' line"
done
[ "$(awk -F'\t' 'NF != 40' "$T/c.train.txt" | wc -l)" -eq 2 ] \
  || fail "criteo: expected 2 short lines"
# Missing categoricals appear (rate 0.2), both labels appear.
grep -qP '\t\t|\t$' "$T/c.test.txt" || fail "criteo: no empty categorical"
cut -f1 "$T/c.test.txt" | sort -u | tr -d '\n' | grep -qx '01' \
  || fail "criteo: labels are not 0 and 1"
# Deterministic.
"$MAKE_DATA" --out_prefix="$T/c2" --num_train=300 --num_test=50 \
  --bad_lines=8 --missing_rate=0.2 --interaction_rank=8 2> /dev/null
cmp "$T/c.train.txt" "$T/c2.train.txt" || fail "criteo train not deterministic"
cmp "$T/c.test.txt" "$T/c2.test.txt" || fail "criteo test not deterministic"

# --- libsvm, sharded --------------------------------------------------------
"$MAKE_DATA" --format=libsvm --out_prefix="$T/l" --num_train=301 \
  --num_test=40 --bad_lines=7 --shards=3 2> "$T/l.err" || {
  cat "$T/l.err" >&2; fail "libsvm run"; }
total=0
for i in 0 1 2; do
  f="$T/l.train-0000$i-of-00003.txt"
  [ -f "$f" ] || fail "missing shard $f"
  n=$(wc -l < "$f")
  [ "$n" -eq 102 ] || [ "$n" -eq 103 ] || fail "shard $i has $n lines"
  total=$((total + n))
done
[ "$total" -eq 308 ] || fail "libsvm: $total train lines"
[ "$(wc -l < "$T/l.test.txt")" -eq 40 ] || fail "libsvm test lines"
# A well-formed line: label 0/1, then 13 numeric and 26 categorical
# index:value tokens with ascending indices.
libsvm_bad() {
  awk -v f="$1" '{
    ok = $1 ~ /^[01]$/ && NF == 40
    prev = -1
    for (i = 2; ok && i <= NF; ++i) {
      ok = $i ~ /^[0-9]+:[-+0-9.eE]+$/
      split($i, kv, ":")
      if (ok) { ok = kv[1] + 0 > prev; prev = kv[1] + 0 }
    }
    if (!ok) print f ":" NR
  }' "$1"
}
for i in 0 1 2; do libsvm_bad "$T/l.train-0000$i-of-00003.txt"; done \
  | sort > "$T/l.bad"
reported "$T/l.err" > "$T/l.reported"
[ "$(wc -l < "$T/l.reported")" -eq 7 ] || fail "libsvm: 7 bad lines reported"
diff "$T/l.bad" "$T/l.reported" || fail "libsvm: reported bad lines differ"
[ -z "$(libsvm_bad "$T/l.test.txt")" ] || fail "libsvm: malformed test line"
# The shards are the single-file output cut in three.
"$MAKE_DATA" --format=libsvm --out_prefix="$T/l1" --num_train=301 \
  --num_test=40 --bad_lines=7 2> /dev/null
cat "$T"/l.train-0000[012]-of-00003.txt | cmp - "$T/l1.train.txt" \
  || fail "shards do not concatenate to the single file"

# --- Errors -----------------------------------------------------------------
expect_error() {
  local want="$1"; shift
  if "$MAKE_DATA" "$@" 2> "$T/e.err"; then fail "accepted: $*"; fi
  grep -qe "$want" "$T/e.err" || { cat "$T/e.err" >&2; fail "message for: $*"; }
}
expect_error "--format" --out_prefix="$T/e" --format=csv --num_train=5
expect_error "--out_prefix" --num_train=5
expect_error "26 categorical" --out_prefix="$T/e" --num_categorical=5
expect_error "--shards" --out_prefix="$T/e" --shards=0 --num_train=5
expect_error "--missing_rate" --out_prefix="$T/e" --missing_rate=2 \
  --num_train=5
expect_error "interaction_rank" --out_prefix="$T/e" --interaction_rank=65 \
  --num_train=5
expect_error "cannot open" --out_prefix="$T/no/such/dir/x" --num_train=5
echo PASS
