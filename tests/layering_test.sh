#!/bin/bash
# Layering test: the #include lines of the checkout follow the package
# layering (docs/design.md; design review 2026-11, section 1.2):
#
#   common/      base and protocol code: includes no role folder at all
#   checkpoint/  the checkpoint format and catalog both planes use
#   scheduler/   control plane        server/  data plane
#   worker/      client library and trainer apps
#   python/      the Python binding of the worker side
#   examples/    leaves: nothing outside examples/ includes them
#
# Rules (importing folder -> included prefix):
#   R1 scheduler/, worker/, common/, checkpoint/, python/ -> no "server/..."
#   R2 server/, scheduler/, common/, checkpoint/           -> no "worker/..."
#   R3 server/, worker/, common/, checkpoint/              -> no "scheduler/..."
#      except the scheduler client library (ALLOWED_SCHEDULER_HEADERS)
#   R4 anything outside examples/                          -> no "examples/..."
#   R5 common/ -> no role folder (server/ worker/ scheduler/ checkpoint/
#      deploy/ python/ tests/ examples/)
#   R0 no include path starts with ./ or ../ (paths are workspace-relative,
#      and a relative one would slip past the rules above)
#   R6 every file, tests included -> no "absl/status/status.h" or
#      "absl/status/statusor.h" except common/status.h: code includes
#      common/status.h, whose [[nodiscard]] redeclarations make a dropped
#      Status a warning (an error in the clang build)
#
# Exempt: integration tests, which start a scheduler, servers and workers
# in one process and so need every role: everything under tests/, any
# */testing/ folder (shared harnesses), and files named *_test.cc/*_test.h.
# The rules hold for all other files, including headers, whatever BUILD
# says (Bazel refuses cycles, but not an edge that points the wrong way).
#
# Usage:
#   tests/layering_test.sh [ROOT]   checks the checkout at ROOT (default: the
#                                   one this script lives in), then proves
#                                   the check can fail (self-test)
# As a Bazel test (//tests:layering_test) it finds the checkout it was built
# from through the runfile of this script. It reads the source tree, not
# declared inputs, so it is tagged "external" (never cached): a cached pass
# would hide a new violation in a file the test does not depend on.
set -euo pipefail

# The folders whose files are checked (and the self-test copies).
readonly SOURCE_DIRS=(checkpoint common deploy examples proto python scheduler server tests worker)

# The scheduler's client library: servers (server/server_node.h) and
# workers (worker/session.h, worker/telemetry.h, worker/trainer_main.cc)
# register, heartbeat and follow the view through it. It depends on
# common/ and proto/ only (scheduler/BUILD :client), not on the scheduler's
# state machine, so it is the one scheduler header the other roles use.
readonly ALLOWED_SCHEDULER_HEADERS=(scheduler/client.h)

# KNOWN VIOLATIONS, each "file included-path", tolerated until the change
# that removes it lands (whoever merges that change deletes its line).
# An entry that no longer matches fails the test, so this
# list only ever shrinks. Do not add to it: fix the include instead.
readonly KNOWN_VIOLATIONS=(
)
# What scan() tolerates: KNOWN_VIOLATIONS, or the self-test's own list.
known=("${KNOWN_VIOLATIONS[@]+"${KNOWN_VIOLATIONS[@]}"}")

