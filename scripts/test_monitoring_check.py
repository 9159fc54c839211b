"""Unit tests of monitoring/check.py's checks: `.venv/bin/python -m unittest discover -s scripts`
(run by `make lint`). The module is loaded from its file as `monitoring_check`."""

import contextlib
import copy
import importlib.util
import io
import json
import tempfile
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILES = ROOT / "charts" / "toolgate" / "files"
DASHBOARD, RULES = FILES / "toolgate-dashboard.json", FILES / "toolgate-rules.yaml"
RULE_TESTS, RUNBOOK = FILES / "toolgate-rules.test.yaml", ROOT / "docs" / "runbook.md"

_spec = importlib.util.spec_from_file_location("monitoring_check",
                                               ROOT / "scripts" / "monitoring" / "check.py")
mc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mc)
try:
    import promql_parser  # noqa: F401 (the check imports it lazily: fail here, with the reason)
    import yaml
except ImportError as err:
    raise ImportError(f"{err}: run these tests with the virtualenv of scripts/requirements.txt "
                      "(.venv/bin/python -m unittest discover -s scripts)") from err

EXPOSITION = """\
# HELP toolgate_invocations_total Calls.
# TYPE toolgate_invocations_total counter
toolgate_invocations_total{tool="search",status="READY"} 3
# TYPE toolgate_invocation_duration_seconds histogram
toolgate_invocation_duration_seconds_bucket{tool="search",le="0.1"} 3
toolgate_invocation_duration_seconds_sum{tool="search"} 0.2
toolgate_invocation_duration_seconds_count{tool="search"} 3
# TYPE toolgate_store_errors counter
toolgate_store_errors_total{op="reserve"} 0
# TYPE process_open_fds gauge
process_open_fds 12
"""


class Promql(unittest.TestCase):
    def test_substitute(self):
        expr = 'rate(x{namespace=~"$namespace", pod=~"${pod}", tool=~"${tool:regex}"}[$__rate_interval])'
        self.assertEqual(mc.substitute(expr), 'rate(x{namespace=~".*", pod=~".*", tool=~".*"}[1m])')
        self.assertEqual(mc.substitute(expr, keep_labels=True),
                         'rate(x{namespace=~"$namespace", pod=~"${pod}", tool=~"${tool:regex}"}[1m])')
        with self.assertRaisesRegex(ValueError, r"unknown variable \$cluster"):
            mc.substitute('x{cluster="$cluster"}')

    def test_selectors_and_operands(self):
        ast, err = mc.parse('sum(rate(a{x="1"}[5m])) / sum(rate(b[5m])) > 0.1 '
                            'and on() c{y=~"z|w"} or vector(0)')
        self.assertIsNone(err)
        self.assertEqual(mc.selectors(ast), [
            {"name": "a", "matchers": [["x", "=", "1"]]}, {"name": "b", "matchers": []},
            {"name": "c", "matchers": [["y", "=~", "z|w"]]}])
        self.assertEqual([str(o) for o in mc.operands(ast)],
                         ['sum(rate(a{x="1"}[5m])) / sum(rate(b{}[5m]))', 'c{y=~"z|w"}', "vector(0)"])
        self.assertEqual(len(mc.operands(mc.parse("(up)")[0])), 1)
        self.assertIsNotNone(mc.parse("sum(")[1])


