#!/usr/bin/env bash
# Builds and runs benchmarks and prints their figures.
#
#   tests/bench.sh [NAME...] [-- FLAG...]
#
# NAME is one of the benches listed in BENCHES below; with none, every bench
# runs, in that order. FLAGs after "--" go to every selected bench binary
# (e.g. tests/bench.sh consistency -- --workers=1,16).
#
# Every figure is one JSON object per line on stdout:
#   {"bench":"consistency","metric":"bsp_step_overhead_us_w16","value":1234,
#    "unit":"us","baseline":567,"ratio":2.18}
# baseline and ratio (value / baseline) are numbers where the same run
# measured a baseline to compare with, null otherwise. Each bench ends with
# a {"bench":...,"summary":{...}} line; notes on what was run go to stderr.
# docs/PERFORMANCE.md explains the figures and what limits them.
#
# Environment: PS_BIN_DIR, a directory of prebuilt bench binaries (opt
# builds of the BENCHES targets, by their names, such as the ps/bin of
# `deploy/bundle.sh OUT --with-tests`): nothing is installed or built, as on
# a GPU machine without Debian's packages. PS_PYTHON, the python3 that runs
# the PyTorch baselines (default /usr/bin/python3; python3-torch is installed
# when it lacks torch, unless PS_PYTHON is set).
#
# Exits 2 on a usage error, non-zero when a build or a bench failed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

# One line per bench: its name, the Bazel target of its binary, and flags
# that select the bench when one binary serves several.
BENCHES=(
  "kv //tests/bench:kv_bench --mode=kv"
  "dense //tests/bench:kv_bench --mode=dense"
  "sparse //tests/bench:table_bench"
  "train //tests/bench:train_bench"
  "scaling //tests/bench:scaling_bench"
  "consistency //tests/bench:consistency_bench"
  "rebalance //tests/bench:rebalance_bench"
  "tiered //tests/bench:tiered_bench"
  # Needs root (a network namespace per process, to count its bytes).
  "allreduce //tests/bench:allreduce_bench"
  # One scheduler against thousands of simulated nodes (--nodes=...).
  "fleet //tests/bench:fleet_bench"
  # Not a binary: tests/bench/python_bench.py (the Python binding and
  # examples/python/dlrm_torch.py against plain PyTorch and the C++
  # trainer), run with $PS_PYTHON; the target is the native library it
  # loads, and the job's binaries are built beside it.
  "python //python:libps_native.so"
)

names=()
for entry in "${BENCHES[@]}"; do names+=("${entry%% *}"); done

usage() {
  echo "usage: tests/bench.sh [NAME...] [-- FLAG...]" >&2
  echo "  NAME: one of: ${names[*]} (default: all)" >&2
  exit 2
}

selected=()
flags=()
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage ;;
    --) shift; flags=("$@"); break ;;
    *)
      found=""
      for entry in "${BENCHES[@]}"; do
        [ "${entry%% *}" = "$1" ] && found="$entry"
      done
      [ -n "$found" ] || { echo "tests/bench.sh: unknown bench '$1'" >&2; usage; }
      selected+=("$found")
      ;;
  esac
  shift
done
[ ${#selected[@]} -eq 0 ] && selected=("${BENCHES[@]}")

if [ -z "${PS_BIN_DIR:-}" ]; then
  "$ROOT/deploy/install_deps.sh"
fi

# "name target [flag...]" -> target
target_of() { local rest="${1#* }"; echo "${rest%% *}"; }
# "name target [flag...]" -> the flags (empty when none)
flags_of() { local rest="${1#* }"; [ "${rest#* }" = "$rest" ] || echo "${rest#* }"; }

targets=()
for entry in "${selected[@]}"; do
  targets+=("$(target_of "$entry")")
  if [ "${entry%% *}" = python ]; then
    targets+=(//scheduler:scheduler_main //server:server_main //worker:trainer)
  fi
done
# Always the opt config: benchmarks of an unoptimised build mean nothing,
# and it is the config everybody builds with, so the cache is shared.
if [ -z "${PS_BIN_DIR:-}" ]; then
  bazel build --config=opt --noshow_progress $(printf "%s\n" "${targets[@]}" | sort -u)
  BIN="$(bazel info --config=opt bazel-bin 2>/dev/null)"
fi
PYTHON="${PS_PYTHON:-/usr/bin/python3}"

status=0
for entry in "${selected[@]}"; do
  name="${entry%% *}"
  target="$(target_of "$entry")"
  path="${target#//}"
  if [ -n "${PS_BIN_DIR:-}" ]; then
    binary="$PS_BIN_DIR/${path##*:}"
  else
    binary="$BIN/${path/://}"
  fi
  extra=()
  read -r -a own_flags <<< "$(flags_of "$entry")"
  extra+=(${own_flags[@]+"${own_flags[@]}"})
  if [ "$name" = train ]; then
    # The baseline: PyTorch's CPU build on the same models and batch sizes,
    # measured in this run (Debian's python3-torch; installed when missing).
    if [ -z "${PS_PYTHON:-}" ] && ! "$PYTHON" -c "import torch" 2>/dev/null; then
      echo "# bench train: installing python3-torch for the PyTorch baseline" >&2
      SUDO=(); [ "$(id -u)" -ne 0 ] && SUDO=(sudo)
      DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq python3-torch >/dev/null || true
    fi
    torch_json="$(mktemp)"
    if "$PYTHON" "$ROOT/tests/bench/torch_train.py" > "$torch_json"; then
      # With a GPU PyTorch can use, the GPU figures' baseline: the same
      # models with PyTorch on that GPU.
      if "$PYTHON" -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
        "$PYTHON" "$ROOT/tests/bench/torch_train.py" --device=cuda >> "$torch_json" ||
          echo "# bench train: no PyTorch GPU baseline (GPU ratios are null)" >&2
      fi
      cat "$torch_json"
      extra+=(--torch_json="$torch_json")
    else
      echo "# bench train: no PyTorch baseline (ratios are null)" >&2
    fi
  fi
  if [ "$name" = python ]; then
    # The library of the opt build (binaries: PS_BIN_DIR, else bazel-bin,
    # as ps.testing finds them); the figures' format is the binaries'.
    [ -z "${PS_BIN_DIR:-}" ] && export PS_NATIVE_LIB="$BIN/python/libps_native.so"
    echo "# bench python: $PYTHON tests/bench/python_bench.py ${flags[*]:-}" >&2
    if ! "$PYTHON" "$ROOT/tests/bench/python_bench.py" ${flags[@]+"${flags[@]}"}; then
      echo "tests/bench.sh: bench python failed" >&2
      status=1
    fi
    continue
  fi
  echo "# bench $name: $binary ${extra[*]:-} ${flags[*]:-}" >&2
  if ! "$binary" ${extra[@]+"${extra[@]}"} ${flags[@]+"${flags[@]}"}; then
    echo "tests/bench.sh: bench $name failed" >&2
    status=1
  fi
done
exit "$status"
