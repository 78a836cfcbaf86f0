#!/usr/bin/env bash
# The scheduler's /status page with its live parts (scheduler/web/status.js,
# uPlot from /static/), on a real job on loopback (1 scheduler, 2 servers,
# 2 SSP workers, synthetic CTR data, rank 0 evaluating every 300 steps):
#   1. the page's assets are served by the scheduler itself, with their
#      content types; /status.json is JSON;
#   2. once /status.json shows progress above 3%, a few points of
#      loss/worker/0 and an evaluation (metric/test_auc), headless Chromium
#      runs the page's script (--virtual-time-budget) and the DOM it leaves
#      has every chart container drawn (data-series, data-points), the
#      loss chart with loss/worker/0, the metrics chart with
#      metric/test_auc, the progress bar's percentage and an ETA, the
#      "curves since" line and the nodes table (replaced by the script);
#      the script logged no error;
#   3. a screenshot of the page is a real PNG (status-page.png in the test's
#      undeclared outputs, else under $TEST_TMPDIR; its path is printed);
#   4. no request left the machine: Chromium runs with a proxy on a dead
#      loopback port and a resolver that resolves nothing but 127.0.0.1,
#      and its net log shows every request of the page going to the
#      scheduler and every TCP connection (and UDP datagram) to loopback.
set -euo pipefail
source "$TEST_SRCDIR/$TEST_WORKSPACE/tests/testing/test_lib.sh"
source "$TEST_SRCDIR/$TEST_WORKSPACE/tests/testing/http_lib.sh"
OUT_DIR="${TEST_UNDECLARED_OUTPUTS_DIR:-$T/outputs}"
mkdir -p "$OUT_DIR"
FAIL_LOGS='*.log'
FAIL_LOG_LINES=15


# Reads StatusReport JSON on stdin; prints one line of what the wait needs:
# "PROGRESS LOSS0_POINTS AUC_POINTS EXAMPLES_POINTS ETA_KNOWN".
_REPORT_PY='
import json, sys
d = json.load(sys.stdin)
job = d.get("job", {})
n = {s["name"]: len(s.get("t", [])) for s in d.get("series", [])}
print(job.get("progress", 0), n.get("loss/worker/0", 0),
      n.get("metric/test_auc", 0), n.get("examples_per_s", 0),
      1 if "eta_s" in job else 0)
'
# ready_to_draw PORT: /status.json shows progress > 0.03, at least 3 points
# of loss/worker/0 and 2 of examples_per_s, and a test AUC point. Leaves the
# summary line in $T/report.
ready_to_draw() {
  [ "$(http_get "$1" /status.json)" = 200 ] || return 1
  "$PYTHON" -c "$_REPORT_PY" < "$T/body" > "$T/report" 2>/dev/null || return 1
  local progress loss auc examples eta
  read -r progress loss auc examples eta < "$T/report"
  awk "BEGIN { exit !($progress > 0.03 && $loss >= 3 && $auc >= 1 && $examples >= 2) }"
}

CONFIG="$T/job.pbtxt"
# About 50-150 s with -c opt and minutes under ASan: the job must outlast
# both Chromium runs (a job that ended before the screenshot made Chromium's
# page load fail), so it is far longer than the test, which stops it.
cat > "$CONFIG" <<'CONFIG'
name: "status-page-test"
cluster { num_servers: 2 num_workers: 2 num_slots: 256
          heartbeat_interval_ms: 200 heartbeat_timeout_ms: 5000 }
consistency { mode: SSP staleness: 2 }
tables { id: 0 name: "sparse" sparse { dim: 1 }
         optimizer { adagrad { learning_rate: 0.1 initial_accumulator: 1e-6 } }
         init { kind: ZEROS } }
tables { id: 1 name: "dense" dense { size: 14 }
         optimizer { adagrad { learning_rate: 0.1 initial_accumulator: 1e-6 } }
         init { kind: ZEROS } }
data { synthetic_ctr { num_train: 1500000 num_test: 2000 seed: 3 } }
training { batch_size: 256 epochs: 20 log_interval_s: 5 eval_interval_steps: 300
           sparse_table: "sparse" dense_table: "dense" }
CONFIG

start_scheduler "$T" "$CONFIG"
wait_until 10 logged_port "$T/scheduler.log" > /dev/null || fail "no 'http endpoint on' line"
PORT="$(logged_port "$T/scheduler.log")"
URL="http://127.0.0.1:$PORT/status"
echo "scheduler at $ADDRESS, status page $URL"
start_server "$T" "$CONFIG" server0
start_server "$T" "$CONFIG" server1
start_worker "$T" "$CONFIG" worker0
start_worker "$T" "$CONFIG" worker1