class Dashboard(unittest.TestCase):
    def setUp(self):
        self.dash = json.loads(DASHBOARD.read_text())

    def failures(self, dash):
        with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
            json.dump(dash, f)
            f.flush()
            fails, exprs = mc.Failures(), []
            mc.check_dashboard(f.name, fails, exprs)
        return fails.items, exprs

    def test_the_repositorys_dashboard_passes(self):
        fails, exprs = self.failures(self.dash)
        self.assertEqual(fails, [])
        kinds = {e["kind"] for e in exprs}
        self.assertEqual(kinds, {"panel", "variable"})
        panel = next(e for e in exprs if e["kind"] == "panel")
        # Selectors keep the label variables, for the filter check; the query has them replaced.
        self.assertNotIn("$namespace", panel["expr"])
        self.assertIn(["namespace", "=~", "$namespace"], panel["selectors"][0]["matchers"])

    def panels(self, dash):
        return [p for p in mc.walk_panels(dash["panels"]) if p.get("type") != "row"]

    def test_what_fails(self):
        def overlap(d):
            a, b = self.panels(d)[:2]
            b["gridPos"] = dict(a["gridPos"])

        def same_id(d):
            a, b = self.panels(d)[:2]
            b["id"] = a["id"]

        def datasource(d):
            self.panels(d)[0]["datasource"] = {"uid": "prometheus"}

        def variable(d):
            v = next(v for v in d["templating"]["list"] if v["name"] == "pod")
            v["query"] = "label_values(up, pod)"

        def unknown_variable(d):
            self.panels(d)[0]["targets"][0]["expr"] += " * $scale"

        def unparsable(d):
            self.panels(d)[0]["targets"][0]["expr"] = "sum(rate(x[5m]"

        def repeated_ref(d):
            p = self.panels(d)[0]
            p["targets"].append(dict(p["targets"][0]))

        for breaks, says in ((overlap, "overlaps panel"), (same_id, "duplicate id"),
                             (datasource, "datasource must be ${datasource}"),
                             (variable, "expected label_values(toolgate_invocations_total…, pod)"),
                             (unknown_variable, "unknown variable $scale"),
                             (unparsable, "does not parse"), (repeated_ref, "refIds missing or repeated"),
                             (lambda d: d.pop("uid"), "missing uid"),
                             (lambda d: d.update(schemaVersion=30), "schemaVersion")):
            with self.subTest(says):
                dash = copy.deepcopy(self.dash)
                breaks(dash)
                fails, _ = self.failures(dash)
                self.assertTrue(any(says in f for f in fails), fails)


class Rules(unittest.TestCase):
    def check(self, rules=None, tests=None, runbook=None):
        with tempfile.TemporaryDirectory() as tmp:
            paths = []
            for name, text, default in (("rules.yaml", rules, RULES), ("tests.yaml", tests, RULE_TESTS),
                                        ("runbook.md", runbook, RUNBOOK)):
                path = Path(tmp, name)
                path.write_text(default.read_text() if text is None else text)
                paths.append(str(path))
            fails, exprs = mc.Failures(), []
            alerts = mc.check_rules(*paths, fails, exprs)
        return alerts, fails.items, exprs

    def test_the_repositorys_rules_pass(self):
        alerts, fails, exprs = self.check()
        self.assertEqual(fails, [])
        self.assertIn("ToolgateStoreUnavailable", alerts)
        self.assertEqual({e["kind"] for e in exprs} - {"alert", "operand"}, set())

    def test_a_new_alert_needs_its_runbook_section_and_tests(self):
        rules = yaml.safe_load(RULES.read_text())
        rules["groups"][0]["rules"].append({
            "alert": "ToolgateNew", "expr": "sum(up) > 1", "labels": {"severity": "page"},
            "annotations": {"summary": "s", "description": "d",
                            "runbook_url": "docs/runbook.md#toolgatenew"}})
        _, fails, _ = self.check(rules=yaml.safe_dump(rules))
        self.assertEqual(sorted(fails), [
            "alert ToolgateNew: no unit test where it does not fire",
            "alert ToolgateNew: no unit test where it fires",
            "alert ToolgateNew: runbook has no section #toolgatenew",
            "alert ToolgateNew: severity label must be one of ['critical', 'info', 'warning']",
        ])

    def test_runbook_and_tests_must_match_the_alerts(self):
        runbook = RUNBOOK.read_text() + "\n## ToolgateGone\n\nNothing fires this.\n"
        tests = yaml.safe_load(RULE_TESTS.read_text())
        tests["tests"][0]["alert_rule_test"].append({"eval_time": "1m", "alertname": "ToolgateGone",
                                                     "exp_alerts": []})
        _, fails, _ = self.check(runbook=runbook, tests=yaml.safe_dump(tests))
        self.assertEqual(fails, ["runbook: section ToolgateGone has no alert",
                                 "rule tests: test for unknown alert ToolgateGone"])

    def test_anchors(self):
        with tempfile.NamedTemporaryFile("w", suffix=".md") as f:
            f.write("# Runbook\n\n## ToolgateX\n\n### What it means: `code`\n")
            f.flush()
            self.assertEqual(mc.runbook_anchors(f.name), {"runbook", "toolgatex", "what-it-means-code"})
            self.assertEqual(mc.runbook_alert_sections(f.name), {"ToolgateX"})


