#!/usr/bin/env bash
# Checks the README's two commands on a fresh, minimal Debian 12 (as
# `debootstrap --variant=minbase bookworm` makes it: no compiler, no CUDA).
# Needs root and debootstrap on the host. Not part of tests/run_all.sh.
#
#   tests/fresh_machine_check.sh [ROOTFS]   (default /var/tmp/ps-fresh)
#
# Creates the root file system if it does not exist, clones this
# repository's HEAD into it, and runs deploy/local/demo.sh and
# tests/run_all.sh inside a chroot. Prints both commands' last lines, and
# the demo's time from nothing (apt, build, job) to its JSON line.
# PS_FRESH_STEPS=demo runs only the demo (the README's first-run figure;
# use a new ROOTFS each time, since a second run finds the packages).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ROOTFS="${1:-/var/tmp/ps-fresh}"
[ "$(id -u)" -eq 0 ] || { echo "needs root" >&2; exit 2; }

if [ ! -x "$ROOTFS/bin/bash" ]; then
  debootstrap --variant=minbase bookworm "$ROOTFS" http://deb.debian.org/debian
fi
cp /etc/resolv.conf "$ROOTFS/etc/resolv.conf"
rm -rf "$ROOTFS/root/ps"
git clone -q "$REPO" "$ROOTFS/root/ps"

mounts=(proc sys dev dev/pts)
cleanup() {
  for ((i=${#mounts[@]}-1; i>=0; i--)); do umount -l "$ROOTFS/${mounts[$i]}" 2>/dev/null || true; done
  umount -l "$ROOTFS" 2>/dev/null || true
}
trap cleanup EXIT
# The root a mount point of its own, as on a real machine: `ip netns exec`
# (the network-fault tests) remounts / as a slave, which fails on a plain
# directory.
mount --bind "$ROOTFS" "$ROOTFS"
mount -t proc proc "$ROOTFS/proc"
mount --rbind /sys "$ROOTFS/sys"
mount --rbind /dev "$ROOTFS/dev"
mount -t devpts devpts "$ROOTFS/dev/pts" 2>/dev/null || true

run() { chroot "$ROOTFS" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 bash -lc "$1"; }
STEPS="${PS_FRESH_STEPS:-demo tests}"
if [[ " $STEPS " == *" demo "* ]]; then
  echo "== demo" >&2
  start=$SECONDS
  run "cd /root/ps && time deploy/local/demo.sh" 2>&1 | tee "$ROOTFS/root/demo.log" | tail -n 3
  echo "== demo: $((SECONDS - start)) s from nothing to its JSON line (log: $ROOTFS/root/demo.log)" >&2
fi
if [[ " $STEPS " == *" tests "* ]]; then
  echo "== tests" >&2
  run "cd /root/ps && time tests/run_all.sh" 2>&1 | tee "$ROOTFS/root/tests.log" | tail -n 5
fi
