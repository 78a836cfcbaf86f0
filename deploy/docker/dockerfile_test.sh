#!/usr/bin/env bash
# Checks deploy/docker/Dockerfile without a Docker daemon: every target it
# builds is a binary this test was given (built here with the same
# --config), each binary loads only libraries of packages that its runtime
# stage installs (runtime_packages.txt) or that debian:12 already has, and
# every package named there exists in Debian 12 (is installed here, as the
# -dev packages of deploy/install_deps.sh depend on them).
set -euo pipefail
R="$TEST_SRCDIR/$TEST_WORKSPACE"
DOCKERFILE="$R/deploy/docker/Dockerfile"
PACKAGES_FILE="$R/deploy/docker/runtime_packages.txt"
# Every package of a debian:12 (minbase) image that these binaries use.
BASE=(libc6 libgcc-s1 libstdc++6)
# A sanitizer build (.bazelrc sets PS_SANITIZER) links gcc's sanitizer
# runtimes, which the image (always --config=opt) never needs.
[ "${PS_SANITIZER:-0}" = 1 ] && BASE+=(libasan8 libubsan1 libtsan2 liblsan0)
failed=0
fail() { echo "FAIL: $*"; failed=1; }

grep -q '^FROM debian:12 AS build$' "$DOCKERFILE" || fail "no 'FROM debian:12 AS build' stage"
grep -q '^FROM debian:12$' "$DOCKERFILE" || fail "no debian:12 runtime stage"
grep -q 'deploy/install_deps.sh' "$DOCKERFILE" || fail "the build stage does not run deploy/install_deps.sh"
grep -q 'runtime_packages.txt' "$DOCKERFILE" || fail "the runtime stage does not install runtime_packages.txt"

TARGETS="$(sed -n 's/^ARG PS_TARGETS="\(.*\)"$/\1/p' "$DOCKERFILE")"
[ -n "$TARGETS" ] || { echo "FAIL: no ARG PS_TARGETS=\"...\" line in the Dockerfile"; exit 1; }
BINARIES=()
for t in $TARGETS; do
  # The same path the Dockerfile copies from bazel-bin.
  p="${t#//}"
  b="$R/${p%%:*}/${p##*:}"
  if [ -x "$b" ]; then BINARIES+=("$b"); else
    fail "$t: not built for this test (add it to data in deploy/docker/BUILD)"; fi
done
echo "binaries: ${#BINARIES[@]} of $(echo $TARGETS | wc -w) targets"

mapfile -t LISTED < <(sed 's/#.*//' "$PACKAGES_FILE" | tr -s ' \t' '\n' | sed '/^$/d')
[ ${#LISTED[@]} -gt 0 ] || fail "runtime_packages.txt names no package"
# One dpkg call for all packages and one for all libraries: each call
# reads dpkg's whole database.
installed="$(dpkg-query -W -f='${Package} ${Status}\n' "${LISTED[@]}" 2>/dev/null || true)"
for p in "${LISTED[@]}"; do
  grep -qx "$p install ok installed" <<< "$installed" \
    || fail "runtime_packages.txt: '$p' is not an installed Debian package"
done

# Library path -> binaries loading it.
declare -A users=()
for b in "${BINARIES[@]}"; do
  out="$(ldd "$b")" || { fail "ldd $b failed"; continue; }
  if grep -q "not found" <<< "$out"; then fail "$b: $(grep 'not found' <<< "$out" | tr -s ' \t' ' ')"; fi
  while read -r lib; do
    users[$lib]="${users[$lib]:-} $(basename "$b")"
  done < <(awk '$2 == "=>" && $3 ~ /^\// {print $3}' <<< "$out")
done
# ldd prints /lib paths that dpkg may know under /usr/lib (merged /usr) or
# only behind a symlink (alternatives such as libopenblas.so.0): the
# candidates for each library, in order.
candidates() {
  local real
  real="$(readlink -f "$1")"
  printf '%s\n' "$1" "/usr$1" "${1#/usr}" "$real" "${real#/usr}"
}
declare -A owner=()
while IFS= read -r line; do
  owner[${line#*: }]="${line%%:*}"
done < <(for lib in "${!users[@]}"; do candidates "$lib"; done | sort -u \
           | xargs dpkg -S 2>/dev/null | grep -v ', ' || true)
declare -A needed_by=()
for lib in "${!users[@]}"; do
  pkg=""
  while read -r c; do
    [ -n "${owner[$c]:-}" ] && { pkg="${owner[$c]}"; break; }
  done < <(candidates "$lib")
  [ -n "$pkg" ] || { fail "$lib (loaded by${users[$lib]}) belongs to no Debian package"; continue; }
  needed_by[$pkg]="${needed_by[$pkg]:-}${users[$lib]}"
done
[ ${#needed_by[@]} -gt 0 ] || fail "no library found in any binary"
for pkg in "${!needed_by[@]}"; do
  ok=0
  for p in "${LISTED[@]}" "${BASE[@]}"; do [ "$p" = "$pkg" ] && ok=1; done
  [ $ok -eq 1 ] || fail "package $pkg (needed by$(tr ' ' '\n' <<< "${needed_by[$pkg]}" | sort -u | tr '\n' ' ')) is not in runtime_packages.txt"
done
echo "runtime packages needed: $(printf '%s\n' "${!needed_by[@]}" | sort | tr '\n' ' ')"
[ $failed -eq 0 ] && echo PASS
exit $failed
