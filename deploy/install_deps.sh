#!/usr/bin/env bash
# Installs the Debian 12 packages needed to build and test the project.
# Idempotent: when everything is present it prints nothing and changes
# nothing. Runs apt-get as root, or through sudo for other users.
set -euo pipefail

PACKAGES=(
  bazel-bootstrap bazel-rules-java   # build (Bazel 4.2.3, offline)
  g++ pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev
  libzmq3-dev cppzmq-dev
  libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev
  libopenblas-dev                    # CPU matrix products (worker/compute)
  zlib1g-dev                         # gzip-compressed idx files (worker/data)
  dataset-fashion-mnist              # the MLP example and its test
  libcpp-httplib-dev                 # HTTP endpoint (/metrics, /healthz, /status)
  libssl-dev openssl                 # control-plane TLS files; make_job_keys.sh
  xz-utils                           # deploy/bundle.sh (tar -J) and its test
  prometheus                         # promtool checks the /metrics format (tests)
  chromium fonts-dejavu-core         # headless screenshot of /status (tests)
  gnuplot-nox                        # deploy/plot: metrics files to PNG
  python3-yaml                       # deploy/k8s manifests test
  python3-numpy python3-pytest       # the Python package (python/ps) and its tests
  python3-torch                      # ps.torch, its tests and examples (CPU build)
  slurm-wlm munge                    # deploy/slurm test (one-node cluster)
  iproute2 nftables                  # network-fault tests (namespaces, veth, partitions, tc)
)

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
echo "install_deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install_deps: done" >&2