# ---- 1. the assets, from the scheduler binary
for asset in "/static/uplot.iife.min.js text/javascript" "/static/status.js text/javascript" \
             "/static/uplot.min.css text/css" "/static/status.css text/css" \
             "/static/uplot.LICENSE text/plain"; do
  path="${asset% *}"
  [ "$(http_get "$PORT" "$path")" = 200 ] || fail "$path is not served"
  grep -qi "^content-type: ${asset#* }" "$T/headers" ||
    fail "$path: $(grep -i '^content-type' "$T/headers"), want ${asset#* }"
done
grep -q "MIT License" "$T/body" || fail "/static/uplot.LICENSE is not uPlot's license"
[ "$(http_get "$PORT" /status)" = 200 ] || fail "/status"
for link in /static/uplot.iife.min.js /static/status.js /static/uplot.min.css /static/status.css \
            'id="tables"' 'id="chart-loss"' '<noscript><meta http-equiv="refresh" content="2"></noscript>'; do
  grep -qF "$link" "$T/body" || fail "/status has no $link"
done
echo "assets served; /status links them (${SECONDS}s)"

# ---- 2. the page, drawn by its script
wait_until 120 ready_to_draw "$PORT" ||
  fail "/status.json never showed progress > 0.03 with curves and a test AUC: $(cat "$T/report" 2>/dev/null)"
read -r progress _ _ _ eta_known < "$T/report"
echo "/status.json: progress $progress, (progress loss0 auc examples eta) = $(cat "$T/report")"
kill -0 "$SCHED_PID" 2>/dev/null || fail "the scheduler exited before Chromium ran"

# Nothing Chromium tries can leave the machine (offline_chromium,
# tests/testing/http_lib.sh); the net log records what it tried.
chrome() {
  offline_chromium --enable-logging=stderr --v=0 --window-size=1300,1900 \
    --virtual-time-budget=6000 "$@"
}
chrome --log-net-log="$T/netlog.json" --dump-dom "$URL" > "$T/status.dom" 2> "$T/chromium.log" ||
  fail "chromium --dump-dom: $(tail -n 5 "$T/chromium.log")"
cp "$T/status.dom" "$OUT_DIR/status-page.html"

# What the script left in the DOM: "ID SERIES POINTS" for each chart
# container (- when not drawn), then "percent TEXT", "progress TEXT",
# "since TEXT", "tables TEXT" (each on one line) and "refreshes N" (how
# often the script replaced the tables).
"$PYTHON" - "$T/status.dom" > "$T/dom.txt" <<'PY'
import html.parser, sys

class Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.charts, self.text, self.stack = [], {}, []
        self.refreshes = "-"
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        i = a.get("id", "")
        if i.startswith("chart-"):
            self.charts.append((i, a.get("data-series", "-"), a.get("data-points", "-")))
        if i == "tables":
            self.refreshes = a.get("data-refreshes", "0")
        if tag in ("area", "base", "br", "col", "embed", "hr", "img", "input",
                   "link", "meta", "source", "track", "wbr"):
            return
        self.stack.append(i)
    def handle_endtag(self, tag):
        if self.stack:
            self.stack.pop()
    def handle_data(self, data):
        for i in ("progress-percent", "progress-text", "charts-since", "tables"):
            if i in self.stack:
                self.text[i] = self.text.get(i, "") + data

p = Page()
p.feed(open(sys.argv[1], encoding="utf-8").read())
for c in p.charts:
    print(*c)
for key, name in (("progress-percent", "percent"), ("progress-text", "progress"),
                  ("charts-since", "since"), ("tables", "tables")):
    print(name, " ".join(p.text.get(key, "").split()))
print("refreshes", p.refreshes)
PY
grep -v '^tables ' "$T/dom.txt"
chart() { awk -v id="chart-$1" '$1 == id { print $2, $3 }' "$T/dom.txt"; }
for id in loss examples wait keys bytes metrics progress; do
  read -r series points <<< "$(chart "$id")"
  [ -n "${series:-}" ] || fail "the page has no #chart-$id"
  [ "$series" != - ] && [ "${points:-0}" -gt 0 ] 2>/dev/null ||
    fail "#chart-$id was not drawn (data-series '$series', data-points '$points')"
done
read -r series points <<< "$(chart loss)"
[[ ",$series," == *,loss/worker/0,* ]] || fail "#chart-loss draws '$series', not loss/worker/0"
[ "$points" -ge 3 ] || fail "#chart-loss has $points points"
read -r series _ <<< "$(chart examples)"
[ "$series" = examples_per_s ] || fail "#chart-examples draws '$series'"
read -r series _ <<< "$(chart metrics)"
[[ ",$series," == *,metric/test_auc,* ]] || fail "#chart-metrics draws '$series', not metric/test_auc"
grep -qE '^percent [0-9]+\.[0-9]%$' "$T/dom.txt" || fail "no percentage on the progress bar"
if [ "$eta_known" = 1 ]; then
  grep -qE '^progress ETA [0-9]+[dhms]' "$T/dom.txt" || fail "no ETA in the progress line"