# Prints "file:line: includes "path": rule" for each violating include under
# $1 not in ${known[@]}, and each entry of ${known[@]} that matches nothing;
# returns 1 if it printed anything, 0 otherwise.
scan() {
  local root=$1 dirs=() d
  for d in "${SOURCE_DIRS[@]}"; do
    [[ -d "$root/$d" ]] && dirs+=("$d")
  done
  if [[ ${#dirs[@]} -eq 0 ]]; then
    echo "layering_test: no source folders under $root" >&2
    return 2
  fi
  # grep prints path:line:text; awk applies the rules. -r does not follow
  # symlinks below the folders named, so bazel-* output trees stay out.
  (cd "$root" || exit 2; grep -rnE --include='*.h' --include='*.hpp' --include='*.cc' \
      --include='*.cpp' --include='*.c' --include='*.inc' \
      '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "${dirs[@]}" || true) |
    ALLOWED="${ALLOWED_SCHEDULER_HEADERS[*]}" \
    KNOWN="$(printf '%s\n' "${known[@]+"${known[@]}"}")" awk '
      BEGIN {
        allowed = ENVIRON["ALLOWED"]
        n = split(allowed, a, " ")
        for (i = 1; i <= n; i++) allowed_sched[a[i]] = 1
        n = split(ENVIRON["KNOWN"], k, "\n")
        for (i = 1; i <= n; i++) if (k[i] != "") { known_v[k[i]] = 1; used[k[i]] = 0 }
        bad = 0
      }
      function exempt(path) {
        return path ~ /^tests\// || path ~ /\/testing\// || path ~ /_test\.(cc|h)$/
      }
      function violation(path, line, inc, why,   key) {
        key = path " " inc
        if (key in known_v) { used[key] = 1; return }
        printf "%s:%s: includes \"%s\": %s\n", path, line, inc, why
        bad = 1
      }
      {
        # $0 is path:line:text
        path = $0; sub(/:.*/, "", path)
        rest = substr($0, length(path) + 2)
        line = rest; sub(/:.*/, "", line)
        inc = rest
        if (!sub(/^[^"]*"/, "", inc)) next
        sub(/".*/, "", inc)
        if (inc ~ /^absl\/status\/(status|statusor)\.h$/ && path != "common/status.h") {
          violation(path, line, inc, "R6: include common/status.h instead, so a dropped Status is caught (its [[nodiscard]] redeclarations)")
          next
        }
        if (exempt(path)) next
        if (inc ~ /^\.\.?\//) {
          violation(path, line, inc, "R0: include paths are relative to the workspace root, not to the file")
          next
        }
        top = path; sub(/\/.*/, "", top)
        itop = inc; if (!sub(/\/.*/, "", itop)) next  # "foo.h": no folder
        if (top == "common" && itop ~ /^(server|worker|scheduler|checkpoint|deploy|python|tests|examples)$/) {
          violation(path, line, inc, "R5: common/ is the bottom layer and includes no role folder; move the code down into common/ or the caller up")
        } else if (itop == "server" && top ~ /^(scheduler|worker|checkpoint|python)$/) {
          violation(path, line, inc, "R1: only the data-plane server includes server/; move what " top "/ needs into common/ or checkpoint/")
        } else if (itop == "worker" && top ~ /^(server|scheduler|checkpoint)$/) {
          violation(path, line, inc, "R2: " top "/ must not depend on the worker side (worker/)")
        } else if (itop == "scheduler" && top ~ /^(server|worker|checkpoint)$/ && !(inc in allowed_sched)) {
          violation(path, line, inc, "R3: of scheduler/, other roles include only the client library (" allowed "), not the scheduler itself")
        } else if (itop == "examples" && top != "examples") {
          violation(path, line, inc, "R4: examples/ are leaves; move what production code needs out of examples/ (e.g. into worker/data/)")
        }
      }
      END {
        for (key in used) if (!used[key]) {
          printf "KNOWN_VIOLATIONS entry \"%s\" no longer matches: the include is gone; delete the entry from tests/layering_test.sh\n", key
          bad = 1
        }
        exit bad
      }'
}

# Proves the check can fail: plants each kind of forbidden include in a copy
# of the checkout and expects a failure naming the file and line; checks that
# the allowed and exempt includes pass, and that the allow-list both hides
# its entries and fails on a stale one.
self_test() {
  local root=$1 tmp failures=0 n=0 d
  tmp=$(mktemp -d)
  # shellcheck disable=SC2064
  trap "rm -rf '$tmp'" RETURN
  mkdir "$tmp/base"
  for d in "${SOURCE_DIRS[@]}"; do
    [[ -d "$root/$d" ]] && cp -r "$root/$d" "$tmp/base/"
  done
  local base=$tmp/base
  # Cases are judged against the copy as it is: its own violations (those
  # the check above reports) are tolerated here, so the self-test shows the
  # check works whatever state the checkout is in.
  local saved=("${known[@]+"${known[@]}"}")
  known=()
  scan "$base" 2>&1 | sed -n 's/^\([^:]*\):[0-9]*: includes "\([^"]*\)".*/\1 \2/p' >"$tmp/current" || true
  mapfile -t known <"$tmp/current"
  if ! scan "$base" >"$tmp/out" 2>&1; then
    echo "self-test: the copy of the checkout does not pass with its own violations allowed:" >&2
    cat "$tmp/out" >&2
    known=("${saved[@]+"${saved[@]}"}")
    return 1
  fi
  # Each case: a new file to plant, the include it gets, pass or fail.
  local cases=(
    "scheduler/planted.cc|server/server.h|fail"
    "worker/planted.h|server/initializer.h|fail"
    "python/native/planted.cc|server/table.h|fail"
    "checkpoint/planted.cc|worker/kv_client.h|fail"
    "server/planted.cc|worker/kv_client.h|fail"
    "server/planted.cc|scheduler/cluster_state.h|fail"
    "worker/planted.cc|scheduler/scheduler.h|fail"
    "worker/data/planted.cc|examples/ctr/synthetic_ctr.h|fail"
    "python/native/planted.cc|examples/ctr/synthetic_ctr.h|fail"
    "common/planted.cc|scheduler/client.h|fail"
    "common/planted.h|deploy/launch/launch_env.h|fail"
    "scheduler/planted.cc|../server/server.h|fail"
    "worker/planted.cc|scheduler/client.h|pass"
    "server/planted.cc|scheduler/client.h|pass"
    "server/planted_test.cc|worker/kv_client.h|pass"
    "worker/testing/planted.h|server/server.h|pass"
    "tests/planted.cc|examples/ctr/synthetic_ctr.h|pass"
    "scheduler/planted.cc|common/protocol.h|pass"
    "server/planted.cc|absl/status/status.h|fail"
    "tests/planted_test.cc|absl/status/statusor.h|fail"
    "worker/planted.cc|common/status.h|pass"
  )
  local c file inc want line
  for c in "${cases[@]}"; do
    IFS='|' read -r file inc want <<<"$c"
    n=$((n + 1))
    mkdir -p "$(dirname "$base/$file")"
    printf '// planted by layering_test.sh\n\n#include "%s"  // a comment\n' "$inc" >"$base/$file"
    line=3
    if scan "$base" >"$tmp/out" 2>&1; then
      if [[ $want == fail ]]; then
        echo "self-test case $n: $file including \"$inc\" passed; it must fail" >&2
        failures=$((failures + 1))
      fi
    elif [[ $want == pass ]]; then
      echo "self-test case $n: $file including \"$inc\" failed; it must pass:" >&2
      cat "$tmp/out" >&2
      failures=$((failures + 1))
    elif ! grep -q "^$file:$line: includes \"$inc\"" "$tmp/out"; then
      echo "self-test case $n: the failure does not name $file:$line:" >&2
      cat "$tmp/out" >&2
      failures=$((failures + 1))
    fi
    rm -f "$base/$file"
  done
  # An allow-listed violation passes; a stale entry fails and is named.
  file=scheduler/planted.cc
  printf '#include "server/server.h"\n' >"$base/$file"
  known+=("$file server/server.h")
  n=$((n + 1))
  if ! scan "$base" >"$tmp/out" 2>&1; then
    echo "self-test case $n: an allow-listed include failed:" >&2
    cat "$tmp/out" >&2
    failures=$((failures + 1))
  fi
  rm -f "$base/$file"
  n=$((n + 1))
  if scan "$base" >"$tmp/out" 2>&1 || ! grep -q "entry \"$file server/server.h\" no longer matches" "$tmp/out"; then
    echo "self-test case $n: a stale allow-list entry was not reported:" >&2
    cat "$tmp/out" >&2
    failures=$((failures + 1))
  fi
  known=("${saved[@]+"${saved[@]}"}")
  if [[ $failures -gt 0 ]]; then
    return 1
  fi
  echo "self-test: all $n cases judged as expected (forbidden includes fail, naming file and line)"
}

main() {
  local root=${1:-}
  if [[ -z $root ]]; then
    local me=${BASH_SOURCE[0]}
    if [[ -n ${TEST_SRCDIR:-} && -e "$TEST_SRCDIR/${TEST_WORKSPACE:-main}/tests/layering_test.sh" ]]; then
      me=$TEST_SRCDIR/${TEST_WORKSPACE:-main}/tests/layering_test.sh
    fi
    root=$(cd "$(dirname "$(readlink -f "$me")")/.." && pwd)
  fi
  if [[ ! -d "$root/scheduler" || ! -d "$root/common" ]]; then
    echo "layering_test: $root is not the checkout (no scheduler/, common/)" >&2
    return 2
  fi
  local status=0
  if scan "$root"; then
    echo "layering: no violations in $root"
  else
    echo "layering_test: FAILED: the includes above break the layering (see the rules at the top of tests/layering_test.sh)" >&2
    status=1
  fi
  if ! self_test "$root"; then
    echo "layering_test: FAILED: the self-test shows the check cannot catch a violation" >&2
    status=1
  fi
  return $status
}

main "$@"
