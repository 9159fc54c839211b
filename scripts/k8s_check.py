#!/usr/bin/env python3
"""Offline checks of the Helm chart and the Kubernetes manifests (no cluster, no helm binary),
run by scripts/k8s-check.sh in the virtualenv of scripts/requirements.txt:

  - renders charts/toolgate with the Helm SDK (PyPI helm-python-sdk) for the default values and
    every documented variant, and lints each strictly against Kubernetes KUBE_VERSION;
  - checks what each rendering must hold (injector args, probes, security context, webhook,
    TLS material, config and token objects per injection namespace, monitoring objects, the
    evidence block of the config and the previous public keys beside it, no private key in a
    ConfigMap);
  - checks that values the chart's schema must refuse are refused;
  - validates every rendered manifest and every manifest under deploy/kind/ with
    `kubernetes-validate --strict` (custom resources: ServiceMonitor, PodMonitor, PrometheusRule,
    Certificate, Issuer, and kind's Cluster config have no core schema: they are skipped by name,
    and the skip is printed);
  - checks that the scenario configs agree on their tools, and that the kind manifests agree with
    the chart values and the image they run;
  - when a toolgate binary is built ($TOOLGATE_BIN, default target/debug/toolgate): runs
    `toolgate check` on every rendered and scenario config (the config rules live in toolgate
    alone: configs that break them render, and `toolgate check` must refuse them; the files a
    config names under the sidecar's mounts are written to a temporary directory, the signing key
    freshly generated), and sends the kind agent pod through `toolgate injector` (serving the
    chart's generated certificate) as a native sidecar and as a plain container
    (toolgate.dev/native-sidecar: "false"), validating both patched pods; with an evidence Secret
    too, checking that the sidecar mounts it read-only where the config looks for the key.
    Without a binary these checks are reported as not run, and so are the evidence ones when the
    binary predates them.

Exit 0 only when all pass.
"""

import base64
import copy
import http.client
import json
import os
import re
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path

import helm_python as helm
import yaml
from ports import free_port

KUBE_VERSION = os.environ.get("KUBE_VERSION", "1.33.0")
CHART = Path("charts/toolgate")
RELEASE, NAMESPACE = "toolgate", "toolgate-system"
# Kinds with no schema in Kubernetes itself, skipped by name.
SKIPPED_KINDS = {
    ("monitoring.coreos.com", "ServiceMonitor"),
    ("monitoring.coreos.com", "PodMonitor"),
    ("monitoring.coreos.com", "PrometheusRule"),
    ("cert-manager.io", "Certificate"),
    ("cert-manager.io", "Issuer"),
    ("kind.x-k8s.io", "Cluster"),
}
STANDARD_LABELS = ["helm.sh/chart", "app.kubernetes.io/name", "app.kubernetes.io/instance",
                   "app.kubernetes.io/version", "app.kubernetes.io/managed-by"]
CLUSTER_SCOPED = {"MutatingWebhookConfiguration", "Namespace", "ClusterRole", "ClusterRoleBinding"}
# Where the injected sidecar finds its config ConfigMap and the evidence Secret (src/injector/pod.rs).
CONFIG_MOUNT = "/etc/toolgate"
EVIDENCE_MOUNT = "/var/run/secrets/toolgate/evidence"
EVIDENCE_VOLUME = "toolgate-evidence"

passed = 0
failures = []


def check(where, condition, message):
    global passed
    if condition:
        passed += 1
    else:
        failures.append(f"{where}: {message}")
        print(f"FAIL {where}: {message}", flush=True)
    return condition


def deep_merge(base, override):
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def group_of(doc):
    api = doc.get("apiVersion", "")
    return api.split("/")[0] if "/" in api else ""


def b64(value):
    return base64.b64decode(value).decode()


def openssl_out(*args, stdin=None):
    out = subprocess.run(["openssl", *args], input=stdin, capture_output=True, text=True,
                         check=True)
    return out.stdout


def ed25519_private_pem():
    return openssl_out("genpkey", "-algorithm", "ed25519")


def public_pem(private_pem):
    return openssl_out("pkey", "-pubout", stdin=private_pem)


# Keys for the evidence variants: two earlier Ed25519 public keys, a private key (which must never
# reach a ConfigMap) and a P-256 public key (a PEM public key toolgate must refuse).
PREVIOUS_KEYS = [public_pem(ed25519_private_pem()) for _ in range(2)]
A_PRIVATE_KEY = ed25519_private_pem()
P256_PUBLIC_KEY = public_pem(openssl_out("genpkey", "-algorithm", "EC",
                                         "-pkeyopt", "ec_paramgen_curve:P-256"))
KIND_VALUES = yaml.safe_load(Path("deploy/kind/values-e2e.yaml").read_text())

