#!/usr/bin/env bash
# Packs the parameter server's binaries and the shared libraries they need
# into one tarball that runs on another x86-64 Linux machine without
# Debian 12's packages: a GPU host on another distribution, a Slurm cluster,
# a minimal container. Builds first (bazel build --config=opt).
#
#   deploy/bundle.sh OUT.tar.xz [--with-tests]
#
# The tarball holds ps/, laid out as
#   ps/bin/NAME       one launcher per program: sets LD_LIBRARY_PATH to
#                     ps/lib and runs ps/libexec/NAME (so PS_BIN_DIR=ps/bin
#                     works for deploy/local/demo.sh, deploy/slurm/ps.sbatch
#                     and tests/bench.sh), and choose_python.sh (with its
#                     python_probe.py), which ps.sbatch sources from
#                     PS_BIN_DIR
#   ps/libexec/       the binaries, and libps_cuda.so beside the trainer,
#                     where it is looked for
#   ps/lib/           every shared library they link, except the C library's
#                     own (libc, libm, libpthread, libdl, librt, libresolv,
#                     the loader) and CUDA's
#   ps/python/ps/     the Python package (import ps) with its native library
#                     libps_native.so beside it; ps/bin/ps-python runs the
#                     target's own python3 (or $PS_PYTHON) with it on
#                     PYTHONPATH and ps/lib on LD_LIBRARY_PATH, so a GPU
#                     host's own Python and PyTorch train through the bundle:
#                       ps/bin/ps-python my_train.py --config=job.pbtxt
#   ps/examples/python/  the Python example workers
#   ps/MANIFEST       the commit, the build machine and the library list
# Programs: scheduler_main, server_main, trainer, predict, kv_tool, psnode,
# curve_keygen and make_job_keys (which also needs openssl on the target).
# --with-tests adds the benchmarks (with the runfiles scaling_bench needs)
# and compute_test, to check the CUDA backend on a GPU machine:
#   tar -xJf ps.tar.xz && ps/bin/compute_test
#   PS_BIN_DIR=$PWD/ps/bin PS_PYTHON=python3 tests/bench.sh train
#
# What the target must have: glibc 2.36 or newer (Debian 12's; binaries use
# symbols no newer than that), and for the GPU path an NVIDIA driver and
# CUDA 13's runtime and cuBLAS in /usr/local/cuda/lib64 or on
# LD_LIBRARY_PATH (they are not packed: they must match the driver).
#
# Environment: PS_BUNDLE_FROM, a directory laid out as bazel-bin (a test's
# runfiles tree, ps/, is one) holding the binaries already built: nothing is
# installed or built (deploy/bundle_test.sh).
#
# Exits 2 on a usage error, 1 when the build or packing fails.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
usage() { echo "usage: deploy/bundle.sh OUT.tar.xz [--with-tests]" >&2; exit 2; }
[ $# -ge 1 ] || usage
OUT="$1"
shift
WITH_TESTS=""
for arg in "$@"; do
  case "$arg" in
    --with-tests) WITH_TESTS=1 ;;
    *) usage ;;
  esac
