"""Unit tests of k8s_check.py's checks: `.venv/bin/python -m unittest discover -s scripts` (run by
`make lint`). k8s_check reads the chart and deploy/ from the repository root, as
scripts/k8s-check.sh runs it, so these tests run there too; importing it needs openssl."""

import contextlib
import copy
import importlib
import io
import os
import tempfile
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
k8s = None
_cwd = None


def setUpModule():
    global k8s, _cwd
    _cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        k8s = importlib.import_module("k8s_check")
    except ImportError as err:
        raise ImportError(f"{err}: run these tests with the virtualenv of scripts/requirements.txt "
                          "(.venv/bin/python -m unittest discover -s scripts)") from err


def tearDownModule():
    os.chdir(_cwd)


class Checked(unittest.TestCase):
    """Each test starts with k8s_check's tally empty, and keeps its FAIL lines off the output."""

    def setUp(self):
        k8s.failures.clear()
        k8s.passed = 0
        self.enterContext(contextlib.redirect_stdout(io.StringIO()))
        self.addCleanup(k8s.failures.clear)


class Helpers(Checked):
    def test_check_tallies(self):
        self.assertTrue(k8s.check("w", True, "never"))
        self.assertFalse(k8s.check("w", False, "broken"))
        self.assertEqual((k8s.passed, k8s.failures), (1, ["w: broken"]))

    def test_deep_merge_copies(self):
        base = {"a": {"b": 1, "c": [1]}, "d": 1}
        merged = k8s.deep_merge(base, {"a": {"c": [2], "e": {"f": 1}}, "d": {"x": 1}})
        self.assertEqual(merged, {"a": {"b": 1, "c": [2], "e": {"f": 1}}, "d": {"x": 1}})
        merged["a"]["b"] = 9
        self.assertEqual(base["a"]["b"], 1)

    def test_group_of(self):
        self.assertEqual(k8s.group_of({"apiVersion": "monitoring.coreos.com/v1"}), "monitoring.coreos.com")
        self.assertEqual(k8s.group_of({"apiVersion": "v1"}), "")
        self.assertEqual(k8s.group_of({}), "")

    def test_apply_patch(self):
        doc = {"metadata": {"annotations": {"a/b": "1"}}, "spec": {"containers": [{"name": "agent"}]}}
        out = k8s.apply_patch(doc, [
            {"op": "add", "path": "/spec/initContainers", "value": []},
            {"op": "add", "path": "/spec/initContainers/-", "value": {"name": "toolgate"}},
            {"op": "add", "path": "/spec/containers/0", "value": {"name": "first"}},
            {"op": "replace", "path": "/metadata/annotations/a~1b", "value": "2"},
            {"op": "add", "path": "/metadata/annotations/toolgate.dev~1injected", "value": "true"},
            {"op": "remove", "path": "/spec/containers/1"},
        ])
        self.assertEqual(out, {"metadata": {"annotations": {"a/b": "2", "toolgate.dev/injected": "true"}},
                               "spec": {"containers": [{"name": "first"}],
                                        "initContainers": [{"name": "toolgate"}]}})
        self.assertEqual(doc["spec"]["containers"], [{"name": "agent"}])  # the input is kept
        with self.assertRaisesRegex(ValueError, "unsupported patch op move"):
            k8s.apply_patch(doc, [{"op": "move", "path": "/spec", "from": "/x"}])

    def test_want_config(self):
        values = {"config": {"tools": []}, "evidence": {"existingSecret": "", "secretKey": "k.pem",
                                                        "previousPublicKeys": [], "issuer": ""}}
        self.assertEqual(k8s.want_config(values), {"tools": []})
        values["evidence"].update(existingSecret="ev", previousPublicKeys=["a", "b"], issuer="me")
        self.assertEqual(k8s.want_config(values)["evidence"], {
            "signing_key_file": f"{k8s.EVIDENCE_MOUNT}/k.pem",
            "previous_public_keys": [f"{k8s.CONFIG_MOUNT}/evidence-previous-1.pub.pem",
                                     f"{k8s.CONFIG_MOUNT}/evidence-previous-2.pub.pem"],
            "issuer": "me"})
        self.assertNotIn("evidence", values["config"])

    def test_predates_evidence(self):
        class Out:
            def __init__(self, rc, err):
                self.returncode, self.stdout, self.stderr = rc, "", err

        self.assertTrue(k8s.predates_evidence(Out(64, "error: unknown field `evidence`, expected one of")))
        self.assertFalse(k8s.predates_evidence(Out(64, "error: unknown field `bogus`")))
        self.assertFalse(k8s.predates_evidence(Out(0, "unknown field `evidence`")))

    def test_write_docs_skips_kinds_without_a_core_schema(self):
        docs = [{"apiVersion": "v1", "kind": "ConfigMap"},
                {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor"},
                {"apiVersion": "cert-manager.io/v1", "kind": "Certificate"},
                {"apiVersion": "example.com/v1", "kind": "PodMonitor"}]
        with tempfile.TemporaryDirectory() as tmp:
            path, count, skipped = k8s.write_docs(tmp, "x", docs)
            self.assertEqual((count, skipped), (2, ["PodMonitor", "Certificate"]))
            self.assertEqual(path.read_text().count("kind:"), 2)

    def test_sidecar_files_point_the_mounts_at_stand_ins(self):
        text = (f"evidence:\n  signing_key_file: {k8s.EVIDENCE_MOUNT}/ed25519.pem\n"
                f"  previous_public_keys: [{k8s.CONFIG_MOUNT}/evidence-previous-1.pub.pem]\n")
        with tempfile.TemporaryDirectory() as tmp:
            path, has = k8s.sidecar_files(tmp, "c", {"toolgate.yaml": text,
                                                     "evidence-previous-1.pub.pem": "PEM"})
            self.assertTrue(has)
            written = path.read_text()
            self.assertNotIn(k8s.EVIDENCE_MOUNT, written)
            self.assertIn(f"{tmp}/c/evidence/ed25519.pem", written)
            self.assertIn("PRIVATE KEY", Path(tmp, "c", "evidence", "ed25519.pem").read_text())
            self.assertEqual(Path(tmp, "c", "etc", "evidence-previous-1.pub.pem").read_text(), "PEM")
            path, has = k8s.sidecar_files(tmp, "d", {"toolgate.yaml": "tools: []\n"})
            self.assertEqual((path.read_text(), has), ("tools: []\n", False))


class EvidenceMount(Checked):
    def pod(self):
        sidecar = {"name": "toolgate", "volumeMounts": [
            {"name": k8s.EVIDENCE_VOLUME, "mountPath": k8s.EVIDENCE_MOUNT, "readOnly": True}]}
        spec = {"volumes": [{"name": k8s.EVIDENCE_VOLUME, "secret": {"secretName": "ev"}}],
                "containers": [{"name": "agent"}], "initContainers": [sidecar]}
        config = {"evidence": {"signing_key_file": f"{k8s.EVIDENCE_MOUNT}/ed25519.pem"}}
        return {"existingSecret": "ev", "secretKey": "ed25519.pem"}, config, spec, sidecar

    def failures(self, evidence, config, spec, sidecar):
        k8s.failures.clear()
        k8s.check_evidence_mount("pod", evidence, config, spec, sidecar)
        return list(k8s.failures)

    def test_the_secret_mounted_read_only_where_the_config_looks(self):
        self.assertEqual(self.failures(*self.pod()), [])

    def test_what_fails(self):
        def agent_mounts(ev, cfg, spec, sc):
            spec["containers"][0]["volumeMounts"] = [{"name": k8s.EVIDENCE_VOLUME, "mountPath": "/x"}]

        def items(ev, cfg, spec, sc):
            spec["volumes"][0]["secret"]["items"] = [{"key": "ed25519.pem", "path": "key.pem"}]

        for breaks, says in (
                (agent_mounts, "containers ['agent'] mount the evidence key"),
                (lambda ev, cfg, spec, sc: spec["volumes"][0]["secret"].update(optional=True), "optional"),
                (lambda ev, cfg, spec, sc: spec["volumes"][0]["secret"].update(secretName="x"),
                 "is not Secret ev"),
                (lambda ev, cfg, spec, sc: sc["volumeMounts"][0].update(readOnly=False), "read-only"),
                (lambda ev, cfg, spec, sc: sc["volumeMounts"][0].update(subPath="k"), "read-only"),
                (items, "is not the mounted key key.pem"),
                (lambda ev, cfg, spec, sc: cfg["evidence"].update(signing_key_file="/keys/k.pem"),
                 "is not the mounted key")):
            with self.subTest(says):
                parts = self.pod()
                breaks(*parts)
                self.assertTrue(any(says in f for f in self.failures(*parts)), self.failures(*parts))

    def test_without_a_secret_nothing_is_mounted(self):
        evidence, config, spec, sidecar = self.pod()
        evidence["existingSecret"] = ""
        fails = self.failures(evidence, config, spec, sidecar)
        self.assertEqual(len(fails), 2, fails)
        self.assertIn("an evidence key is mounted although evidence.existingSecret is empty", fails[0])
        self.assertIn("the config has an evidence block", fails[1])
        spec["volumes"], sidecar["volumeMounts"] = [], []
        self.assertEqual(self.failures(evidence, {}, spec, sidecar), [])


class Rendering(Checked):
    @classmethod
    def setUpClass(cls):
        cls.chart = k8s.helm.Chart.load(str(k8s.CHART))
        cls.default = k8s.Rendering(cls.chart, "default", {})

    def rendering(self):
        return copy.deepcopy(self.default)

    def test_the_variants_pass(self):
        for name in ("default", "monitoring", "cert-manager", "evidence-key", "multi-namespace"):
            with self.subTest(name):
                k8s.failures.clear()
                k8s.check_rendering(k8s.Rendering(self.chart, name, k8s.VARIANTS[name]))
                self.assertEqual(k8s.failures, [])
        self.assertGreater(k8s.passed, 300)

    def test_what_fails(self):
        def doc(r, kind):
            return next(d for d in r.docs if d["kind"] == kind)

        def pod(r):
            return doc(r, "Deployment")["spec"]["template"]["spec"]

        for breaks, says in (
                (lambda r: doc(r, "ServiceAccount").update(automountServiceAccountToken=True),
                 "ServiceAccount mounts a token"),
                (lambda r: doc(r, "Deployment")["metadata"]["labels"].pop("helm.sh/chart"),
                 "lacks labels ['helm.sh/chart']"),
                (lambda r: r.docs.append(dict(doc(r, "ServiceAccount"), kind="ClusterRole")),
                 "renders a ClusterRole"),
                (lambda r: doc(r, "Deployment")["spec"].update(replicas=5), "replicas differ from values"),
                (lambda r: pod(r)["containers"][0]["securityContext"].update(runAsNonRoot=False),
                 "container securityContext"),
                (lambda r: doc(r, "MutatingWebhookConfiguration")["webhooks"][0].update(failurePolicy="Fail"),
                 "failurePolicy"),
                (lambda r: doc(r, "ConfigMap")["data"].update(extra="-----BEGIN PRIVATE KEY-----"),
                 "holds a private key"),
                (lambda r: r.docs.remove(doc(r, "PodDisruptionBudget")), "PDB minAvailable 1")):
            with self.subTest(says):
                r = self.rendering()
                breaks(r)
                k8s.failures.clear()
                k8s.check_rendering(r)
                self.assertTrue(any(says in f for f in k8s.failures), k8s.failures)

    def test_the_scenario_configs_agree(self):
        k8s.check_scenario_configs()
        self.assertEqual(k8s.failures, [])


if __name__ == "__main__":
    unittest.main()