REDIS_NODES = ["redis://redis-0.redis.db.svc:6379", "redis://redis-1.redis.db.svc:6379"]
VARIANTS = {
    "default": {},
    "cert-manager": {"injector": {"certManager": {"enabled": True}}},
    "cert-manager-cluster-issuer": {"injector": {"certManager": {
        "enabled": True, "issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}}}},
    "existing-secret": {"adminToken": {"existingSecret": "agents-admin-token"}},
    "admin-token-value": {"adminToken": {"value": "a-fixed-admin-token"}},
    "monitoring": {"metrics": {
        "podMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
        "serviceMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True, "labels": {"release": "prometheus"}},
        "dashboard": {"enabled": True, "namespace": "monitoring",
                      "annotations": {"grafana_folder": "AI agents"}}}},
    "multi-namespace": {"injection": {"namespaces": ["agents-a", "agents-b"]},
                        "metrics": {"podMonitor": {"enabled": True},
                                    "serviceMonitor": {"enabled": True}}},
    "single-replica-fail-closed": {"injector": {"replicas": 1,
                                                "webhook": {"failurePolicy": "Fail"}}},
    "redis-store": {"config": {"store": {"kind": "redis-cluster", "nodes": REDIS_NODES,
                                         "durability": "replica"}}},
    "tracing": {"config": {"otel": {"endpoint": "http://otel-collector.observability.svc:4318",
                                    "service_name": "toolgate", "sample_ratio": 0.5}}},
    "pinned-images": {"image": {"digest": "sha256:" + "a" * 64},
                      "sidecar": {"image": {"repository": "registry.example/toolgate",
                                            "tag": "1.2.3"}},
                      "imagePullSecrets": [{"name": "regcred"}]},
    "names-and-scheduling": {"fullnameOverride": "tg", "commonLabels": {"team": "agents"},
                             "serviceAccount": {"annotations": {"owner": "platform"}},
                             "injector": {"priorityClassName": "system-cluster-critical",
                                          "podLabels": {"tier": "control"},
                                          "podAnnotations": {"note": "x"},
                                          "extraEnv": [{"name": "RUST_LOG", "value": "info"}],
                                          "nodeSelector": {"kubernetes.io/os": "linux"},
                                          "tolerations": [{"key": "dedicated",
                                                           "operator": "Exists"}]}},
    "kind-e2e": KIND_VALUES,
    "evidence-key": {"evidence": {"existingSecret": "toolgate-evidence"}},
    "evidence-public-keys-only": {"injection": {"namespaces": ["agents-a", "agents-b"]},
                                  "evidence": {"previousPublicKeys": [PREVIOUS_KEYS[0]],
                                               "issuer": "agents.example"}},
    # The kind test's values with a rotated key: also sent through the injector.
    "kind-evidence-rotated": deep_merge(KIND_VALUES, {"evidence": {
        "existingSecret": "toolgate-evidence-2026-12", "secretKey": "ed25519.pem",
        "previousPublicKeys": PREVIOUS_KEYS, "issuer": "https://toolgate.example"}}),
}
# Values the chart's own schema refuses: the chart's settings, and the one config setting the
# chart relies on (the injected container probes the telemetry listener on port 15090).
REFUSED = {
    "unknown top-level key": {"replicaCount": 3},
    "failurePolicy not Ignore/Fail": {"injector": {"webhook": {"failurePolicy": "Sometimes"}}},
    "webhook timeout over 30 s": {"injector": {"webhook": {"timeoutSeconds": 60}}},
    "telemetry off port 15090": {"config": {"listen": {"telemetry": "0.0.0.0:9000"}}},
    "zero injector replicas": {"injector": {"replicas": 0}},
    "private key as a previous public key": {"evidence": {"previousPublicKeys": [A_PRIVATE_KEY]}},
    "two PEM blocks in one previous public key": {"evidence": {
        "previousPublicKeys": [PREVIOUS_KEYS[0] + PREVIOUS_KEYS[1]]}},
    "evidence Secret not an object name": {"evidence": {"existingSecret": "Toolgate_Evidence"}},
    "evidence secretKey with a slash": {"evidence": {"existingSecret": "e", "secretKey": "a/b"}},
    "unknown evidence key": {"evidence": {"signingKeyFile": "/keys/signing-key.pem"}},
}
# Values the chart's templates refuse (fail), with a word the message must hold.
FAILING = {
    "evidence values and config.evidence": (
        {"evidence": {"existingSecret": "toolgate-evidence"},
         "config": {"evidence": {"signing_key_file": "/keys/signing-key.pem"}}}, "not both"),
}
# Configs that break toolgate's config rules. The chart does not repeat those rules: it renders
# these, and `toolgate check` must refuse the rendered config.
BAD_CONFIGS = {
    "unknown config key": {"config": {"bogus": 1}},
    "redis-cluster store without nodes": {"config": {"store": {"kind": "redis-cluster"}}},
    "tool without upstream": {"config": {"tools": [{"name": "search", "read_only": True}]}},
    "record_ttl_ms of 0": {"config": {"store": {"record_ttl_ms": 0}}},
    "P-256 previous public key": {"evidence": {"existingSecret": "toolgate-evidence",
                                               "previousPublicKeys": [P256_PUBLIC_KEY]}},
}


def openssl(*args, stdin=None):
    return subprocess.run(["openssl", *args], input=stdin, capture_output=True, text=True)


class Rendering:
    def __init__(self, chart, name, values):
        self.name = name
        self.values = values
        self.merged = chart.merge_values(values)
        self.files = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
        self.docs = []
        for path, text in sorted(self.files.items()):
            if path.endswith("NOTES.txt"):
                self.notes = text
                continue
            for doc in yaml.safe_load_all(text):
                if doc:
                    self.docs.append(doc)

    def all(self, kind):
        return [d for d in self.docs if d.get("kind") == kind]

    def one(self, kind, where=None):
        found = [d for d in self.all(kind) if where is None or where(d)]
        check(self.name, len(found) == 1, f"expected one {kind}, found {len(found)}")
        return found[0] if found else {}


def previous_key_file(i):
    """The ConfigMap key (and file under CONFIG_MOUNT) of previous public key number i (from 0)."""
    return f"evidence-previous-{i + 1}.pub.pem"


def want_config(v):
    """The sidecar config the chart must render: values.config, plus the evidence block."""
    config = copy.deepcopy(v["config"])
    ev, block = v["evidence"], {}
    if ev["existingSecret"]:
        block["signing_key_file"] = f"{EVIDENCE_MOUNT}/{ev['secretKey']}"
    if ev["previousPublicKeys"]:
        block["previous_public_keys"] = [f"{CONFIG_MOUNT}/{previous_key_file(i)}"
                                         for i in range(len(ev["previousPublicKeys"]))]
    if ev["issuer"]:
        block["issuer"] = ev["issuer"]
    if block:
        config["evidence"] = block
    return config


def check_rendering(r):
    w = r.name
    v = r.merged
    full = "tg" if v.get("fullnameOverride") else RELEASE
    injector = f"{full}-injector"
    namespaces = v["injection"]["namespaces"] or [NAMESPACE]

    # Every object: standard labels, explicit namespace, unique identity, short names.
    seen = set()
    for d in r.docs:
        meta = d.get("metadata", {})
        ident = (d.get("kind"), meta.get("namespace"), meta.get("name"))
        check(w, ident not in seen, f"duplicate object {ident}")
        seen.add(ident)
        labels = meta.get("labels", {})
        missing = [label for label in STANDARD_LABELS if label not in labels]
        check(w, not missing, f"{d['kind']}/{meta.get('name')} lacks labels {missing}")
        check(w, len(meta.get("name", "")) <= 63, f"{d['kind']} name too long: {meta.get('name')}")
        if d["kind"] not in CLUSTER_SCOPED:
            check(w, bool(meta.get("namespace")), f"{d['kind']}/{meta.get('name')} has no namespace")
        for key, value in v.get("commonLabels", {}).items():
            check(w, labels.get(key) == value, f"{d['kind']} lacks common label {key}")
    check(w, bool(r.notes.strip()), "NOTES.txt is empty")

    # Least privilege: no RBAC at all, no API token anywhere.
    for kind in ["Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"]:
        check(w, not r.all(kind), f"renders a {kind}: the injector needs no API access")
    sa = r.one("ServiceAccount")
    check(w, sa.get("automountServiceAccountToken") is False, "ServiceAccount mounts a token")

    # The injector Deployment.
    dep = r.one("Deployment")
    spec = dep["spec"]["template"]["spec"]
    check(w, dep["metadata"]["name"] == injector, f"Deployment is {dep['metadata']['name']}")
    check(w, dep["spec"]["replicas"] == v["injector"]["replicas"], "replicas differ from values")
    check(w, spec.get("automountServiceAccountToken") is False, "injector pod mounts an API token")
    check(w, spec.get("serviceAccountName") == sa["metadata"]["name"], "pod does not use the SA")
    check(w, spec["securityContext"].get("runAsNonRoot") is True, "pod is not runAsNonRoot")
    (ctr,) = spec["containers"]
    sc = ctr["securityContext"]
    check(w, sc.get("readOnlyRootFilesystem") is True and sc.get("runAsNonRoot") is True
          and sc.get("allowPrivilegeEscalation") is False
          and sc.get("capabilities", {}).get("drop") == ["ALL"], f"container securityContext {sc}")
    repo, tag, digest = v["image"]["repository"], v["image"]["tag"] or "0.1.0", v["image"]["digest"]
    image = f"{repo}@{digest}" if digest else f"{repo}:{tag}"
    s = v["sidecar"]["image"]
    if s["repository"] or s["tag"] or s["digest"]:
        srepo, stag = s["repository"] or repo, s["tag"] or tag
        sidecar = f"{srepo}@{s['digest']}" if s["digest"] else f"{srepo}:{stag}"
    else:
        sidecar = image
    check(w, ctr["image"] == image, f"injector image {ctr['image']} is not {image}")
    config_map = f"{full}-config"
    admin_secret = v["adminToken"]["existingSecret"] or f"{full}-admin"
    want_args = ["injector", "--listen", "0.0.0.0:8443", "--tls-cert", "/tls/tls.crt",
                 "--tls-key", "/tls/tls.key", "--image", sidecar, "--config-map", config_map,
                 "--admin-secret", admin_secret]
    evidence_secret = v["evidence"]["existingSecret"]
    if evidence_secret:
        want_args += ["--evidence-secret", evidence_secret]
    check(w, ctr.get("args") == want_args, f"injector args {ctr.get('args')}")
    check(w, "command" not in ctr, "injector overrides the image entrypoint")
    ports = {p["name"]: p["containerPort"] for p in ctr["ports"]}
    check(w, ports == {"https": 8443}, f"container ports {ports}")
    for probe in ["readinessProbe", "livenessProbe"]:
        get = ctr.get(probe, {}).get("httpGet", {})
        check(w, get.get("path") == "/healthz" and get.get("scheme") == "HTTPS"
              and get.get("port") in ("https", 8443), f"{probe} {get}")
    mounts = {m["name"]: m for m in ctr["volumeMounts"]}
    check(w, mounts.get("tls", {}).get("mountPath") == "/tls" and mounts["tls"].get("readOnly"),
          "TLS volume is not mounted read-only at /tls")
    tls_secret = {vol["name"]: vol for vol in spec["volumes"]}["tls"]["secret"]["secretName"]
    check(w, tls_secret == f"{full}-injector-tls", f"TLS Secret {tls_secret}")

    # Service 443 → 8443 and the PDB.
    svc = r.one("Service", lambda d: d["metadata"]["name"] == injector)
    (port,) = svc["spec"]["ports"]
    check(w, port["port"] == 443 and port["targetPort"] in ("https", 8443), f"Service port {port}")
    check(w, svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items(),
          "Service selector does not match the injector pods")
    pdbs = r.all("PodDisruptionBudget")
    if v["injector"]["replicas"] > 1:
        check(w, len(pdbs) == 1 and pdbs[0]["spec"]["minAvailable"] == 1, "PDB minAvailable 1")
        if pdbs:
            check(w, pdbs[0]["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"],
                  "PDB selects other pods")
    else:
        check(w, not pdbs, "a PDB with a single replica would block every drain")

    # The webhook.
    mwc = r.one("MutatingWebhookConfiguration")
    check(w, mwc.get("apiVersion") == "admissionregistration.k8s.io/v1", "webhook apiVersion")
    (hook,) = mwc["webhooks"]
    cc = hook["clientConfig"]
    check(w, cc["service"] == {"name": injector, "namespace": NAMESPACE, "path": "/mutate",
                               "port": 443}, f"clientConfig.service {cc['service']}")
    check(w, hook["sideEffects"] == "None" and hook["admissionReviewVersions"] == ["v1"],
          "sideEffects/admissionReviewVersions")
    check(w, hook["failurePolicy"] == v["injector"]["webhook"]["failurePolicy"], "failurePolicy")
    check(w, hook["rules"] == [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                                "resources": ["pods"], "scope": "Namespaced"}], f"rules {hook['rules']}")
    check(w, "objectSelector" not in hook, "webhook uses an objectSelector")
    sel = hook["namespaceSelector"]["matchExpressions"]
    check(w, sel == [{"key": "kubernetes.io/metadata.name", "operator": "In",
                      "values": namespaces}], f"namespaceSelector {sel}")
    conds = hook.get("matchConditions", [])
    check(w, len(conds) == 1 and "toolgate.dev/inject" in conds[0]["expression"],
          "matchConditions do not test the inject annotation")

    # TLS: cert-manager objects, or generated material consistent with the caBundle.
    cm_on = v["injector"]["certManager"]["enabled"]
    annotations = mwc["metadata"].get("annotations", {})
    if cm_on:
        cert = r.one("Certificate")
        check(w, cert["spec"]["secretName"] == tls_secret, "Certificate writes another Secret")
        check(w, f"{injector}.{NAMESPACE}.svc" in cert["spec"]["dnsNames"], "Certificate DNS names")
        check(w, annotations.get("cert-manager.io/inject-ca-from")
              == f"{NAMESPACE}/{cert['metadata']['name']}", "inject-ca-from annotation")
        check(w, "caBundle" not in cc, "caBundle set although cert-manager injects it")
        check(w, not [s for s in r.all("Secret") if s["metadata"]["name"] == tls_secret],
              "TLS Secret rendered although cert-manager owns it")
        ref = v["injector"]["certManager"]["issuerRef"]
        issuers = r.all("Issuer")
        if ref["name"]:
            check(w, not issuers and cert["spec"]["issuerRef"]["name"] == ref["name"]
                  and cert["spec"]["issuerRef"]["kind"] == ref["kind"], "issuerRef not used")
        else:
            check(w, len(issuers) == 1 and "selfSigned" in issuers[0]["spec"]
                  and cert["spec"]["issuerRef"]["name"] == issuers[0]["metadata"]["name"],
                  "self-signed Issuer missing or unused")
    else:
        check(w, not r.all("Certificate") and not r.all("Issuer"), "cert-manager objects rendered")
        check(w, "cert-manager.io/inject-ca-from" not in annotations, "inject-ca-from annotation")
        secret = r.one("Secret", lambda d: d["metadata"]["name"] == tls_secret)
        check(w, secret.get("type") == "kubernetes.io/tls", "TLS Secret type")
        data = secret.get("data", {})
        check(w, cc.get("caBundle") == data.get("ca.crt"), "caBundle differs from the Secret's ca.crt")
        with tempfile.TemporaryDirectory() as tmp:
            for key in ["ca.crt", "tls.crt", "tls.key"]:
                Path(tmp, key).write_text(b64(data[key]))
            ver = openssl("verify", "-CAfile", f"{tmp}/ca.crt", f"{tmp}/tls.crt")
            check(w, ver.returncode == 0, f"serving cert does not verify: {ver.stdout}{ver.stderr}")
            text = openssl("x509", "-in", f"{tmp}/tls.crt", "-noout", "-text").stdout
            for dns in [injector, f"{injector}.{NAMESPACE}.svc",
                        f"{injector}.{NAMESPACE}.svc.cluster.local"]:
                check(w, f"DNS:{dns}" in text, f"serving cert lacks DNS:{dns}")
            crt_mod = openssl("x509", "-in", f"{tmp}/tls.crt", "-noout", "-pubkey").stdout
            key_mod = openssl("pkey", "-in", f"{tmp}/tls.key", "-pubout").stdout
            check(w, crt_mod and crt_mod == key_mod, "tls.key does not match tls.crt")
        pod_ann = dep["spec"]["template"]["metadata"].get("annotations", {})
        check(w, re.fullmatch(r"[0-9a-f]{64}", pod_ann.get("checksum/tls", "")),
              "injector pods lack the checksum/tls annotation")

    # Config and admin token: one of each per injection namespace, same content.
    cms = [d for d in r.all("ConfigMap") if d["metadata"]["name"] == config_map]
    check(w, sorted(d["metadata"]["namespace"] for d in cms) == sorted(namespaces),
          f"config ConfigMaps in {[d['metadata']['namespace'] for d in cms]}, want {namespaces}")
    previous = v["evidence"]["previousPublicKeys"]
    for d in cms:
        keys = ["toolgate.yaml"] + [previous_key_file(i) for i in range(len(previous))]
        check(w, sorted(d["data"]) == sorted(keys), f"config ConfigMap keys {list(d['data'])}")
        config = yaml.safe_load(d["data"]["toolgate.yaml"])
        check(w, config == want_config(v),
              "toolgate.yaml differs from values.config plus the evidence block")
        # Default: no evidence key at all, so toolgate derives its key from the run-token key.
        wants_block = bool(evidence_secret or previous or v["evidence"]["issuer"])
        check(w, ("evidence" in config) == wants_block,
              "evidence block present without evidence values, or missing with them")
        for i, pem in enumerate(previous):
            check(w, d["data"].get(previous_key_file(i), "").strip() == pem.strip(),
                  f"{previous_key_file(i)} is not previous public key {i + 1}")
    for d in r.all("ConfigMap"):
        for key, text in d.get("data", {}).items():
            check(w, "PRIVATE KEY" not in text, f"ConfigMap {d['metadata']['name']} key {key} "
                                                "holds a private key")
    if evidence_secret:
        check(w, not [d for d in r.all("Secret") if d["metadata"]["name"] == evidence_secret],
              "the chart renders the evidence Secret; it must only name the one you manage")
        check(w, evidence_secret in r.notes, "NOTES.txt does not name the evidence Secret")
    secrets = [d for d in r.all("Secret") if d["metadata"]["name"] == admin_secret]
    if v["adminToken"]["existingSecret"]:
        check(w, not secrets, "an admin Secret is rendered although existingSecret is set")
    else:
        check(w, sorted(d["metadata"]["namespace"] for d in secrets) == sorted(namespaces),
              "admin Secrets are not in every injection namespace")
        tokens = {b64(d["data"]["token"]) for d in secrets}
        check(w, len(tokens) == 1 and all(len(t) >= 32 or t == v["adminToken"]["value"]
                                          for t in tokens), "admin tokens differ or are short")
        if v["adminToken"]["value"]:
            check(w, tokens == {v["adminToken"]["value"]}, "admin token differs from the value")

    # Monitoring objects, each only when asked for.
    m = v["metrics"]
    pms = r.all("PodMonitor")
    check(w, len(pms) == (1 if m["podMonitor"]["enabled"] else 0), "PodMonitor count")
    for pm in pms:
        (ep,) = pm["spec"]["podMetricsEndpoints"]
        check(w, ep["port"] == "telemetry" and ep["path"] == "/metrics", "PodMonitor endpoint")
        check(w, pm["spec"]["namespaceSelector"]["matchNames"] == namespaces, "PodMonitor namespaces")
        for key, value in m["podMonitor"]["labels"].items():
            check(w, pm["metadata"]["labels"].get(key) == value, "PodMonitor labels")
    sms = r.all("ServiceMonitor")
    check(w, len(sms) == (1 if m["serviceMonitor"]["enabled"] else 0), "ServiceMonitor count")
    for sm in sms:
        tsvcs = [d for d in r.all("Service") if d["metadata"]["name"] == f"{full}-telemetry"]
        check(w, sorted(d["metadata"]["namespace"] for d in tsvcs) == sorted(namespaces),
              "telemetry Services are not in every injection namespace")
        for t in tsvcs:
            check(w, sm["spec"]["selector"]["matchLabels"].items() <= t["metadata"]["labels"].items(),
                  "ServiceMonitor does not select the telemetry Service")
            check(w, t["spec"]["ports"][0]["name"] == "telemetry"
                  and t["spec"]["ports"][0]["port"] == 15090, "telemetry Service port")
            check(w, t["spec"]["selector"] == m["serviceMonitor"]["podLabels"],
                  "telemetry Service selector")
        check(w, sm["spec"]["endpoints"][0]["port"] == "telemetry", "ServiceMonitor endpoint")
    rules = r.all("PrometheusRule")
    check(w, len(rules) == (1 if m["prometheusRule"]["enabled"] else 0), "PrometheusRule count")
    for rule in rules:
        want = yaml.safe_load((CHART / "files/toolgate-rules.yaml").read_text())["groups"]
        check(w, rule["spec"]["groups"] == want, "PrometheusRule groups differ from the rules file")
    dashboards = [d for d in r.all("ConfigMap") if d["metadata"]["labels"].get("grafana_dashboard")]
    check(w, len(dashboards) == (1 if m["dashboard"]["enabled"] else 0), "dashboard count")
    for d in dashboards:
        check(w, d["metadata"]["labels"]["grafana_dashboard"] == "1", "grafana_dashboard label")
        check(w, d["metadata"]["namespace"] == (m["dashboard"]["namespace"] or NAMESPACE),
              "dashboard namespace")
        want = json.loads((CHART / "files/toolgate-dashboard.json").read_text())
        check(w, json.loads(d["data"]["toolgate-dashboard.json"]) == want,
              "dashboard JSON differs from the file")


def lint(values, where):
    report = helm.lint(str(CHART), values, strict=True, kube_version=f"v{KUBE_VERSION}")
    bad = [f"{m['path']}: {m['error'].strip()}" for m in report["messages"] if m["severity"] >= 2]
    bad += [e.strip() for e in report.get("errors", []) if e.strip() not in " ".join(bad)]
    check(where, not bad, f"helm lint --strict: {bad}")


def write_docs(tmp, name, docs):
    """Write the docs core Kubernetes can validate; return (path, count, skipped kinds)."""
    kept, skipped = [], []
    for d in docs:
        if (group_of(d), d.get("kind")) in SKIPPED_KINDS:
            skipped.append(d["kind"])
        else:
            kept.append(d)
    path = Path(tmp, f"{name}.yaml")
    path.write_text(yaml.safe_dump_all(kept, sort_keys=False))
    return path, len(kept), skipped


def kubernetes_validate(paths):
    """kubernetes-validate --strict over the files; returns {path: [problem lines]}."""
    tool = Path(sys.executable).parent / "kubernetes-validate"
    out = subprocess.run([str(tool), "--strict", "--quiet", "-k", KUBE_VERSION,
                          *map(str, paths)], capture_output=True, text=True)
    problems = {str(p): [] for p in paths}
    for line in (out.stdout + out.stderr).splitlines():
        if line.startswith(("ERROR", "WARN", "FATAL")) or "Couldn't" in line:
            owner = next((p for p in problems if p in line), None)
            problems.setdefault(owner or "?", []).append(line)
    if out.returncode != 0 and not any(problems.values()):
        problems.setdefault("?", []).append(f"kubernetes-validate exited {out.returncode}")
    return problems


def main():
    chart = helm.Chart.load(str(CHART))
    print(f"k8s-check: chart {chart.name} {chart.version}, Helm SDK {helm.helm_sdk_version()}, "
          f"Kubernetes {KUBE_VERSION}", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        to_validate = []  # (label, path, count)
        renderings = {}

        for name, values in VARIANTS.items():
            before = len(failures)
            try:
                rendering = Rendering(chart, name, values)
            except helm.HelmError as err:
                check(name, False, f"render failed: {err}")
                continue
            renderings[name] = rendering
            check_rendering(rendering)
            lint(values, name)
            path, count, skipped = write_docs(tmp, f"chart-{name}", rendering.docs)
            to_validate.append((f"chart[{name}]", path, count))
            status = "ok  " if len(failures) == before else "FAIL"
            skip = f"; skipped (no core schema): {', '.join(sorted(skipped))}" if skipped else ""
            print(f"{status} chart[{name}]: {len(rendering.docs)} objects{skip}", flush=True)

        for name, values in REFUSED.items():
            try:
                chart.render(values, name=RELEASE, namespace=NAMESPACE)
                check(f"schema[{name}]", False, "rendered, but values.schema.json must refuse it")
            except helm.HelmValuesError:
                check(f"schema[{name}]", True, "")
        print(f"ok   values.schema.json refuses {len(REFUSED)} bad value sets"
              if not any(f.startswith("schema[") for f in failures) else
              "FAIL values.schema.json accepts bad values", flush=True)
        for name, (values, word) in FAILING.items():
            try:
                chart.render(values, name=RELEASE, namespace=NAMESPACE)
                check(f"fail[{name}]", False, "rendered, but the chart must refuse it")
            except helm.HelmError as err:
                check(f"fail[{name}]", word in str(err), f"refused without saying {word!r}: {err}")
        print(f"ok   the chart refuses {len(FAILING)} conflicting value sets"
              if not any(f.startswith("fail[") for f in failures) else
              "FAIL the chart renders conflicting values", flush=True)

        # deploy/kind manifests (values*.yaml are chart values, rendered above as kind-e2e).
        kind_docs = {}
        for path in sorted(Path("deploy/kind").glob("*.yaml")):
            if path.name.startswith("values"):
                continue
            docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
            kind_docs[path.name] = docs
            out, count, skipped = write_docs(tmp, f"kind-{path.stem}", docs)
            to_validate.append((str(path), out, count))
            skip = f"; skipped (no core schema): {', '.join(skipped)}" if skipped else ""
            print(f"     {path}: {len(docs)} objects{skip}", flush=True)
        check_kind(chart, kind_docs)
        to_validate += check_with_binary(chart, tmp, renderings, kind_docs)

        problems = kubernetes_validate([p for _, p, _ in to_validate])
        total = 0
        for label, path, count in to_validate:
            lines = problems.get(str(path), [])
            for line in lines:
                check(label, False, f"kubernetes-validate: {line}")
            if not lines:
                check(label, True, "")
                total += count
        for line in problems.get("?", []):
            check("kubernetes-validate", False, line)
        print(f"ok   kubernetes-validate --strict -k {KUBE_VERSION}: {total} objects valid"
              if not any("kubernetes-validate" in f for f in failures) else
              f"FAIL kubernetes-validate --strict -k {KUBE_VERSION}", flush=True)

    check_scenario_configs()

    print(f"k8s-check: {passed} passed, {len(failures)} failed", flush=True)
    return 1 if failures else 0


def check_kind(chart, kind_docs):
    """The kind manifests agree with the chart values they are installed with."""
    w = "deploy/kind"
    values = VARIANTS["kind-e2e"]
    rendering = Rendering(chart, "kind-e2e", values)
    job = next((d for d in kind_docs.get("agent-job.yaml", []) if d["kind"] == "Job"), None)
    if not check(w, job is not None, "agent-job.yaml has no Job"):
        return
    pod = job["spec"]["template"]
    ns = job["metadata"]["namespace"]
    check(w, pod["metadata"].get("annotations", {}).get("toolgate.dev/inject") == "true",
          "agent Job is not annotated toolgate.dev/inject: \"true\"")
    check(w, ns in values["injection"]["namespaces"], f"agent namespace {ns} is not injected")
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    ref = env["TOOLGATE_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"]
    secrets = {(d["metadata"]["namespace"], d["metadata"]["name"]) for d in rendering.all("Secret")}
    check(w, (ns, ref["name"]) in secrets and ref["key"] == "token",
          f"agent reads Secret {ref['name']} that the chart does not render in {ns}")
    services = {(d["metadata"]["namespace"], d["metadata"]["name"]): d
                for docs in kind_docs.values() for d in docs if d["kind"] == "Service"}
    for tool in values["config"]["tools"]:
        m = re.match(r"http://([^.]+)\.([^.]+)\.svc\.cluster\.local:(\d+)/", tool["upstream"])
        svc = m and services.get((m.group(2), m.group(1)))
        check(w, bool(svc) and any(p["port"] == int(m.group(3)) for p in svc["spec"]["ports"]),
              f"tool {tool['name']} points at no Service of deploy/kind")
    sts = next(d for d in kind_docs["redis-cluster.yaml"] if d["kind"] == "StatefulSet")
    for node in values["config"]["store"]["nodes"]:
        m = re.match(r"redis://(redis-(\d))\.([^.]+)\.([^.]+)\.svc\.cluster\.local:6379$", node)
        check(w, bool(m) and m.group(3) == sts["spec"]["serviceName"]
              and m.group(4) == sts["metadata"]["namespace"]
              and int(m.group(2)) < sts["spec"]["replicas"], f"store node {node} is no Redis pod")
    # The sample tools are the fake tool from the image e2e.sh builds and the chart runs.
    tools = next((d for d in kind_docs.get("sample-tools.yaml", []) if d["kind"] == "Deployment"), None)
    if check(w, tools is not None, "sample-tools.yaml has no Deployment"):
        (ctr,) = tools["spec"]["template"]["spec"]["containers"]
        image = f"{values['image']['repository']}:{values['image']['tag']}"
        check(w, ctr.get("image") == image, f"sample tools run {ctr.get('image')}, not {image}")
        check(w, ctr.get("command") == ["/usr/local/bin/fake_tool"],
              f"sample tools run {ctr.get('command')}, not /usr/local/bin/fake_tool")
        dockerfile = Path("Dockerfile").read_text()
        check(w, re.search(r"^FROM \S+ AS e2e$", dockerfile, re.M) is not None
              and re.search(r"^COPY .* /usr/local/bin/fake_tool$", dockerfile, re.M) is not None,
              "the Dockerfile has no e2e target with /usr/local/bin/fake_tool")
        e2e = Path("deploy/kind/e2e.sh").read_text()
        check(w, f"IMAGE={image}" in e2e and "--target e2e" in e2e,
              f"deploy/kind/e2e.sh does not build {image} from the Dockerfile's e2e target")
    print("ok   deploy/kind manifests agree with values-e2e.yaml and the image" if not any(
        f.startswith(w + ":") for f in failures) else "FAIL deploy/kind cross-checks", flush=True)


def apply_patch(doc, ops):
    """RFC 6902 add/replace/remove, enough for an admission patch."""
    doc = copy.deepcopy(doc)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent = doc
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        last = parts[-1]
        if op["op"] == "add" and isinstance(parent, list):
            parent.insert(len(parent) if last == "-" else int(last), op["value"])
        elif op["op"] in ("add", "replace"):
            parent[int(last) if isinstance(parent, list) else last] = op["value"]
        elif op["op"] == "remove":
            del parent[int(last) if isinstance(parent, list) else last]
        else:
            raise ValueError(f"unsupported patch op {op['op']}")
    return doc


def tls_request(port, host, ca_file, method, path, body=None):
    ctx = ssl.create_default_context(cafile=ca_file)

    class Conn(http.client.HTTPSConnection):
        def connect(self):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            self.sock = ctx.wrap_socket(sock, server_hostname=host)

    conn = Conn(host, port, timeout=5)
    headers = {"Content-Type": "application/json"} if body is not None else {}
    conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
    resp = conn.getresponse()
    return resp.status, resp.read()


def sidecar_files(tmp, name, data):
    """Writes a rendered config ConfigMap as the sidecar would see it: its keys in a stand-in for
    CONFIG_MOUNT and, when the config names a signing key in EVIDENCE_MOUNT, a fresh Ed25519 key in
    a stand-in for that mount. Returns the config to check (the rendered text, with those two
    mount paths pointed at the stand-ins) and whether it has an evidence block."""
    root = Path(tmp, name)
    etc, secret = root / "etc", root / "evidence"
    etc.mkdir(parents=True)
    secret.mkdir()
    for key, value in data.items():
        (etc / key).write_text(value)
    text = data["toolgate.yaml"]
    evidence = (yaml.safe_load(text) or {}).get("evidence") or {}
    key_file = evidence.get("signing_key_file") or ""
    if key_file.startswith(EVIDENCE_MOUNT + "/"):
        (secret / key_file[len(EVIDENCE_MOUNT) + 1:]).write_text(ed25519_private_pem())
    if evidence:
        text = text.replace(EVIDENCE_MOUNT + "/", f"{secret}/").replace(CONFIG_MOUNT + "/", f"{etc}/")
    path = root / "toolgate.yaml"
    path.write_text(text)
    return path, bool(evidence)


def predates_evidence(out):
    """A `toolgate check` refusal that only says the binary has no evidence config yet."""
    return out.returncode != 0 and "unknown field `evidence`" in out.stdout + out.stderr


def check_with_binary(chart, tmp, renderings, kind_docs):
    """`toolgate check` on every config, good and bad; the injector round trips. Returns files to
    validate."""
    binary = os.environ.get("TOOLGATE_BIN") or "target/debug/toolgate"
    if not os.access(binary, os.X_OK):
        print(f"note no toolgate binary at {binary}: `toolgate check` of the rendered configs and "
              "the injector round trip were not run (set TOOLGATE_BIN)", flush=True)
        return []

    configs = {}  # the ConfigMap's data, as JSON → (label, data)
    for r in renderings.values():
        for d in r.all("ConfigMap"):
            if "toolgate.yaml" in d.get("data", {}):
                configs.setdefault(json.dumps(d["data"], sort_keys=True),
                                   (f"chart[{r.name}]", d["data"]))
    for p in sorted(Path("deploy/scenario").glob("toolgate-*.yaml")):
        data = {"toolgate.yaml": p.read_text()}
        configs.setdefault(json.dumps(data, sort_keys=True), (str(p), data))
    unchecked = []
    for i, (label, data) in enumerate(configs.values()):
        path, has_evidence = sidecar_files(tmp, f"config-{i}", data)
        out = subprocess.run([binary, "check", "--config", str(path)], capture_output=True, text=True)
        if has_evidence and predates_evidence(out):
            unchecked.append(label)
            continue
        check(label, out.returncode == 0, f"toolgate check refuses its config: {out.stdout}{out.stderr}")
    print(f"ok   toolgate check accepts {len(configs) - len(unchecked)} distinct configs" if not any(
        "toolgate check" in f for f in failures) else "FAIL toolgate check", flush=True)

    # Bad configs render (the chart does not repeat toolgate's rules); toolgate refuses them.
    for i, (name, values) in enumerate(BAD_CONFIGS.items()):
        w = f"config[{name}]"
        try:
            rendering = Rendering(chart, name, values)
        except helm.HelmError as err:
            check(w, False, f"the chart refuses it ({err}); the config rules are toolgate's")
            continue
        (data,) = {json.dumps(d["data"], sort_keys=True): d["data"] for d in rendering.all("ConfigMap")
                   if "toolgate.yaml" in d.get("data", {})}.values()
        path, has_evidence = sidecar_files(tmp, f"bad-config-{i}", data)
        out = subprocess.run([binary, "check", "--config", str(path)], capture_output=True, text=True)
        if has_evidence and predates_evidence(out):
            unchecked.append(w)
            continue
        check(w, out.returncode != 0, "toolgate check accepts it")
    checked_bad = len(BAD_CONFIGS) - sum(u.startswith("config[") for u in unchecked)
    print(f"ok   toolgate check refuses the {checked_bad} bad configs the chart renders"
          if not any(f.startswith("config[") for f in failures) else
          "FAIL toolgate check accepts a bad config", flush=True)
    if unchecked:
        print(f"note the toolgate binary at {binary} predates the evidence config (unknown field "
              f"`evidence`): `toolgate check` did not judge {len(unchecked)} configs with an "
              f"evidence block: {', '.join(unchecked)}", flush=True)

    out_files = injector_round_trip(binary, tmp, renderings["kind-e2e"], kind_docs)
    usage = subprocess.run([binary, "injector", "--help"], capture_output=True, text=True)
    if "--evidence-secret" in usage.stdout + usage.stderr:
        out_files += injector_round_trip(binary, tmp, renderings["kind-evidence-rotated"],
                                         kind_docs)
    else:
        print(f"note the toolgate injector at {binary} has no --evidence-secret flag: the round "
              "trip of chart[kind-evidence-rotated] (the evidence Secret mounted read-only where "
              "the config names the key) was not run", flush=True)
    return out_files


def injector_round_trip(binary, tmp, r, kind_docs):
    """Runs `toolgate injector` with rendering r's flags and generated certificate and sends it the
    kind agent pod, as a native sidecar and as a plain container. Returns the patched pods."""
    w = f"injector[{r.name}]"
    dep = r.one("Deployment")
    args = list(dep["spec"]["template"]["spec"]["containers"][0]["args"])
    injector = dep["metadata"]["name"]
    tls = next(d for d in r.all("Secret") if d["metadata"]["name"].endswith("-injector-tls"))
    tls_dir = Path(tmp, f"tls-{r.name}")
    tls_dir.mkdir()
    for key in ["tls.crt", "tls.key", "ca.crt"]:
        (tls_dir / key).write_text(b64(tls["data"][key]))
    ca_file = f"{tls_dir}/ca.crt"
    port = free_port()
    flags = dict(zip(args[1::2], args[2::2], strict=True))
    flags.update({"--listen": f"127.0.0.1:{port}", "--tls-cert": f"{tls_dir}/tls.crt",
                  "--tls-key": f"{tls_dir}/tls.key"})
    cmd = [binary, args[0], *[x for kv in flags.items() for x in kv]]
    host = f"{injector}.{NAMESPACE}.svc"
    evidence = r.merged["evidence"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    out_files = []
    try:
        deadline, healthy = time.monotonic() + 15, False
        while time.monotonic() < deadline and proc.poll() is None and not healthy:
            try:
                healthy = tls_request(port, host, ca_file, "GET", "/healthz")[0] == 200
            except OSError:
                time.sleep(0.1)
        if not check(w, healthy, f"GET /healthz over TLS with the chart's CA and SNI {host} "
                                 f"did not answer 200 ({' '.join(cmd)})"):
            return []
        job = next(d for d in kind_docs["agent-job.yaml"] if d["kind"] == "Job")
        ns = job["metadata"]["namespace"]
        template = job["spec"]["template"]
        config_maps = {(d["metadata"]["namespace"], d["metadata"]["name"]): d
                       for d in r.all("ConfigMap")}
        config = yaml.safe_load(config_maps.get((ns, flags["--config-map"]), {})
                                .get("data", {}).get("toolgate.yaml", "{}"))
        for native in (True, False):
            meta = copy.deepcopy(template["metadata"])
            meta.update({"name": "agent-e2e", "namespace": ns})
            if not native:
                meta["annotations"]["toolgate.dev/native-sidecar"] = "false"
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
                   "spec": copy.deepcopy(template["spec"])}
            gvk = {"group": "", "version": "v1", "kind": "Pod"}
            gvr = {"group": "", "version": "v1", "resource": "pods"}
            review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                      "request": {"uid": f"uid-{native}", "kind": gvk, "resource": gvr,
                                  "requestKind": gvk, "requestResource": gvr,
                                  "name": "agent-e2e", "namespace": ns, "operation": "CREATE",
                                  "userInfo": {"username":
                                               "system:serviceaccount:kube-system:job-controller"},
                                  "object": pod, "dryRun": False}}
            status, raw = tls_request(port, host, ca_file, "POST", "/mutate?timeout=5s", review)
            label = f"{w}[native-sidecar={'on' if native else 'off'}]"
            resp = json.loads(raw).get("response", {}) if status == 200 else {}
            if not check(label, resp.get("allowed") is True and resp.get("uid") == f"uid-{native}"
                         and resp.get("patchType") == "JSONPatch", f"answer {status} {raw[:300]!r}"):
                continue
            patched = apply_patch(pod, json.loads(base64.b64decode(resp["patch"])))
            spec = patched["spec"]
            if native:
                sidecar = (spec.get("initContainers") or [{}])[0]
                check(label, sidecar.get("name") == "toolgate"
                      and sidecar.get("restartPolicy") == "Always",
                      "toolgate is not the first init container with restartPolicy Always")
            else:
                sidecar = next((c for c in spec["containers"] if c["name"] == "toolgate"), {})
                check(label, bool(sidecar) and not any(
                    c["name"] == "toolgate" for c in spec.get("initContainers") or []),
                    "toolgate is not a plain container")
            check(label, spec["containers"][0] == template["spec"]["containers"][0],
                  "the agent container was changed")
            check(label, sidecar.get("image") == flags["--image"], "sidecar image")
            env = {e["name"]: e for e in sidecar.get("env", [])}
            ref = env.get("TOOLGATE_ADMIN_TOKEN", {}).get("valueFrom", {}).get("secretKeyRef", {})
            check(label, ref == {"name": flags["--admin-secret"], "key": "token"},
                  f"admin token reference {ref}")
            vols = {v["name"]: v for v in spec["volumes"]}
            check(label, vols.get("toolgate-config", {}).get("configMap", {}).get("name")
                  == flags["--config-map"], "config volume")
            rendered = {(d["metadata"]["namespace"], d["metadata"]["name"])
                        for d in r.docs if d["kind"] in ("ConfigMap", "Secret")}
            check(label, {(ns, flags["--config-map"]), (ns, flags["--admin-secret"])} <= rendered,
                  "the chart renders no ConfigMap/Secret the injected pod can mount")
            check_evidence_mount(label, evidence, config, spec, sidecar)
            check(label, patched["metadata"]["annotations"].get("toolgate.dev/injected") == "true",
                  "toolgate.dev/injected annotation")
            path = Path(tmp, f"injected-{r.name}-{'native' if native else 'plain'}.yaml")
            path.write_text(yaml.safe_dump(patched, sort_keys=False))
            out_files.append((label, path, 1))
        print(f"ok   injector round trip ({r.name}): both patched agent pods as expected" if not any(
            f.startswith(w) for f in failures) else f"FAIL injector round trip ({r.name})", flush=True)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
    return out_files


def check_evidence_mount(label, evidence, config, spec, sidecar):
    """With evidence.existingSecret: that Secret (not optional) mounted read-only into the sidecar
    alone, at the directory of the config's signing_key_file. Without it: no evidence mount."""
    vols = {v["name"]: v for v in spec.get("volumes") or []}
    mounts = {m["name"]: m for m in sidecar.get("volumeMounts") or []}
    others = [c["name"] for c in spec["containers"] + (spec.get("initContainers") or [])
              if c is not sidecar and any(m["name"] == EVIDENCE_VOLUME
                                          for m in c.get("volumeMounts") or [])]
    check(label, not others, f"containers {others} mount the evidence key; only toolgate may")
    if not evidence["existingSecret"]:
        check(label, EVIDENCE_VOLUME not in vols and EVIDENCE_VOLUME not in mounts
              and not any(m["mountPath"].startswith(EVIDENCE_MOUNT) for m in mounts.values()),
              "an evidence key is mounted although evidence.existingSecret is empty")
        check(label, "evidence" not in config, "the config has an evidence block")
        return
    secret = vols.get(EVIDENCE_VOLUME, {}).get("secret", {})
    check(label, secret.get("secretName") == evidence["existingSecret"],
          f"evidence volume {vols.get(EVIDENCE_VOLUME)} is not Secret {evidence['existingSecret']}")
    check(label, secret.get("optional") is not True,
          "the evidence Secret is optional: a pod without it would sign with the derived key")
    mount = mounts.get(EVIDENCE_VOLUME, {})
    check(label, mount.get("mountPath") == EVIDENCE_MOUNT and mount.get("readOnly") is True
          and not mount.get("subPath"), f"evidence mount {mount}, want {EVIDENCE_MOUNT} read-only")
    items = {i["key"]: i["path"] for i in secret.get("items") or []}
    file_name = items.get(evidence["secretKey"]) if items else evidence["secretKey"]
    key_file = (config.get("evidence") or {}).get("signing_key_file")
    check(label, file_name is not None and key_file == f"{mount.get('mountPath')}/{file_name}",
          f"the config's signing_key_file {key_file} is not the mounted key {file_name}")


def check_scenario_configs():
    """The scenario configs define the same tools (`toolgate check` judges each one)."""
    configs = {str(p): yaml.safe_load(p.read_text())
               for p in sorted(Path("deploy/scenario").glob("toolgate-*.yaml"))}
    configs["deploy/kind/values-e2e.yaml"] = VARIANTS["kind-e2e"]["config"]
    check("deploy/scenario", len(configs) >= 3, "scenario configs are missing")

    def shape(cfg):
        # Everything but the upstream's address; its path is the fake tool's route.
        return [{k: (urllib.parse.urlsplit(v).path if k == "upstream" else v) for k, v in t.items()}
                for t in cfg["tools"]]

    first = None
    for name, cfg in configs.items():
        if first is None:
            first = (name, shape(cfg))
        else:
            check(name, shape(cfg) == first[1],
                  f"tools differ from {first[0]} (beyond the upstream's address)")
    print(f"ok   {len(configs)} scenario configs agree on their tools"
          if not any(f.startswith(("deploy/scenario", "deploy/kind/values")) for f in failures)
          else "FAIL scenario configs", flush=True)


if __name__ == "__main__":
    sys.exit(main())
