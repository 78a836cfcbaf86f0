#!/usr/bin/env bash
# Makes the keys of one job's security config (proto/config.proto,
# SecurityConfig) in DIR and prints the config lines that turn it on:
#   ca.pem ca.key    the job CA (EC P-256, 10 years); ca.key is needed only
#                    to sign more certificates: keep it out of the job's pods
#   job.pem job.key  the job certificate, shared by every process (client and
#                    server auth), subjectAltName: HOSTS, localhost, 127.0.0.1
#   curve.pub curve.key  the job's CURVE key pair (Z85) for the data plane
# Every file is mode 0600; an existing ca.pem in DIR is never overwritten.
#
# Usage: make_job_keys.sh [--tls_only] DIR [HOSTS...]
#   HOSTS: names or addresses the processes dial the scheduler by (DNS names,
#   wildcards like '*.ps.default.svc', IPv4/IPv6 addresses).
#   --tls_only: no CURVE key pair (and no curve block in the snippet).
# Needs openssl; the CURVE keys need curve_keygen (//deploy/security:
# curve_keygen), found beside this script, in $CURVE_KEYGEN, on PATH or in
# the workspace's bazel-bin.
set -euo pipefail

usage() { echo "usage: make_job_keys.sh [--tls_only] DIR [HOSTS...]" >&2; exit 2; }
tls_only=0
if [ "${1:-}" = "--tls_only" ]; then tls_only=1; shift; fi
[ $# -ge 1 ] || usage
case "$1" in -*) usage ;; esac
dir=$1; shift
command -v openssl >/dev/null || { echo "make_job_keys: openssl not found (apt-get install openssl)" >&2; exit 1; }

find_keygen() {
  local here; here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  for c in "${CURVE_KEYGEN:-}" "$here/curve_keygen" "${RUNFILES_DIR:-$0.runfiles}/ps/deploy/security/curve_keygen" \
           "$(command -v curve_keygen || true)" "$here/../../bazel-bin/deploy/security/curve_keygen"; do
    [ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return 0; }
  done
  return 1
}
keygen=""
if [ $tls_only = 0 ]; then
  keygen=$(find_keygen) || { echo "make_job_keys: curve_keygen not found; build //deploy/security:curve_keygen, set CURVE_KEYGEN, or pass --tls_only" >&2; exit 1; }
fi

umask 077
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
if [ -e "$dir/ca.pem" ] || [ -e "$dir/job.key" ] || [ -e "$dir/curve.key" ]; then
  echo "make_job_keys: $dir already holds keys; refusing to overwrite them" >&2
  exit 1
fi

san="DNS:localhost,IP:127.0.0.1"
for h in "$@"; do
  if [[ $h =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ || $h == *:* ]]; then
    san="$san,IP:$h"
  else
    san="$san,DNS:$h"
  fi
done

tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
quiet() { "$@" 2>"$tmp/err" || { cat "$tmp/err" >&2; echo "make_job_keys: failed: $*" >&2; exit 1; }; }

quiet openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -keyout "$dir/ca.key" -out "$dir/ca.pem" -days 3650 -subj "/CN=ps job CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
quiet openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -keyout "$dir/job.key" -out "$tmp/job.csr" -subj "/CN=ps job"
cat >"$tmp/ext.cnf" <<EXT
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyAgreement
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=$san
EXT
quiet openssl x509 -req -in "$tmp/job.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" \
  -set_serial "0x$(openssl rand -hex 16)" -days 825 -extfile "$tmp/ext.cnf" -out "$dir/job.pem"
if [ $tls_only = 0 ]; then
  "$keygen" "$dir/curve.pub" "$dir/curve.key"
fi
chmod 0600 "$dir"/*

echo "# keys in $dir (subjectAltName $san); add to the job config:"
echo "security {"
echo "  tls { ca_cert_file: \"$dir/ca.pem\" cert_file: \"$dir/job.pem\" key_file: \"$dir/job.key\" }"
if [ $tls_only = 0 ]; then
  echo "  curve { public_key_file: \"$dir/curve.pub\" secret_key_file: \"$dir/curve.key\" }"
fi
echo "}"