else
  grep -qE '^progress ETA (unknown|[0-9]+[dhms])' "$T/dom.txt" || fail "no ETA in the progress line"
fi
grep -qE '^progress .*steps [0-9,]+ / ~?[0-9,]+ .*examples/s.*test AUC 0\.[0-9]{4}' "$T/dom.txt" ||
  fail "the progress line lacks steps, examples/s or the test AUC"
grep -qE '^since curves since [0-9]{4}-[0-9]{2}-[0-9]{2} ' "$T/dom.txt" || fail "no 'curves since' line"
for node in server/0 server/1 worker/0 worker/1 status-page-test RUNNING; do
  grep -E '^tables ' "$T/dom.txt" | grep -qF "$node" || fail "the page's tables have no '$node'"
done
grep -qE '^refreshes [1-9]' "$T/dom.txt" || fail "the script never replaced the tables"
# Console errors (an exception in the script) are logged as CONSOLE lines.
# Chromium logs an exception the page did not catch as
#   INFO:CONSOLE:12] "Uncaught TypeError: ...", source: http://...
! grep -E 'CONSOLE[^"]*"Uncaught' "$T/chromium.log" ||
  fail "the page's script failed: $(grep -E 'CONSOLE' "$T/chromium.log" | head -n 5)"
echo "the script drew every chart, the progress and the ETA (${SECONDS}s)"

# ---- 3. screenshot
kill -0 "$SCHED_PID" 2>/dev/null || fail "the scheduler exited before the screenshot"
PNG="$OUT_DIR/status-page.png"
chrome --screenshot="$PNG" "$URL" > /dev/null 2> "$T/chromium-shot.log" ||
  fail "chromium --screenshot: $(tail -n 5 "$T/chromium-shot.log")"
[ "$(head -c 4 "$PNG" | od -An -c | tr -d ' ')" = "211PNG" ] || fail "screenshot is not a PNG"
size="$(stat -c %s "$PNG")"
# Tables alone make about 60 KB at this size; seven charts add more.
[ "$size" -gt 80000 ] || fail "screenshot is only $size bytes"
echo "screenshot: $PNG ($size bytes) (${SECONDS}s)"

# ---- 4. nothing left the machine
"$PYTHON" - "$T/netlog.json" "$PORT" > "$T/netlog.txt" <<'PY' || fail "net log: $(cat "$T/netlog.txt")"
import json, sys

log = json.load(open(sys.argv[1]))
page = "http://127.0.0.1:%s" % sys.argv[2]
names = {v: k for k, v in log["constants"]["logEventTypes"].items()}
loopback = ("127.0.0.1:", "[::1]:")
bad, page_urls, browser_urls, udp = [], set(), set(), {}
for e in log["events"]:
    kind, p = names.get(e["type"], "?"), e.get("params", {})
    if kind == "URL_REQUEST_START_JOB" and "url" in p:
        initiator = p.get("initiator", "")
        if initiator == page or p.get("request_type") == "main frame":
            page_urls.add(p["url"])
        elif not p["url"].startswith(page + "/"):
            browser_urls.add(p["url"].split("?")[0])
    # A connection's end event carries no address, only its outcome.
    if kind == "TCP_CONNECT_ATTEMPT" and "address" in p and not p["address"].startswith(loopback):
        bad.append("TCP connection to %s" % p.get("address"))
    if kind == "UDP_CONNECT":
        udp[e["source"]["id"]] = p.get("address", "")
    # A UDP socket connected but never sent on sends nothing: Chromium's
    # resolver connects one to a public IPv6 address to learn whether IPv6
    # is routed.
    if kind == "UDP_BYTES_SENT":
        to = p.get("address") or udp.get(e["source"]["id"], "")
        if not to.startswith(loopback):
            bad.append("UDP datagram to %s" % to)
for url in sorted(page_urls):
    if not url.startswith(page + "/"):
        bad.append("the page requested %s" % url)
for b in bad:
    print(b)
print("page requests: %d URLs, all %s/..." % (len(page_urls), page))
print("Chromium's own requests (to the dead proxy): %s" % (", ".join(sorted(browser_urls)) or "none"))
needed = {page + p for p in ("/status", "/status.json", "/static/status.js", "/static/uplot.iife.min.js")}
missing = needed - page_urls
if missing:
    print("the net log lacks %s" % ", ".join(sorted(missing)))
sys.exit(1 if bad or missing else 0)
PY
cat "$T/netlog.txt"
echo "net log checked (${SECONDS}s)"

# ---- the end: stop the job (the other tests check exit codes), workers
# first and the scheduler last, as an operator would: a worker stopped after
# its scheduler spends its leave RPC's deadline on a dead address.
for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
  kill -TERM "${PIDS[i]}" 2>/dev/null || true
  wait_exit "${PIDS[i]}" 30 || true
done
PIDS=()
echo PASS "(${SECONDS}s)"
