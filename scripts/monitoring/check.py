#!/usr/bin/env python3
"""Checks for toolgate's monitoring assets, used by scripts/monitoring-check.sh.

Subcommands:
  static      validate the Grafana dashboard, the alert rules and the runbook; parse every PromQL
              expression (dashboard panels, template variables, alert rules and their operands)
              and write them, with their series selectors, to a JSON file, plus a rules file that
              lets `promtool check rules` parse them offline
  render      write the temporary toolgate and Prometheus configs for the end-to-end check
  wait-query  poll Prometheus until an expression returns series
  query       check the selectors against the metric families a running toolgate exposes, then run
              every extracted expression against a live Prometheus and report

Expressions are parsed by `promql_parser` (a PromQL parser, from PyPI) for their structure
(selectors, alert operands); Prometheus itself is the judge of validity: promtool parses them
offline, the query API refuses an invalid one, and `query` checks that Prometheus formats each
expression exactly as it formats the parser's rendering of it, so both read it alike.
The metric families are not listed here: `query` reads them from toolgate's /metrics.
"""

import argparse
import json
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

SEVERITIES = {"critical", "warning", "info"}
# Grafana variables → values that select everything, for querying outside Grafana.
LABEL_VARIABLES = {"namespace": ".*", "pod": ".*", "tool": ".*"}
OTHER_VARIABLES = {
    "__rate_interval": "1m",
    "__interval": "15s",
    "__range": "1h",
    "__range_s": "3600",
    "__range_ms": "3600000",
    "__interval_ms": "15000",
}
# The dashboard's filters: every toolgate selector in a panel carries these matchers (the tool
# one only when its family has a tool label).
PANEL_FILTERS = {"namespace": "$namespace", "pod": "$pod", "tool": "$tool"}


class Failures:
    def __init__(self):
        self.items = []

    def add(self, where, what):
        self.items.append(f"{where}: {what}")

    def report(self, title):
        if self.items:
            print(f"FAIL {title}:", file=sys.stderr)
            for item in self.items:
                print(f"  - {item}", file=sys.stderr)
            return False
        return True


def load_yaml(path):
    try:
        import yaml
    except ImportError:
        sys.exit("check.py: PyYAML is needed (scripts/monitoring-check.sh sets up .venv with it)")
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


# ---------------------------------------------------------------------------------------------
# PromQL: Grafana variables, and the structure the parser gives.


def substitute(expr, keep_labels=False):
    """Replace Grafana variables ($name, ${name}, ${name:fmt}) with select-everything values.

    keep_labels leaves the label variables ($namespace, $pod, $tool) as they are: inside a
    quoted matcher value they are plain text to PromQL, so the dashboard's filters can be read
    off the parsed selectors.
    """

    def repl(m):
        name = m.group(1) or m.group(2)
        if name in LABEL_VARIABLES:
            return m.group(0) if keep_labels else LABEL_VARIABLES[name]
        if name in OTHER_VARIABLES:
            return OTHER_VARIABLES[name]
        raise ValueError(f"unknown variable ${name}")

    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", repl, expr)


def promql():
    try:
        import promql_parser
    except ImportError:
        sys.exit("check.py: promql_parser is needed (scripts/monitoring-check.sh sets up .venv with it)")
    return promql_parser


def parse(expr):
    """(AST, None) or (None, parse error)."""
    try:
        return promql().parse(expr), None
    except ValueError as e:
        return None, str(e)


def match_op(op):
    p = promql()
    for known, text in ((p.MatchOp.Equal, "="), (p.MatchOp.NotEqual, "!="), (p.MatchOp.Re, "=~"),
                        (p.MatchOp.NotRe, "!~")):
        if op == known:
            return text
    raise ValueError(f"unknown matcher operator {op!r}")


