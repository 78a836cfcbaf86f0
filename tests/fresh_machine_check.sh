#!/usr/bin/env bash
# Checks the README's two commands on a fresh, minimal Debian 12 (as
# `debootstrap --variant=minbase bookworm` makes it: no compiler, no CUDA).
# Needs root and debootstrap on the host. Not part of tests/run_all.sh.
#
#   tests/fresh_machine_check.sh [ROOTFS]   (default /var/tmp/ps-fresh)
#
# Creates the root file system if it does not exist, clones this
# repository's HEAD into it, and runs inside a chroot, in this order, the
# steps named in PS_FRESH_STEPS (default: all four):
#
#   demo          deploy/local/demo.sh (the CTR job on the C++ trainer)
#   python        the demo on examples/python/lr_numpy.pbtxt, then on
#                 dlrm_async.pbtxt (it installs python3-numpy, then
#                 python3-torch, for Debian's python3)
#   python-other  the same two with another python3 first on PATH, one
#                 without NumPy or PyTorch (Debian's python3 without its
#                 site packages, as a pyenv or conda python3 would be): the
#                 demo must run them with /usr/bin/python3 instead
#   tests         tests/run_all.sh
#
# Prints each demo's last lines and its time from its start to its JSON
# line (the first one's from nothing: apt, build, job), and at the end the
# demos that printed no JSON summary; exits 1 if there were any.
# PS_FRESH_STEPS=demo runs only the demo (the README's first-run figure;
# use a new ROOTFS each time, since a second run finds the packages);
# PS_FRESH_STEPS=python-other on a new ROOTFS checks the installs with the
# other python3 first.
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
STEPS="${PS_FRESH_STEPS:-demo python python-other tests}"
FAILED=()
# demo_run NAME CONFIG [PATH_PREFIX [EXPECTED]]: runs the demo on CONFIG
# (relative to the checkout; "" for the default) with PATH_PREFIX in front
# of the root's PATH; its output goes to /root/NAME.out and NAME.log. The
# run fails unless its last line is a JSON summary and, when EXPECTED is
# given, its log has that line.
demo_run() {
  local name="$1" config="$2" prefix="${3:-}" expected="${4:-}" start=$SECONDS last
  echo "== $name: deploy/local/demo.sh $config${prefix:+ (PATH=$prefix:...)}" >&2
  run "cd /root/ps && ${prefix:+PATH=$prefix:\$PATH }deploy/local/demo.sh $config" \
    > "$ROOTFS/root/$name.out" 2> "$ROOTFS/root/$name.log" || true
  tail -n 3 "$ROOTFS/root/$name.log"
  last="$(tail -n 1 "$ROOTFS/root/$name.out")"
  echo "$last"
  if [[ "$last" != '{'*'"test_auc"'*'}' ]]; then
    FAILED+=("$name (no JSON summary; log: $ROOTFS/root/$name.log)")
  elif [ -n "$expected" ] && ! grep -qF "$expected" "$ROOTFS/root/$name.log"; then
    FAILED+=("$name (no line \"$expected\" in $ROOTFS/root/$name.log)")
  else
    echo "== $name: $((SECONDS - start)) s to its JSON line (log: $ROOTFS/root/$name.log)" >&2
  fi
}
if [[ " $STEPS " == *" demo "* ]]; then
  demo_run demo ""
fi
if [[ " $STEPS " == *" python "* ]]; then
  demo_run lr_numpy examples/python/lr_numpy.pbtxt
  demo_run dlrm_async examples/python/dlrm_async.pbtxt
fi
if [[ " $STEPS " == *" python-other "* ]]; then
  # A python3 of its own first on PATH, without NumPy or PyTorch: Debian's
  # interpreter with no site packages (-S), as a pyenv or conda one is.
  mkdir -p "$ROOTFS/root/other-python"
  printf '#!/bin/sh\nexec /usr/bin/python3 -S "$@"\n' > "$ROOTFS/root/other-python/python3"
  chmod 755 "$ROOTFS/root/other-python/python3"
  demo_run lr_numpy_other examples/python/lr_numpy.pbtxt /root/other-python \
    "workers run /usr/bin/python3"
  demo_run dlrm_async_other examples/python/dlrm_async.pbtxt /root/other-python \
    "workers run /usr/bin/python3"
fi
if [[ " $STEPS " == *" tests "* ]]; then
  echo "== tests" >&2
  run "cd /root/ps && time tests/run_all.sh" 2>&1 | tee "$ROOTFS/root/tests.log" | tail -n 5
fi
if [ ${#FAILED[@]} -gt 0 ]; then
  printf '== FAILED: %s\n' "${FAILED[@]}" >&2
  exit 1
fi
