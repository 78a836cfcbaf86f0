#!/usr/bin/env bash
# The sparse table's four row loops (pull and push, looking keys up and
# through row memos) must keep their software prefetches in the compiled
# code. They are invisible to every functional test: GCC once deleted the
# memo loops' prefetches (they sat in lambdas it judged free of side
# effects), which halved a 4 GiB table's memo pull (0.54 of the gather limit
# against 0.96) while every result stayed right.
#
#   server/table_prefetch_test.sh FILE...   (object files, archives or
#   shared objects that hold the table's code; their listings are joined)
set -euo pipefail

[ $# -gt 0 ] || { echo "usage: table_prefetch_test.sh FILE..." >&2; exit 2; }
if [ "$(uname -m)" != x86_64 ]; then
  echo "table_prefetch_test: not x86-64 ($(uname -m)); prefetch opcodes differ, skipped"
  exit 0
fi
if ! command -v objdump >/dev/null; then
  echo "table_prefetch_test: objdump (binutils) is missing" >&2
  exit 1
fi

listing=$(mktemp)
trap 'rm -f "$listing"' EXIT
objdump -d --no-show-raw-insn -C "$@" > "$listing"

failed=0
for fn in PullLookingUp PullRemembered PushLookingUp PushRemembered; do
  # Prefetch instructions between the function's label and the next label.
  count=$(awk -v name="ps::SparseTable::${fn}(" '
    /^[0-9a-f]+ </ { inside = index($0, name) > 0 }
    inside && /prefetch/ { n++ }
    END { print n + 0 }' "$listing")
  if ! grep -q "<ps::SparseTable::${fn}(" "$listing"; then
    echo "FAIL: ps::SparseTable::${fn} is not in $* (inlined or renamed?)"
    failed=1
  elif [ "$count" -eq 0 ]; then
    echo "FAIL: ps::SparseTable::${fn} has no prefetch instruction"
    failed=1
  else
    echo "ok: ps::SparseTable::${fn}: ${count} prefetch instructions"
  fi
done
exit "$failed"