def selectors(ast):
    """Every vector selector: {"name": metric name or "", "matchers": [[label, op, value]]}."""
    p = promql()
    found = []

    def visit(node):
        if isinstance(node, p.VectorSelector):
            ms = [[m.name, match_op(m.op), m.value] for m in node.matchers.matchers
                  if m.name != "__name__"]
            for alternative in node.matchers.or_matchers or []:
                ms += [[m.name, match_op(m.op), m.value] for m in alternative]
            found.append({"name": node.name or "", "matchers": ms})

    p.walk(ast, visit)
    return found


# Binary operators an alert expression is split at: its operands are queried one by one.
SPLIT_OPS = {"or", "and", "unless", "==", "!=", ">=", "<=", ">", "<"}


def operands(ast):
    """The vector operands of an alert expression: split at or, and/unless and comparisons."""
    p = promql()
    while isinstance(ast, p.ParenExpr):
        ast = ast.expr
    if isinstance(ast, p.BinaryExpr) and str(ast.op) in SPLIT_OPS:
        return operands(ast.lhs) + operands(ast.rhs)
    if isinstance(ast, p.NumberLiteral):
        return []
    return [ast]


def unwrap(ast):
    p = promql()
    while isinstance(ast, p.ParenExpr):
        ast = ast.expr
    return ast


def expression(source, kind, expr, fails, where, label_expr=None, **extra):
    """One entry of the JSON list: the query text, the parser's rendering, the selectors."""
    ast, err = parse(expr)
    if err:
        fails.add(where, f"does not parse: {err}: {expr}")
        return None, None
    sel_ast = ast
    if label_expr is not None:
        sel_ast, err = parse(label_expr)
        if err:
            fails.add(where, f"does not parse with its variables: {err}")
            return None, None
    entry = {"source": source, "kind": kind, "expr": expr, "rendered": str(ast),
             "selectors": selectors(sel_ast), **extra}
    return entry, ast


# ---------------------------------------------------------------------------------------------
# static


def walk_panels(panels):
    for p in panels:
        yield p
        yield from walk_panels(p.get("panels", []))


def check_dashboard(path, fails, exprs):
    try:
        with open(path, encoding="utf-8") as f:
            dash = json.load(f)
    except (OSError, ValueError) as e:
        fails.add(path, f"not valid JSON: {e}")
        return
    where = "dashboard"
    if not isinstance(dash.get("schemaVersion"), int) or dash["schemaVersion"] < 36:
        fails.add(where, "schemaVersion missing or older than 36")
    for key in ("uid", "title", "panels", "templating"):
        if key not in dash:
            fails.add(where, f"missing {key}")
    variables = {v.get("name"): v for v in dash.get("templating", {}).get("list", [])}
    ds = variables.get("datasource")
    if not ds or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        fails.add(where, "needs a `datasource` template variable of type datasource, query prometheus")
    for name in ("namespace", "pod", "tool"):
        v = variables.get(name)
        if not v or v.get("type") != "query":
            fails.add(where, f"needs a query template variable `{name}`")
            continue
        if (v.get("datasource") or {}).get("uid") != "${datasource}":
            fails.add(f"variable {name}", "datasource must be ${datasource}")
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        # label_values(...) is Grafana's templating syntax around a PromQL selector.
        m = re.fullmatch(r"\s*label_values\((.+),\s*(\w+)\s*\)\s*", q or "")
        if not m or not m.group(1).strip().startswith("toolgate_invocations_total") or m.group(2) != name:
            fails.add(f"variable {name}",
                      f"expected label_values(toolgate_invocations_total…, {name}), got {q!r}")
            continue
        if v.get("includeAll") and v.get("allValue") != ".*":
            fails.add(f"variable {name}", 'allValue must be ".*" so "All" also matches')
        try:
            expr = f"group by ({name}) ({substitute(m.group(1).strip())})"
        except ValueError as e:
            fails.add(f"variable {name}", str(e))
            continue
        entry, _ = expression(f"variable {name}", "variable", expr, fails, f"variable {name}")
        if entry:
            exprs.append(entry)

    ids, boxes = set(), []
    for p in walk_panels(dash.get("panels", [])):
        title = p.get("title") or f"panel {p.get('id')}"
        pw = f"panel {title!r}"
        if p.get("id") in ids:
            fails.add(pw, f"duplicate id {p.get('id')}")
        ids.add(p.get("id"))
        g = p.get("gridPos") or {}
        if not all(isinstance(g.get(k), int) for k in "xywh") or g["x"] < 0 or g["x"] + g["w"] > 24:
            fails.add(pw, f"bad gridPos {g}")
        else:
            for other, og in boxes:
                if (g["x"] < og["x"] + og["w"] and og["x"] < g["x"] + g["w"]
                        and g["y"] < og["y"] + og["h"] and og["y"] < g["y"] + g["h"]):
                    fails.add(pw, f"overlaps panel {other!r}")
            boxes.append((title, g))
        if p.get("type") == "row":
            continue
        if (p.get("datasource") or {}).get("uid") != "${datasource}":
            fails.add(pw, "datasource must be ${datasource}")
        targets = p.get("targets") or []
        if not targets:
            fails.add(pw, "no queries")
        refs = [t.get("refId") for t in targets]
        if len(set(refs)) != len(refs) or None in refs:
            fails.add(pw, f"refIds missing or repeated: {refs}")
        for t in targets:
            tw = f"{pw} [{t.get('refId')}]"
            raw = (t.get("expr") or "").strip()
            if not raw:
                fails.add(tw, "empty expr")
                continue
            if (t.get("datasource") or {}).get("uid") not in (None, "${datasource}"):
                fails.add(tw, "datasource must be ${datasource}")
            try:
                expr, labelled = substitute(raw), substitute(raw, keep_labels=True)
            except ValueError as e:
                fails.add(tw, str(e))
                continue
            entry, _ = expression(f"{title} [{t.get('refId')}]", "panel", expr, fails, tw,
                                  label_expr=labelled)
            if entry:
                exprs.append(entry)