class Families(unittest.TestCase):
    def test_parse_families(self):
        fams = mc.parse_families(EXPOSITION)
        self.assertEqual(fams["toolgate_invocations_total"]["labels"], {"tool", "status"})
        self.assertIn("toolgate_invocations_total", fams["toolgate_invocations_total"]["series"])
        hist = fams["toolgate_invocation_duration_seconds"]
        self.assertEqual(hist["labels"], {"tool"})  # `le` is the histogram's own
        self.assertTrue({"toolgate_invocation_duration_seconds_bucket",
                         "toolgate_invocation_duration_seconds_count"} <= hist["series"])
        self.assertEqual(fams["toolgate_store_errors"]["labels"], {"op"})
        self.assertEqual(fams["process_open_fds"]["series"], {"process_open_fds"})

    def test_check_selectors(self):
        fams = mc.parse_families(EXPOSITION)
        filters = [["namespace", "=~", "$namespace"], ["pod", "=~", "$pod"], ["tool", "=~", "$tool"]]
        good = {"source": "Calls", "kind": "panel",
                "selectors": [{"name": "toolgate_invocations_total", "matchers": filters}]}
        errors = {"source": "Errors", "kind": "panel", "selectors": [{"name": "toolgate_store_errors_total",
                  "matchers": [["namespace", "=~", "$namespace"], ["pod", "=~", "$pod"]]}]}
        fails = mc.Failures()
        used = mc.check_selectors([good, errors], fams, fails)
        self.assertEqual(fails.items,
                         ["dashboard: no panel shows toolgate_invocation_duration_seconds (histogram)"])
        self.assertEqual(used, {"toolgate_invocations_total", "toolgate_store_errors"})
        unfiltered = copy.deepcopy(good)
        unfiltered["selectors"][0]["matchers"].pop()
        typo = {"source": "Typo", "kind": "alert", "selectors": [{"name": "toolgate_invocation_total",
                "matchers": []}]}
        fails = mc.Failures()
        mc.check_selectors([unfiltered, typo, {"source": "Up", "kind": "panel", "selectors": [
            {"name": "up", "matchers": []}]}], fams, fails)
        self.assertEqual(fails.items[:3], [
            'Calls: toolgate_invocations_total selector lacks tool=~"$tool"',
            "Typo: toolgate_invocation_total is not a series toolgate exports (its /metrics)",
            "Up: queries no toolgate metric"])

    def test_allowed_empty(self):
        self.assertIsNotNone(mc.allowed_empty({"kind": "alert", "alert": "ToolgateStoreErrors", "expr": "x"},
                                              True))
        self.assertIsNone(mc.allowed_empty({"kind": "alert", "alert": "ToolgateConfigReloadFailed",
                                            "expr": "toolgate_config_reloads_total"}, True))
        reloads = {"kind": "panel", "expr": "rate(toolgate_config_reloads_total[1m])"}
        self.assertEqual(mc.allowed_empty(reloads, False), "the config reload step was skipped")
        self.assertIsNone(mc.allowed_empty(reloads, True))
        self.assertIsNotNone(mc.allowed_empty({"kind": "panel", "expr": 'x{layer="UNKNOWN"}'}, True))
        self.assertIsNone(mc.allowed_empty({"kind": "panel", "expr": "toolgate_invocations_total"}, True))


class Render(unittest.TestCase):
    def test_configs_for_the_local_run(self):
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp, "in.yaml")
            src.write_text(yaml.safe_dump({
                "listen": {"agent": "0.0.0.0:1"}, "store": {"kind": "redis-cluster", "nodes": ["redis://x"]},
                "tools": [{"name": "a", "upstream": "http://tools.svc:8080/a"},
                          {"name": "b", "upstream": "http://other:1/b"}]}))
            args = type("Args", (), dict(
                toolgate_config=str(src), toolgate_out=str(Path(tmp, "tg.yaml")),
                prometheus_out=str(Path(tmp, "prom.json")), rules="rules.yaml", agent_port=1,
                admin_port=2, telemetry_port=3, upstream=["http://tools.svc:8080=http://127.0.0.1:9"]))
            self.assertEqual(mc.cmd_render(args), 0)
            cfg = yaml.safe_load(Path(args.toolgate_out).read_text())
            self.assertEqual(cfg["store"], {"kind": "memory"})
            self.assertEqual(cfg["listen"]["telemetry"], "127.0.0.1:3")
            self.assertEqual([t["upstream"] for t in cfg["tools"]],
                             ["http://127.0.0.1:9/a", "http://other:1/b"])
            prom = json.loads(Path(args.prometheus_out).read_text())
            self.assertEqual(prom["scrape_configs"][0]["static_configs"][0]["targets"], ["127.0.0.1:3"])
            args.upstream = ["http://nowhere=http://127.0.0.1:9"]
            with self.assertRaisesRegex(SystemExit, "no tool upstream starts with http://nowhere"), \
                    contextlib.redirect_stderr(io.StringIO()):
                mc.cmd_render(args)


if __name__ == "__main__":
    unittest.main()
