#!/usr/bin/env bash
# Checks deploy/grafana/ps-dashboard.json: valid JSON with the layout
# Grafana needs (unique panel ids, a Prometheus query in every panel, panels
# inside the 24-column grid), and every query is valid PromQL, by handing
# them to `promtool check rules` as recording rules. That the metric names
# exist is checked against real processes' /metrics in
# tests/http_endpoint_test.sh.
set -uo pipefail
R="${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-}"
DASH="$R/deploy/grafana/ps-dashboard.json"
[ -f "$DASH" ] || DASH="$(dirname "$0")/ps-dashboard.json"
T="${TEST_TMPDIR:-$(mktemp -d)}"
PROMTOOL=/usr/bin/promtool
[ -x "$PROMTOOL" ] || { echo "FAIL: $PROMTOOL missing (deploy/install_deps.sh installs prometheus)"; exit 1; }

python3 - "$DASH" "$T/rules.yml" <<'PY' || exit 1
import json, sys
dash = json.load(open(sys.argv[1]))
errors = []
for key in ("title", "uid", "panels", "templating"):
    if key not in dash: errors.append(f"no '{key}'")
ids, exprs = set(), []
for p in dash.get("panels", []):
    if p.get("id") in ids: errors.append(f"panel id {p.get('id')} twice")
    ids.add(p.get("id"))
    g = p.get("gridPos", {})
    if not all(k in g for k in "hwxy") or g["x"] + g["w"] > 24:
        errors.append(f"panel '{p.get('title')}' outside the grid: {g}")
    if p.get("type") == "row": continue
    targets = p.get("targets", [])
    if not targets: errors.append(f"panel '{p.get('title')}' has no query")
    for t in targets:
        if not t.get("expr"): errors.append(f"panel '{p.get('title')}' has an empty query")
        exprs.append(t.get("expr", ""))
names = [v["name"] for v in dash.get("templating", {}).get("list", [])]
for n in ("datasource", "job"):
    if n not in names: errors.append(f"no template variable '{n}'")
if len(exprs) < 30: errors.append(f"only {len(exprs)} queries")
if errors:
    print("FAIL: " + "\n".join(errors)); sys.exit(1)
# Template variables become what Grafana would substitute.
with open(sys.argv[2], "w") as out:
    out.write("groups:\n- name: dashboard\n  rules:\n")
    for i, e in enumerate(exprs):
        e = e.replace("$job", ".*")
        out.write(f"  - record: dashboard:query{i}\n    expr: {json.dumps(e)}\n")
print(f"{len(ids)} panels, {len(exprs)} queries")
PY
"$PROMTOOL" check rules "$T/rules.yml" >"$T/promtool.out" 2>&1 || {
  echo "FAIL: promtool check rules:"; cat "$T/promtool.out"; exit 1; }
grep -q "SUCCESS: [0-9]* rules found" "$T/promtool.out" || { echo "FAIL: $(cat "$T/promtool.out")"; exit 1; }
cat "$T/promtool.out"
echo PASS