def runbook_anchors(path):
    """GitHub-style anchors of the runbook's headings."""
    anchors = set()
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"#{1,6}\s+(.*?)\s*$", line)
            if m:
                text = re.sub(r"[^\w\- ]", "", m.group(1).lower())
                anchors.add(text.replace(" ", "-"))
    return anchors


def runbook_alert_sections(path):
    with open(path, encoding="utf-8") as f:
        return {m.group(1) for m in re.finditer(r"^##\s+(\S+)\s*$", f.read(), re.M)}


def check_rules(rules_path, tests_path, runbook_path, fails, exprs):
    doc = load_yaml(rules_path)
    anchors = runbook_anchors(runbook_path)
    alerts = []
    for group in doc.get("groups") or []:
        for rule in group.get("rules") or []:
            if "alert" not in rule:
                continue
            name = rule["alert"]
            w = f"alert {name}"
            if name in alerts:
                fails.add(w, "defined twice")
            alerts.append(name)
            labels = rule.get("labels") or {}
            if labels.get("severity") not in SEVERITIES:
                fails.add(w, f"severity label must be one of {sorted(SEVERITIES)}")
            ann = rule.get("annotations") or {}
            for key in ("summary", "description", "runbook_url"):
                if not str(ann.get(key) or "").strip():
                    fails.add(w, f"missing annotation {key}")
            url = str(ann.get("runbook_url") or "")
            m = re.fullmatch(r"docs/runbook\.md#([\w-]+)", url)
            if not m:
                fails.add(w, f"runbook_url {url!r} is not docs/runbook.md#<anchor>")
            elif m.group(1) not in anchors:
                fails.add(w, f"runbook has no section #{m.group(1)}")
            expr = str(rule.get("expr") or "").strip()
            entry, ast = expression(f"alert {name}", "alert", expr, fails, w, alert=name)
            if not entry:
                continue
            exprs.append(entry)
            ops = operands(ast)
            if len(ops) > 1 or (ops and str(ops[0]) != str(unwrap(ast))):
                for i, op in enumerate(ops, 1):
                    sub, _ = expression(f"alert {name} operand {i}", "operand", str(op), fails,
                                        f"{w} operand {i}", alert=name)
                    if sub:
                        exprs.append(sub)
    sections = runbook_alert_sections(runbook_path)
    for name in sorted(sections - set(alerts)):
        fails.add("runbook", f"section {name} has no alert")

    tests = load_yaml(tests_path)
    cases = {}
    for test in tests.get("tests") or []:
        for case in test.get("alert_rule_test") or []:
            fires = bool(case.get("exp_alerts"))
            cases.setdefault(case.get("alertname"), set()).add(fires)
    for name in alerts:
        got = cases.get(name, set())
        if True not in got:
            fails.add(f"alert {name}", "no unit test where it fires")
        if False not in got:
            fails.add(f"alert {name}", "no unit test where it does not fire")
    for name in sorted(set(cases) - set(alerts)):
        fails.add("rule tests", f"test for unknown alert {name}")
    return alerts


