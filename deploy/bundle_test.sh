#!/usr/bin/env bash
# deploy/bundle.sh on the test's own binaries (PS_BUNDLE_FROM: the runfiles
# tree is laid out as bazel-bin):
#   - usage errors exit 2, a missing binary exits 1 and names it;
#   - the tarball holds a launcher and a binary per program, the CUDA
#     backend beside the trainer, and a MANIFEST;
#   - every library a packed binary loads, except the C library's own and
#     CUDA's, resolves into the bundle's lib/ (what lets it run on a
#     machine without Debian's packages);
#   - the bundle, moved elsewhere and started with an empty environment,
#     runs a whole job (deploy/local/demo.sh with PS_BIN_DIR=ps/bin) to a
#     test AUC near the data's oracle.
set -euo pipefail

R="$TEST_SRCDIR/ps"
T="$(mktemp -d "${TEST_TMPDIR:-/tmp}/bundle.XXXXXX")"
fail() { echo "FAIL: $*" >&2; exit 1; }

# Usage errors.
set +e
bash "$R/deploy/bundle.sh" >/dev/null 2>&1; rc=$?
[ $rc -eq 2 ] || fail "no arguments: exit $rc, want 2"
PS_BUNDLE_FROM="$R" bash "$R/deploy/bundle.sh" "$T/x.tgz" >/dev/null 2>&1; rc=$?
[ $rc -eq 2 ] || fail "OUT not .tar.xz: exit $rc, want 2"
PS_BUNDLE_FROM="$R" bash "$R/deploy/bundle.sh" "$T/x.tar.xz" --bogus >/dev/null 2>&1; rc=$?
[ $rc -eq 2 ] || fail "unknown flag: exit $rc, want 2"
mkdir -p "$T/empty"
PS_BUNDLE_FROM="$T/empty" bash "$R/deploy/bundle.sh" "$T/x.tar.xz" 2>"$T/missing.err"; rc=$?
set -e
[ $rc -eq 1 ] || fail "no binaries: exit $rc, want 1"
grep -q "no binary .*scheduler_main" "$T/missing.err" || fail "no binaries: $(cat "$T/missing.err")"
[ ! -e "$T/x.tar.xz" ] || fail "a failed bundle left a tarball"

PS_BUNDLE_FROM="$R" bash "$R/deploy/bundle.sh" "$T/ps.tar.xz"
# Unpacked somewhere else than where it was made.
mkdir -p "$T/elsewhere"
tar -C "$T/elsewhere" -xJf "$T/ps.tar.xz"
P="$T/elsewhere/ps"

for n in scheduler_main server_main trainer predict kv_tool psnode curve_keygen; do
  [ -x "$P/bin/$n" ] || fail "no launcher bin/$n"
  [ -x "$P/libexec/$n" ] || fail "no binary libexec/$n"
done
[ -x "$P/bin/make_job_keys" ] || fail "no bin/make_job_keys"
[ -f "$P/libexec/libps_cuda.so" ] || fail "no libexec/libps_cuda.so"
grep -q '^libraries:' "$P/MANIFEST" || fail "MANIFEST: $(cat "$P/MANIFEST")"
[ -f "$P/python/ps/libps_native.so" ] || fail "no python/ps/libps_native.so"
[ -f "$P/python/ps/session.py" ] || fail "no python/ps/session.py"
[ -x "$P/bin/ps-python" ] || fail "no bin/ps-python"
# The package imports and loads its library through the launcher, with
# nothing of the build tree on the paths.
# A sanitizer build's library needs its runtime loaded first into the
# (uninstrumented) interpreter.
sanitizer_env=()
if [ "${PS_SANITIZER:-0}" = 1 ] && ldd "$P/python/ps/libps_native.so" > "$T/native.ldd" &&
   grep -q libasan "$T/native.ldd"; then
  sanitizer_env=("LD_PRELOAD=$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libubsan.so)"
                 "ASAN_OPTIONS=detect_leaks=0")
elif [ "${PS_SANITIZER:-0}" = 1 ] && grep -q libtsan "$T/native.ldd"; then
  # TSan's runtime cannot be dlopen'ed (static TLS): preloaded as well,
  # behind the project's hooks (python/tests/run_pytest.sh says why).
  hooks="$R/tests/sanitizers/libps_tsan_preload.so"
  [ -f "$hooks" ] || fail "$hooks missing (a TSan build has it)"
  sanitizer_env=("LD_PRELOAD=$hooks:$(gcc -print-file-name=libtsan.so)")
fi
env -i PATH=/usr/bin:/bin "${sanitizer_env[@]}" "$P/bin/ps-python" -c \
  'import ps; print(ps.hash_key(1, 2), ps.data.describe_config("'"$R"'/examples/ctr/async.pbtxt")["num_servers"])' \
  > "$T/python.out" 2>&1 || fail "ps-python: $(cat "$T/python.out")"
grep -q ' 2$' "$T/python.out" || fail "ps-python: $(cat "$T/python.out")"

# Every library resolves into the bundle, but the C library's and CUDA's.
checked=0
for f in "$P"/libexec/*; do
  [ -f "$f" ] || continue
  while read -r name path; do
    case "$name" in
      libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|libresolv.so.*|libutil.so.*) continue ;;
      libcu*) continue ;;
    esac
    [ "$path" != "not" ] || fail "$(basename "$f"): $name not found with the bundle's lib/"
    case "$path" in
      "$P/lib/"*) checked=$((checked + 1)) ;;
      *) fail "$(basename "$f"): $name resolves to $path, outside the bundle" ;;
    esac
  done < <(LD_LIBRARY_PATH="$P/lib" ldd "$f" | awk '$2 == "=>" {print $1, $3}')
done
[ "$checked" -gt 20 ] || fail "only $checked libraries checked"
echo "bundle_test: $checked library references resolve into the bundle"

# The launchers work from anywhere, with nothing in the environment.
cd "$T"
env -i PATH=/usr/bin:/bin "$P/bin/scheduler_main" \
  --config="$R/examples/ctr/async.pbtxt" --describe > "$T/describe.txt" ||
  fail "scheduler_main --describe through its launcher"
grep -q '^servers=2' "$T/describe.txt" || fail "describe: $(cat "$T/describe.txt")"

# A whole job through the launchers.
env -i PATH=/usr/bin:/bin HOME="$T" PS_BIN_DIR="$P/bin" PS_RUN_DIR="$T/run" \
  ${PS_TIMEOUT_SCALE:+PS_TIMEOUT_SCALE=$PS_TIMEOUT_SCALE} \
  bash "$R/deploy/local/demo.sh" "$R/examples/ctr/async.pbtxt" > "$T/demo.out" 2>"$T/demo.err" ||
  { tail -20 "$T/demo.err" >&2; fail "demo.sh with PS_BIN_DIR=bundle"; }
summary="$(tail -1 "$T/demo.out")"
echo "bundle_test: $summary"
auc="$(echo "$summary" | sed -nE 's/.*"test_auc":([0-9.]+).*/\1/p')"
[ -n "$auc" ] || fail "no test_auc in '$summary'"
awk -v a="$auc" 'BEGIN { exit !(a > 0.85) }' || fail "test AUC $auc, want > 0.85"
echo "PASS"
