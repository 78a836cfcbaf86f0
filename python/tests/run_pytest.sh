#!/usr/bin/env bash
# Runs one pytest file of python/tests as a Bazel test, with the package,
# the native library and the job's binaries from the runfiles, and writes
# JUnit XML where Bazel looks for it (tests/run_all.sh counts its cases;
# skipped cases count as neither passed nor failed).
#
# Under --config=asan the library is built with ASan+UBSan: their runtimes
# are preloaded into Python (which is not instrumented), leak checking is
# off (the interpreter's own allocations would be reported), and any error
# in the library aborts the test. Under --config=tsan TSan's runtime is
# preloaded the same way.
set -euo pipefail
RUNFILES="${TEST_SRCDIR:-$PWD/..}/ps"
export PYTHONPATH="$RUNFILES/python${PYTHONPATH:+:$PYTHONPATH}"
export PS_NATIVE_LIB="$RUNFILES/python/libps_native.so"
export PS_RUNFILES="$RUNFILES"
export PYTHONDONTWRITEBYTECODE=1
PY=/usr/bin/python3
# (No pipe into grep -q: with pipefail, ldd's SIGPIPE when grep stops early
# would read as "not an ASan build" now and then.)
libs="$(ldd "$PS_NATIVE_LIB")"
if [[ "$libs" == *libasan* ]]; then
  preload="$(gcc -print-file-name=libasan.so)"
  ubsan="$(gcc -print-file-name=libubsan.so)"
  [ -f "$ubsan" ] && preload="$preload:$ubsan"
  export LD_PRELOAD="$preload"
  export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:${ASAN_OPTIONS:-}"
  export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:${UBSAN_OPTIONS:-}"
  export PS_SANITIZER=1
elif [[ "$libs" == *libtsan* ]]; then
  # TSan's runtime cannot be dlopen'ed (it needs static TLS, "cannot
  # allocate memory in static TLS block"): it must be in the process from
  # its start. Only the library is instrumented; races inside the
  # interpreter, NumPy or PyTorch are not looked for. The project's
  # suppressions and abseil annotations (tests/sanitizers) come first: the
  # runtime reads its suppressions at start, before libps_native.so loads.
  hooks="$RUNFILES/tests/sanitizers/libps_tsan_preload.so"
  [ -f "$hooks" ] || { echo "run_pytest.sh: $hooks missing (a TSan build has it)" >&2; exit 1; }
  export LD_PRELOAD="$hooks:$(gcc -print-file-name=libtsan.so)"
  export TSAN_OPTIONS="halt_on_error=1:${TSAN_OPTIONS:-}"
  export PS_SANITIZER=1
fi
xml=()
[ -n "${XML_OUTPUT_FILE:-}" ] && xml=(--junitxml="$XML_OUTPUT_FILE" -o junit_family=xunit1)
cd "${TEST_TMPDIR:-/tmp}"
exec "$PY" -m pytest -q -p no:cacheprovider "${xml[@]}" "$RUNFILES/python/tests/$1"