def cmd_static(args):
    fails, exprs = Failures(), []
    check_dashboard(args.dashboard, fails, exprs)
    alerts = check_rules(args.rules, args.rule_tests, args.runbook, fails, exprs)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(exprs, f, indent=1)
    # JSON is YAML: one recording rule per expression (as written, and as the parser renders
    # it) lets promtool parse them all offline.
    rules = []
    for i, e in enumerate(exprs):
        rules.append({"record": f"monitoring_check:expr_{i}", "expr": e["expr"]})
        rules.append({"record": f"monitoring_check:rendered_{i}", "expr": e["rendered"]})
    with open(args.promtool_rules, "w", encoding="utf-8") as f:
        json.dump({"groups": [{"name": "extracted", "rules": rules}]}, f, indent=1)
    counts = {}
    for e in exprs:
        counts[e["kind"]] = counts.get(e["kind"], 0) + 1
    print(f"static: {len(exprs)} expressions parsed "
          f"({', '.join(f'{v} {k}' for k, v in sorted(counts.items()))}); {len(alerts)} alerts")
    return 0 if fails.report("static checks") else 1


# ---------------------------------------------------------------------------------------------
# render: temporary configs for the end-to-end check


def cmd_render(args):
    import yaml

    cfg = load_yaml(args.toolgate_config)
    cfg["listen"] = {"agent": f"127.0.0.1:{args.agent_port}", "admin": f"127.0.0.1:{args.admin_port}",
                     "telemetry": f"127.0.0.1:{args.telemetry_port}"}
    cfg.setdefault("store", {})["kind"] = "memory"
    cfg["store"].pop("nodes", None)
    for rewrite in args.upstream or []:
        old, new = rewrite.split("=", 1)
        hits = 0
        for tool in cfg.get("tools") or []:
            if tool.get("upstream", "").startswith(old):
                tool["upstream"] = new + tool["upstream"][len(old):]
                hits += 1
        if not hits:
            sys.exit(f"render: no tool upstream starts with {old}")
    with open(args.toolgate_out, "w", encoding="utf-8") as f:
        yaml.safe_dump(cfg, f, sort_keys=False)

    prom = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [args.rules],
        "scrape_configs": [{
            "job_name": "toolgate",
            "static_configs": [{
                "targets": [f"127.0.0.1:{args.telemetry_port}"],
                # In Kubernetes these come from target relabeling; the dashboard filters on them.
                "labels": {"namespace": "local", "pod": "toolgate-local"},
            }],
        }],
    }
    with open(args.prometheus_out, "w", encoding="utf-8") as f:
        json.dump(prom, f, indent=1)
    return 0


# ---------------------------------------------------------------------------------------------
# toolgate's metric families


def http_get(url, timeout=5.0):
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.status, resp.read()


SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+\S+")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="(?:[^"\\]|\\.)*"')
# The series each family type is exported as (text format and OpenMetrics).
SUFFIXES = {
    "counter": ["_total", "_created"],
    "histogram": ["_bucket", "_sum", "_count", "_created"],
    "summary": ["", "_sum", "_count", "_created"],
    "gauge": [""],
    "info": ["_info"],
    "stateset": [""],
    "gaugehistogram": ["_bucket", "_gsum", "_gcount"],
    "unknown": [""],
    "untyped": [""],
}


def read_families(url):
    """The metric families of the exposition at `url` (parse_families)."""
    _, body = http_get(url)
    return parse_families(body.decode())


def parse_families(text):
    """{family: {"type", "series": set of exported names, "labels": set}} from `# TYPE` lines."""
    families, series = {}, {}
    for line in text.splitlines():
        m = re.match(r"#\s*TYPE\s+(\S+)\s+(\S+)", line)
        if m:
            name, kind = m.groups()
            names = {name + s for s in SUFFIXES.get(kind, [""])}
            if kind == "counter" and name.endswith("_total"):
                names.add(name)  # the text format names a counter family with its suffix
            families[name] = {"type": kind, "series": names, "labels": set()}
            for n in names:
                series[n] = name
            continue
        m = SAMPLE.match(line)
        if m and m.group(1) in series:
            labels = set(LABEL.findall(m.group(2) or "")) - {"le", "quantile"}
            families[series[m.group(1)]]["labels"] |= labels
    return families


def check_selectors(exprs, families, fails):
    """Selector names are toolgate's series, panels filter as the dashboard's variables say,
    and every family is shown by a panel."""
    series = {n: fam for fam, f in families.items() for n in f["series"]}
    used = set()
    for e in exprs:
        w = e["source"]
        own = [s for s in e["selectors"] if s["name"].startswith("toolgate_")]
        if e["kind"] == "panel" and not own:
            fails.add(w, "queries no toolgate metric")
        for s in own:
            fam = series.get(s["name"])
            if fam is None:
                fails.add(w, f"{s['name']} is not a series toolgate exports (its /metrics)")
                continue
            if e["kind"] != "panel":
                continue
            used.add(fam)
            need = ["namespace", "pod"] + (["tool"] if "tool" in families[fam]["labels"] else [])
            have = {(label, op, value) for label, op, value in s["matchers"]}
            for label in need:
                if (label, "=~", PANEL_FILTERS[label]) not in have:
                    fails.add(w, f'{s["name"]} selector lacks {label}=~"{PANEL_FILTERS[label]}"')
    for fam in sorted(f for f in families if f.startswith("toolgate_")):
        if fam not in used:
            fails.add("dashboard", f"no panel shows {fam} ({families[fam]['type']})")
    return used


# ---------------------------------------------------------------------------------------------
# Prometheus


def prom_query(base, expr):
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        _, body = http_get(url, timeout=10)
    except urllib.error.HTTPError as e:
        body = e.read()
    doc = json.loads(body)
    if doc.get("status") != "success":
        return None, f"{doc.get('errorType')}: {doc.get('error')}"
    data = doc["data"]
    if data["resultType"] in ("vector", "matrix"):
        return data["result"], None
    return [{"metric": {}, "value": data["result"]}], None  # scalar or string


def prom_format(base, expr):
    """Prometheus' own formatting of expr (its parser's canonical text), or None, error."""
    url = f"{base}/api/v1/format_query?" + urllib.parse.urlencode({"query": expr})
    try:
        _, body = http_get(url, timeout=10)
    except urllib.error.HTTPError as e:
        body = e.read()
    doc = json.loads(body)
    if doc.get("status") != "success":
        return None, f"{doc.get('errorType')}: {doc.get('error')}"
    return doc["data"], None


def cmd_wait_query(args):
    base = args.prometheus.rstrip("/")
    deadline = time.monotonic() + args.timeout
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            series, err = prom_query(base, args.expr)
            if err:
                print(f"wait-query: {args.expr}: {err}", file=sys.stderr)
                return 1
            if series:
                return 0
            last = "empty result"
        except (OSError, ValueError) as e:
            last = str(e)
        time.sleep(0.5)
    print(f"wait-query: {args.expr}: {last} after {args.timeout}s", file=sys.stderr)
    return 1


# ---------------------------------------------------------------------------------------------
# query: every expression against a live Prometheus

# Expressions that may be empty in a healthy scenario on the memory store, each with the reason.
# Matched against the expression text (after variable substitution) or, for alerts, the name.
ALLOWED_EMPTY_ALERTS = {
    "ToolgateResultTooLarge": "fires above 1/min sustained for 10m; the scenario causes a handful",
    "ToolgateStoreUnavailable": "the memory store is always available",
    "ToolgateStoreErrors": "the memory store does not fail",
    "ToolgateToolErrorShareHigh": "needs at least 20 calls of one tool in 10m",
    "ToolgateLatencyP99High": "sample tools answer well under 5s",
    "ToolgateUnknownFailureLayer": "every error code maps to a layer",
    "ToolgatePolicyDenialsSpike": "fires above 1 denial/min sustained; the scenario causes one",
    "ToolgateConnectionsRefused": "needs a listener at its cap with every connection busy",
}
ALLOWED_EMPTY_EXPRS = [
    ("toolgate_store_errors_total", "the memory store does not fail"),
    ('code="STORE_UNAVAILABLE"', "the memory store is always available"),
    ('layer="UNKNOWN"', "every error code maps to a layer; UNKNOWN means a toolgate defect"),
]
RELOAD_ALLOWED = ("toolgate_config_reloads_total", "the config reload step was skipped")
# Alerts the scenario must leave silent (neither pending nor firing).
# One denied call is an agent straying, not a spike; the scenario never fills a listener.
MUST_NOT_ALERT = ["ToolgateStoreUnavailable", "ToolgateStoreErrors", "ToolgateUnknownFailureLayer",
                  "ToolgatePolicyDenialsSpike", "ToolgateConnectionsRefused"]


def allowed_empty(e, reload_done):
    if e["kind"] == "alert" and e["alert"] in ALLOWED_EMPTY_ALERTS:
        return ALLOWED_EMPTY_ALERTS[e["alert"]]
    for needle, reason in ALLOWED_EMPTY_EXPRS:
        if needle in e["expr"]:
            return reason
    if not reload_done and RELOAD_ALLOWED[0] in e["expr"]:
        return RELOAD_ALLOWED[1]
    return None


def cmd_query(args):
    with open(args.exprs, encoding="utf-8") as f:
        exprs = json.load(f)
    base = args.prometheus.rstrip("/")
    fails = Failures()

    families = read_families(args.metrics)
    own = sorted(f for f in families if f.startswith("toolgate_"))
    print(f"  toolgate exposes {len(own)} metric families: {', '.join(own)}")
    used = check_selectors(exprs, families, fails)
    print(f"  the dashboard shows {len(used)} of them")
    # The parser that found the selectors and operands must read each expression as Prometheus
    # does: Prometheus formats the original and the parser's rendering to the same text.
    agreed = 0
    for e in exprs:
        a, err_a = prom_format(base, e["expr"])
        b, err_b = prom_format(base, e["rendered"])
        if err_a or err_b:
            fails.add(e["source"], f"Prometheus refuses it: {err_a or err_b}")
        elif a != b:
            fails.add(e["source"], f"the parser read it otherwise than Prometheus: {a!r} vs {b!r}")
        else:
            agreed += 1
    print(f"  Prometheus formats {agreed} of {len(exprs)} expressions as the parser reads them")
    if not fails.report("selectors and parsing"):
        return 1

    deadline = time.monotonic() + args.timeout
    while True:
        results, invalid, missing = [], [], []
        for e in exprs:
            series, err = prom_query(base, e["expr"])
            n = len(series or [])
            reason = allowed_empty(e, args.reload_done)
            if not err and e["kind"] == "variable":
                # The variable's label must be set on every series, or its filter cannot match.
                label = e["source"].split()[-1]
                values = sorted({s["metric"].get(label, "") for s in series})
                if "" in values:
                    err = f"series without a {label} label: is the scrape attaching it?"
                else:
                    e = dict(e, source=f"{e['source']} = {', '.join(values)}")
            results.append((e, n, err, reason))
            if err:
                invalid.append(e)
            elif n == 0 and not reason:
                missing.append(e)
        alert_problems = check_alerts(base, args.reload_done)
        if invalid or (not missing and not alert_problems) or time.monotonic() >= deadline:
            break
        time.sleep(1)

    for e, n, err, reason in results:
        if err:
            state = f"INVALID: {err}"
        elif n:
            state = f"ok, {n} series"
        elif reason:
            state = f"empty, allowed: {reason}"
        else:
            state = "EMPTY: the scenario should have produced series"
        print(f"  {e['source']:<48} {state}")
        if err or (n == 0 and not reason):
            print("      " + " ".join(e["expr"].split()))
    for p in alert_problems:
        print(f"  alert check: {p}")
    nonempty = sum(1 for _, n, err, _ in results if not err and n)
    print(f"{len(results)} expressions checked, {nonempty} non-empty, "
          f"{len(invalid)} invalid, {len(missing)} unexpectedly empty")
    return 0 if not invalid and not missing and not alert_problems else 1


def check_alerts(base, reload_done):
    """Rule health from /api/v1/rules and the alerts the scenario must (not) raise."""
    problems = []
    _, body = http_get(f"{base}/api/v1/rules", timeout=10)
    groups = json.loads(body)["data"]["groups"]
    seen = 0
    for g in groups:
        for r in g["rules"]:
            seen += 1
            if r.get("health") != "ok":
                problems.append(f"rule {r.get('name')} health {r.get('health')}: {r.get('lastError')}")
    if seen == 0:
        problems.append("Prometheus loaded no rules")
    _, body = http_get(f"{base}/api/v1/alerts", timeout=10)
    active = {}
    for a in json.loads(body)["data"]["alerts"]:
        active.setdefault(a["labels"]["alertname"], set()).add(a["state"])
    for name in MUST_NOT_ALERT:
        if name in active:
            problems.append(f"{name} is {sorted(active[name])} in a healthy scenario")
    if reload_done and "firing" not in active.get("ToolgateConfigReloadFailed", set()):
        problems.append("ToolgateConfigReloadFailed is not firing after a rejected reload")
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("static")
    s.add_argument("--dashboard", required=True)
    s.add_argument("--rules", required=True)
    s.add_argument("--rule-tests", required=True)
    s.add_argument("--runbook", required=True)
    s.add_argument("--out", required=True, help="JSON list of extracted expressions")
    s.add_argument("--promtool-rules", required=True, help="rules file for promtool check rules")
    s.set_defaults(fn=cmd_static)

    s = sub.add_parser("render")
    s.add_argument("--toolgate-config", required=True)
    s.add_argument("--toolgate-out", required=True)
    s.add_argument("--prometheus-out", required=True)
    s.add_argument("--rules", required=True)
    s.add_argument("--agent-port", type=int, required=True)
    s.add_argument("--admin-port", type=int, required=True)
    s.add_argument("--telemetry-port", type=int, required=True)
    s.add_argument("--upstream", action="append", help="OLD=NEW rewrite of tool upstream URLs")
    s.set_defaults(fn=cmd_render)

    s = sub.add_parser("wait-query")
    s.add_argument("--prometheus", required=True)
    s.add_argument("expr")
    s.add_argument("--timeout", type=float, default=30)
    s.set_defaults(fn=cmd_wait_query)

    s = sub.add_parser("query")
    s.add_argument("--prometheus", required=True)
    s.add_argument("--metrics", required=True, help="toolgate's /metrics URL (its metric families)")
    s.add_argument("--exprs", required=True)
    s.add_argument("--timeout", type=float, default=60, help="seconds to wait for series to appear")
    s.add_argument("--reload-done", action="store_true", help="a rejected and an applied reload happened")
    s.set_defaults(fn=cmd_query)

    args = ap.parse_args()
    sys.exit(args.fn(args))


if __name__ == "__main__":
    main()
