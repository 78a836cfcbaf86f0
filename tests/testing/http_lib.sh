# HTTP helpers for the shell tests of the processes' HTTP endpoints
# (common/http_endpoint.h): source after tests/testing/test_lib.sh, which
# sets $T.

# http_get PORT PATH: the body goes to $T/body, the headers to $T/headers,
# the status code to stdout (000 when nothing answered). Plain bash
# (/dev/tcp), no client needed.
http_get() {
  (
    exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 0
    printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' "$2" >&3
    cat <&3 > "$T/response"
  ) 2>/dev/null || true
  if [ ! -s "$T/response" ]; then
    : > "$T/body"
    : > "$T/headers"
    echo 000
    return
  fi
  sed '1,/^\r$/d' "$T/response" > "$T/body"
  sed -n '1,/^\r$/p' "$T/response" | tr -d '\r' > "$T/headers"
  head -n 1 "$T/response" | awk '{print $2}'
  rm -f "$T/response"
}

# logged_port LOG: prints the port the process logged ("http endpoint on
# http://H:P"); fails if it has not logged it yet.
logged_port() {
  sed -n 's|.*http endpoint on http://[^ ]*:\([0-9][0-9]*\).*|\1|p' "$1" | head -n 1 | grep .
}

# offline_chromium ARGS...: headless Chromium (/usr/bin/chromium; Bazel
# runs tests with a fixed PATH, and deploy/install_deps.sh installs it) with
# its home and profile under $T, unable to reach anything off loopback:
# every host but 127.0.0.1 resolves to nothing, and every request that is
# not for loopback goes to a proxy on port 9 of loopback, where nothing
# listens. So nothing it tries (a page's requests, or its own update and
# account checks) leaves the machine.
offline_chromium() {
  mkdir -p "$T/home" "$T/chrome"
  HOME="$T/home" XDG_CONFIG_HOME="$T/home/.config" XDG_CACHE_HOME="$T/home/.cache" \
    timeout 90 /usr/bin/chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage \
    --no-first-run --no-default-browser-check --hide-scrollbars \
    --disable-background-networking --disable-component-update --disable-sync \
    --disable-extensions --disable-default-apps --disable-features=Translate,MediaRouter \
    --proxy-server=http://127.0.0.1:9 \
    --host-resolver-rules="MAP * ~NOTFOUND, EXCLUDE 127.0.0.1" \
    --user-data-dir="$T/chrome" "$@"
}
