#!/usr/bin/env bash
# Builds the project's container image from deploy/docker/Dockerfile with
# buildah, without a Docker daemon or Docker Hub:
#
#   deploy/docker/build.sh [TAG]          (default localhost/ps:latest)
#
# 1. Makes the base image docker.io/library/debian:12 when it is missing:
#    `debootstrap --variant=minbase bookworm` (what the official image is
#    made from), with the official image's apt sources, imported as one
#    layer. Later builds reuse it.
# 2. `buildah bud --isolation chroot --layers --pull-never`: each
#    instruction's layer is cached, so a rebuild after a source change
#    reinstalls no package (the apt layers come before `COPY . .`) and a
#    rebuild of an unchanged checkout takes seconds.
# 3. Prints the image's size and the binaries it holds.
#
# Needs root, buildah and debootstrap (deploy/install_deps.sh --tests
# installs both; `apt-get install buildah debootstrap`). Runs the build
# under `nice` (PS_NICE, default 10). Run an image built here with
# `buildah from TAG` and `buildah run --isolation chroot CONTAINER CMD...`
# (tests/image_test.sh does), or push it to a registry with `buildah push`.
# `podman run` needs a runtime that may set rlimits, which some machines
# (containers themselves) refuse.
#
# Environment: PS_DOCKERFILE (default deploy/docker/Dockerfile),
# PS_BASE_ROOTFS (the debootstrap directory, default
# /var/tmp/ps-debian12-rootfs, kept for the next time), PS_DEBIAN_MIRROR
# (default http://deb.debian.org/debian), PS_NICE.
# Exit status: 0 built; 1 a step failed (the message names the step); 2 a
# missing prerequisite.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TAG="${1:-localhost/ps:latest}"
DOCKERFILE="${PS_DOCKERFILE:-$ROOT/deploy/docker/Dockerfile}"
BASE_ROOTFS="${PS_BASE_ROOTFS:-/var/tmp/ps-debian12-rootfs}"
MIRROR="${PS_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
BASE=docker.io/library/debian:12
NICE=(nice -n "${PS_NICE:-10}")

say() { echo "build.sh: $*" >&2; }
die() { say "FAILED: $*"; exit 1; }

[ "$(id -u)" -eq 0 ] || { say "needs root (buildah's chroot isolation and debootstrap)"; exit 2; }
export PATH="$PATH:/usr/sbin:/sbin"
for c in buildah debootstrap; do
  command -v "$c" >/dev/null || {
    say "$c not found: deploy/install_deps.sh --tests (or apt-get install buildah debootstrap)"; exit 2; }
done
[ -f "$DOCKERFILE" ] || { say "no Dockerfile at $DOCKERFILE"; exit 2; }

# --- 1. the base image -------------------------------------------------------
if buildah inspect --type image "$BASE" >/dev/null 2>&1; then
  say "base image $BASE: present"
else
  start=$SECONDS
  if [ ! -x "$BASE_ROOTFS/bin/bash" ]; then
    say "base image: debootstrap --variant=minbase bookworm $BASE_ROOTFS (a few minutes)"
    rm -rf "$BASE_ROOTFS.tmp"
    "${NICE[@]}" debootstrap --variant=minbase bookworm "$BASE_ROOTFS.tmp" "$MIRROR" >/dev/null \
      || die "base image: debootstrap failed (see $BASE_ROOTFS.tmp/debootstrap/debootstrap.log)"
    # As in the official image: updates and security, no package lists or
    # downloaded .debs left, no resolv.conf (the build's own is mounted).
    rm -f "$BASE_ROOTFS.tmp/etc/apt/sources.list"
    cat > "$BASE_ROOTFS.tmp/etc/apt/sources.list.d/debian.sources" <<'EOF'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    rm -rf "$BASE_ROOTFS.tmp"/var/lib/apt/lists/* "$BASE_ROOTFS.tmp"/var/cache/apt/archives/*.deb
    : > "$BASE_ROOTFS.tmp/etc/resolv.conf"
    mv "$BASE_ROOTFS.tmp" "$BASE_ROOTFS"
  fi
  say "base image: importing $BASE_ROOTFS as $BASE"
  TAR="$(mktemp /var/tmp/ps-debian12.XXXXXX.tar)"
  ctr=""
  trap 'rm -f "$TAR"; [ -n "$ctr" ] && buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
  tar --numeric-owner -C "$BASE_ROOTFS" -cf "$TAR" . || die "base image: tar of $BASE_ROOTFS failed"
  ctr="$(buildah from scratch)" || die "base image: buildah from scratch failed"
  # buildah add unpacks a local tar archive into the container.
  buildah add "$ctr" "$TAR" / >/dev/null || die "base image: buildah add of the root file system failed"
  buildah config --cmd bash --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --os linux --arch amd64 "$ctr" || die "base image: buildah config failed"
  buildah commit --quiet --rm "$ctr" "$BASE" >/dev/null || die "base image: buildah commit failed"
  ctr=""
  rm -f "$TAR"
  say "base image $BASE: made in $((SECONDS - start)) s"
fi

# --- 2. the project's image --------------------------------------------------
say "building $TAG from ${DOCKERFILE#$ROOT/} (buildah bud --layers; cached layers are reused)"
start=$SECONDS
BUD_LOG="$(mktemp)"
trap 'rm -f "$BUD_LOG"' EXIT
# Every line goes to stderr; the log keeps them for the failure message.
if ! "${NICE[@]}" buildah bud --isolation chroot --layers --force-rm --pull-never --format docker \
     -f "$DOCKERFILE" -t "$TAG" "$ROOT" 2>&1 | tee "$BUD_LOG" >&2; then
  # buildah prints each instruction as "[STAGE/STAGES] STEP N/M: ..." before
  # its output: name the last one it reached, and the errors it printed.
  step="$(grep -E '(^|\] )STEP [0-9]+/[0-9]+: ' "$BUD_LOG" | tail -n 1 | cut -c1-300 || true)"
  err="$(grep -E '^(ERROR|Error|error)[: ]|: error: ' "$BUD_LOG" | tail -n 4 | cut -c1-400 || true)"
  die "the image build stopped at ${step:-its start (no STEP reached)}${err:+
$err}"
fi
say "built $TAG in $((SECONDS - start)) s"

# --- 3. what it holds --------------------------------------------------------
size="$(buildah images --format '{{.Size}}' "$TAG" | head -n 1)"
say "image $TAG: $size"
ctr="$(buildah from --pull-never "$TAG")" || die "buildah from $TAG failed"
trap 'buildah rm "$ctr" >/dev/null 2>&1 || true; rm -f "$BUD_LOG"' EXIT
mnt="$(buildah mount "$ctr")" || die "buildah mount failed"
say "binaries in /usr/local/bin:"
(cd "$mnt/usr/local/bin" && ls -l --block-size=K | sed 1d | awk '{print "  " $NF " (" $5 ")"}') >&2
[ -d "$mnt/usr/lib/python3/dist-packages/ps" ] && say "Python package: /usr/lib/python3/dist-packages/ps"
buildah umount "$ctr" >/dev/null
echo "$TAG"
