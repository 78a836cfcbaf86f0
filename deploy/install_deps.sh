#!/usr/bin/env bash
# Installs the Debian 12 packages the project needs, in groups:
#
#   deploy/install_deps.sh             a job: build it (bazel build) and run it
#   deploy/install_deps.sh --python    ... and Python workers on the ps package
#   deploy/install_deps.sh --torch     ... and PyTorch for them (ps.torch, the
#                                      DLRM example; implies --python)
#   deploy/install_deps.sh --tests     ... and the whole test suite (implies --python)
#   deploy/install_deps.sh --list [--python|--tests]
#                                      prints the group's package names, one a
#                                      line, and installs nothing
#
# deploy/local/demo.sh and the Dockerfile's build stage install only the
# job's packages (a newcomer's first run downloads no browser, Slurm or
# PyTorch), and the demo adds --python or --torch for a job whose Python
# worker command needs them and finds no python3 that has them;
# tests/run_all.sh installs --tests.
#
# Idempotent: when everything is present it prints nothing and changes
# nothing. Runs apt-get as root, or through sudo for other users. When
# another apt or dpkg holds the lock (unattended-upgrades on a fresh
# machine, a second install beside this one) it waits for it, up to
# PS_APT_LOCK_WAIT seconds (default 600), then fails with the reason.
set -euo pipefail

# Build and run a job: Bazel and the libraries' -dev packages (the runtime
# libraries come with them). gtest/gmock are here because the @system
# repository rule resolves every library it declares when Bazel fetches it,
# whatever the targets (third_party/system_libs.bzl).
JOB_PACKAGES=(
  bazel-bootstrap bazel-rules-java   # build (Bazel 4.2.3, offline)
  g++ pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev
  libzmq3-dev cppzmq-dev
  libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev
  libopenblas-dev                    # CPU matrix products (worker/compute)
  zlib1g-dev                         # gzip-compressed idx files (worker/data)
  libcpp-httplib-dev                 # HTTP endpoint (/metrics, /healthz, /status)
  libssl-dev openssl                 # control-plane TLS files; make_job_keys.sh (ps.sbatch)
  librocksdb-dev                     # sparse tables' disk tier (cold rows on local disk)
  libgloo-dev                        # ring all-reduce of dense tables among workers
  xz-utils                           # deploy/bundle.sh (tar -J)
)
# Python workers (a config's launch.worker_command: examples/python).
PYTHON_PACKAGES=(
  python3-numpy                      # the Python package (python/ps)
)
# PyTorch for Python workers (ps.torch; examples/python/dlrm_torch.py).
TORCH_PACKAGES=(
  python3-torch                      # CPU build
)
# Only the test suite (and a few developer tools) use these.
TEST_PACKAGES=(
  dataset-fashion-mnist              # the MLP example and its test
  prometheus                         # promtool checks the /metrics format (tests)
  chromium fonts-dejavu-core         # headless screenshot of /status (tests)
  gnuplot-nox                        # deploy/plot: metrics files to PNG, and its test
  python3                            # the shell tests read JSON (tests/testing/test_lib.sh)
  python3-yaml                       # deploy/k8s manifests test
  python3-pytest                     # the Python package's tests
  slurm-wlm munge                    # deploy/slurm test (one-node cluster)
  iproute2 nftables                  # network-fault tests (namespaces, veth, partitions, tc)
  buildah debootstrap                # the container image test (tests/image_test.sh)
  clang                              # .ci/run's thread-safety build (--config=clang)
)

PACKAGES=("${JOB_PACKAGES[@]}")
list=0
for arg in "$@"; do
  case "$arg" in
    --python) PACKAGES+=("${PYTHON_PACKAGES[@]}") ;;
    --torch) PACKAGES+=("${PYTHON_PACKAGES[@]}" "${TORCH_PACKAGES[@]}") ;;
    --tests) PACKAGES+=("${PYTHON_PACKAGES[@]}" "${TORCH_PACKAGES[@]}" "${TEST_PACKAGES[@]}") ;;
    --list) list=1 ;;
    *) echo "install_deps: unknown argument '$arg' (--python, --torch, --tests, --list)" >&2; exit 2 ;;
  esac
done
# --python --tests names python3-numpy twice, --torch --tests python3-torch.
mapfile -t PACKAGES < <(printf '%s\n' "${PACKAGES[@]}" | awk '!seen[$0]++')
if [ $list -eq 1 ]; then printf '%s\n' "${PACKAGES[@]}"; exit 0; fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install_deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  SUDO=(sudo)
fi

LOCK_WAIT="${PS_APT_LOCK_WAIT:-600}"
deadline=$((SECONDS + LOCK_WAIT))
ERR="$(mktemp)"
trap 'rm -f "$ERR"' EXIT
# Runs apt-get with its arguments; while it fails because another process
# holds apt's or dpkg's lock (the lists lock of `apt-get update` or dpkg's),
# says so once, then tries again every 5 s until the deadline. (apt's own
# DPkg::Lock::Timeout would wait silently, and only for dpkg's lock.)
apt_get() {
  local waited=0 holder
  while true; do
    if "${SUDO[@]}" apt-get "$@" 2>"$ERR"; then
      grep -v '^$' "$ERR" >&2 || true
      [ $waited -eq 0 ] || echo "install_deps: got the lock" >&2
      return 0
    fi
    if grep -qiE 'could not get lock|unable to acquire the dpkg frontend lock|unable to lock' "$ERR" \
        && [ $SECONDS -lt $deadline ]; then
      if [ $waited -eq 0 ]; then
        holder="$(grep -m1 -oiE 'held by process [0-9]+( \([^)]*\))?' "$ERR" || true)"
        echo "install_deps: another apt or dpkg holds the lock${holder:+ ($holder)};" \
          "waiting up to $((deadline - SECONDS)) s for it (PS_APT_LOCK_WAIT) ..." >&2
      fi
      waited=1
      sleep 5
      continue
    fi
    cat "$ERR" >&2
    grep -qiE 'could not get lock|unable to acquire' "$ERR" \
      && echo "install_deps: the apt/dpkg lock was still held after ${LOCK_WAIT} s (PS_APT_LOCK_WAIT)" >&2
    return 1
  done
}

echo "install_deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt_get update -qq
apt_get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install_deps: done" >&2