done
case "$OUT" in *.tar.xz) ;; *) echo "bundle: OUT must end in .tar.xz" >&2; exit 2 ;; esac
case "$OUT" in /*) ;; *) OUT="$PWD/$OUT" ;; esac

# label -> name in the bundle
PROGRAMS=(
  //scheduler:scheduler_main
  //server:server_main
  //worker:trainer
  //worker:predict
  //worker:kv_tool
  //deploy/launch:psnode
  //deploy/security:curve_keygen
)
if [ -n "$WITH_TESTS" ]; then
  PROGRAMS+=(
    //tests/bench:kv_bench
    //tests/bench:table_bench
    //tests/bench:train_bench
    //tests/bench:scaling_bench
    //tests/bench:consistency_bench
    //worker/compute:compute_test
  )
fi

cd "$ROOT"
if [ -n "${PS_BUNDLE_FROM:-}" ]; then
  BIN="$PS_BUNDLE_FROM"
else
  "$ROOT/deploy/install_deps.sh"
  echo "bundle: building (bazel build --config=opt) ..." >&2
  bazel build --config=opt --noshow_progress "${PROGRAMS[@]}" //worker/compute:libps_cuda.so \
    //python:libps_native.so >&2
  BIN="$(bazel info --config=opt bazel-bin 2>/dev/null)"
fi

STAGE="$(mktemp -d)"
trap 'rm -rf "$STAGE"' EXIT
P="$STAGE/ps"
mkdir -p "$P/bin" "$P/libexec" "$P/lib"

binary_of() { local path="${1#//}"; echo "$BIN/${path/://}"; }

launcher() {
  # $1: program name. Resolves its own location, so the bundle can move.
  cat > "$P/bin/$1" <<EOF
#!/bin/sh
here=\$(dirname "\$(readlink -f "\$0")")
LD_LIBRARY_PATH="\$here/../lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "\$here/../libexec/$1" "\$@"
EOF
  chmod 755 "$P/bin/$1"
}

for label in "${PROGRAMS[@]}"; do
  name="${label##*:}"
  [ -x "$(binary_of "$label")" ] || { echo "bundle: no binary $(binary_of "$label")" >&2; exit 1; }
  cp -L "$(binary_of "$label")" "$P/libexec/$name"
  launcher "$name"
done
cp -L "$BIN/worker/compute/libps_cuda.so" "$P/libexec/libps_cuda.so"
# The Python package: its sources from the build tree when they are there (a
# test's runfiles), else from the checkout; the native library beside it.
[ -f "$BIN/python/libps_native.so" ] || { echo "bundle: no $BIN/python/libps_native.so" >&2; exit 1; }
PKG_SRC="$BIN/python/ps"
[ -f "$PKG_SRC/__init__.py" ] || PKG_SRC="$ROOT/python/ps"
mkdir -p "$P/python" "$P/examples/python"
cp -rL "$PKG_SRC" "$P/python/ps"
find "$P/python" -name __pycache__ -prune -exec rm -rf {} +
cp -L "$BIN/python/libps_native.so" "$P/python/ps/libps_native.so"
for f in "$ROOT"/examples/python/*.py "$ROOT"/examples/python/*.pbtxt; do
  [ -f "$f" ] && cp -L "$f" "$P/examples/python/"
done
cat > "$P/bin/ps-python" <<'EOF2'
#!/bin/sh
# The target's Python with the bundle's package and libraries: PS_PYTHON
# names another interpreter (default python3 on PATH).
here=$(dirname "$(readlink -f "$0")")
PYTHONPATH="$here/../python${PYTHONPATH:+:$PYTHONPATH}" \
LD_LIBRARY_PATH="$here/../lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  exec "${PS_PYTHON:-python3}" "$@"
EOF2
chmod 755 "$P/bin/ps-python"
# ps.sbatch picks a worker command's python3 with this (from PS_BIN_DIR),
# which runs the import check beside it.
cp "$ROOT/deploy/choose_python.sh" "$P/bin/choose_python.sh"
cp "$ROOT/deploy/python_probe.py" "$P/bin/python_probe.py"
# make_job_keys finds curve_keygen beside itself: the launcher.
cp "$ROOT/deploy/security/make_job_keys.sh" "$P/bin/make_job_keys"
chmod 755 "$P/bin/make_job_keys"
if [ -n "$WITH_TESTS" ]; then
  # scaling_bench starts whole jobs from <its path>.runfiles/ps/...; those
  # processes inherit the launcher's LD_LIBRARY_PATH.
  R="$P/libexec/scaling_bench.runfiles/ps"
  mkdir -p "$R/scheduler" "$R/server" "$R/worker/compute"
  ln "$P/libexec/scheduler_main" "$R/scheduler/scheduler_main"
  ln "$P/libexec/server_main" "$R/server/server_main"
  ln "$P/libexec/trainer" "$R/worker/trainer"
  ln "$P/libexec/libps_cuda.so" "$R/worker/compute/libps_cuda.so"
fi

# The libraries: what the dynamic loader resolves for each binary where
# bazel built it (a test's rpath finds bazel's own shared objects there),
# less the C library's own and CUDA's.
SYSTEM='/(libc|libm|libdl|libpthread|librt|libresolv|libutil|ld-linux-x86-64)\.so'
sources=("$BIN/worker/compute/libps_cuda.so" "$BIN/python/libps_native.so")
for label in "${PROGRAMS[@]}"; do sources+=("$(binary_of "$label")"); done
libs="$(for f in "${sources[@]}"; do
          ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3}'
        done | sort -u | grep -Ev "$SYSTEM" | grep -v '^/usr/local/cuda' || true)"
for lib in $libs; do
  cp -L "$lib" "$P/lib/$(basename "$lib")"
done
# Every library of every packed binary must now resolve (CUDA's aside).
missing="$(for f in "$P"/libexec/* "$P/python/ps/libps_native.so"; do
             [ -f "$f" ] && LD_LIBRARY_PATH="$P/lib" ldd "$f" 2>/dev/null | grep 'not found' || true
           done | grep -v 'libcu' | sort -u || true)"
if [ -n "$missing" ]; then
  echo "bundle: unresolved libraries:" >&2
  echo "$missing" >&2
  exit 1
fi

{
  echo "commit $(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME"), $(ldd --version | head -1)"
  echo "cuda $( [ -s "$P/libexec/libps_cuda.so" ] && echo "backend built (sm_90)" || echo "not built (placeholder)")"
  echo "libraries:"
  (cd "$P/lib" && ls -1)
} > "$P/MANIFEST"

mkdir -p "$(dirname "$OUT")"
tar -C "$STAGE" -cJf "$OUT.partial" ps
mv "$OUT.partial" "$OUT"
echo "bundle: $OUT ($(du -h "$OUT" | cut -f1)); on the target: tar -xJf $(basename "$OUT") && ps/bin/trainer --help" >&2
