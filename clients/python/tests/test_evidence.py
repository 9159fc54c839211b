"""Signed evidence: `toolgate.evidence.verify` on the real sidecar's bundles and records, against
every kind of tampering, and both ways with independent implementations: joserfc (a JOSE
library) checks toolgate's bundles, and the `toolgate verify` binary checks bundles that joserfc
signed."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from conftest import Sidecar, binary, new_id

import toolgate
from toolgate.evidence import InvalidEvidence, Statement, verify

try:
    from joserfc import jws
    from joserfc.errors import BadSignatureError, SecurityWarning
    from joserfc.jwk import OKPKey
except ImportError as e:  # a missing dependency fails, it never skips
    pytest.fail(
        f"joserfc is not installed ({e}): pip install -r clients/python/requirements-test.txt", pytrace=False
    )

# The calls of the signed run: READY ones (one finding nothing), and one ERROR that is no fact.
# The echo input has texts that Python's json.dumps would spell differently from toolgate
# (non-ASCII, an exponent, a big integer): the digests cover toolgate's own spelling.
ECHO_INPUT = {"text": "naïve ✓", "big": 12345678901234567890123, "tiny": 1e-300, "huge": 1e300, "f": 0.1}
READY_IDS = ["call_search", "call_echo", "call_none"]
ERROR_ID = "call_fail"


def b64url(data: bytes) -> str:
    """base64url without padding."""
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def unb64url(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True)
class Signed:
    """A run of the sidecar with its bundle, key set and records, each exactly as served."""

    run_id: str
    run_token: str
    bundle: bytes
    jwks: bytes
    records: dict[str, bytes]
    facts: toolgate.Facts


def served(sidecar: Sidecar, path: str, *, token: bool = True) -> bytes:
    """The body of a GET on the admin listener, byte for byte."""
    headers = {"Authorization": f"Bearer {sidecar.admin_token}"} if token else {}
    response = httpx.get(f"{sidecar.admin_url}{path}", headers=headers, timeout=30.0)
    assert response.status_code == 200, (path, response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json")
    return response.content


def record_path(run_id: str, tool_call_id: str) -> str:
    return f"/v1/runs/{quote(run_id, safe='')}/invocations/{quote(tool_call_id, safe='')}"


@pytest.fixture
def harness(sidecar: Sidecar) -> Iterator[toolgate.Harness]:
    with toolgate.Harness(
        sidecar.admin_url, admin_token=sidecar.admin_token, agent_url=sidecar.agent_url
    ) as h:
        yield h


@pytest.fixture(scope="module")
def signed(sidecar: Sidecar) -> Signed:
    """An active run with three READY calls and one ERROR, and its bundle."""
    run_id = new_id("run-ev")
    with toolgate.Harness(
        sidecar.admin_url, admin_token=sidecar.admin_token, agent_url=sidecar.agent_url
    ) as harness:
        run = harness.create_run(run_id, tools=["search", "echo", "fail"])
        agent = run.agent()
        agent.invoke("search", {"q": "redis"}, tool_call_id="call_search")
        with pytest.raises(toolgate.ToolgateError):
            agent.invoke("fail", {}, tool_call_id=ERROR_ID)
        agent.invoke("echo", ECHO_INPUT, tool_call_id="call_echo")
        agent.invoke("search", {"q": "nothing"}, tool_call_id="call_none")
        facts = run.facts()
    return Signed(
        run_id=run_id,
        run_token=run.run_token,
        bundle=served(sidecar, f"/v1/runs/{run_id}/evidence"),
        jwks=served(sidecar, "/.well-known/jwks.json", token=False),
        records={i: served(sidecar, record_path(run_id, i)) for i in [*READY_IDS, ERROR_ID]},
        facts=facts,
    )


@pytest.fixture
def bundle(signed: Signed) -> dict[str, Any]:
    """The signed run's bundle as a dict of its own, for a test to change."""
    parsed: dict[str, Any] = json.loads(signed.bundle)
    return parsed


@pytest.fixture
def jwks(signed: Signed) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(signed.jwks)
    return parsed


# --- Bundles of the sidecar ----------------------------------------------------------------------


def test_a_bundle_of_the_sidecar_verifies_with_its_records(
    harness: toolgate.Harness, signed: Signed, jwks: dict[str, Any]
) -> None:
    statement = verify(signed.bundle, signed.jwks, signed.records)
    assert isinstance(statement, Statement)
    assert (statement.typ, statement.iss, statement.run_id, statement.state) == (
        "toolgate.evidence.v1",
        "toolgate",
        signed.run_id,
        "ACTIVE",
    )
    assert statement.kid == jwks["keys"][0]["kid"]  # the signing key comes first
    assert (
        (statement.excluded, statement.tampered) == (signed.facts.excluded, signed.facts.tampered) == (1, 0)
    )

    # The facts of the statement are the run's facts: the same ids, order, tools and results.
    assert [f.seq for f in statement.facts] == [1, 2, 3]
    assert [(f.tool_call_id, f.tool, f.evidence_status, f.result) for f in statement.facts] == [
        (f.tool_call_id, f.tool, f.evidence_status, f.result) for f in signed.facts.facts
    ]
    assert [f.tool_call_id for f in statement.facts] == READY_IDS
    assert statement.facts[2].evidence_status == "NO_EVIDENCE"

    # Each fact's digests are those of its record, as the harness reads it.
    run = harness.attach(signed.run_id, signed.run_token)
    for fact in statement.facts:
        record = run.invocation(fact.tool_call_id)
        assert (record["request_sha256"], record["raw_sha256"], record["result_sha256"]) == (
            fact.request_sha256,
            fact.raw_sha256,
            fact.result_sha256,
        )
        assert fact.request_sha256 and fact.raw_sha256 and fact.result_sha256
        assert fact.created_at <= fact.updated_at <= statement.issued_at
        assert record["status"] == "READY" and isinstance(record["seal"], str)
    assert statement.issued_at.tzinfo is not None
    # The ERROR call is sealed too, and is no fact.
    assert run.invocation(ERROR_ID)["status"] == "ERROR"


def test_a_bundle_verifies_as_a_dict_as_text_and_without_records(
    signed: Signed, bundle: dict[str, Any], jwks: dict[str, Any]
) -> None:
    statement = verify(signed.bundle, signed.jwks)
    assert verify(bundle, jwks) == statement
    assert verify(signed.bundle.decode(), signed.jwks.decode()) == statement
    # Records of calls that are no facts are not needed, and ignored when given.
    assert verify(bundle, jwks, {i: signed.records[i] for i in READY_IDS}) == statement
    with pytest.raises(dataclasses.FrozenInstanceError):
        statement.run_id = "other"  # type: ignore[misc]


def test_the_bundle_of_an_ended_run_and_of_an_empty_one(
    harness: toolgate.Harness, sidecar: Sidecar, run_id: str
) -> None:
    run = harness.create_run(run_id, tools=["echo"])
    empty = verify(run.evidence(), served(sidecar, "/.well-known/jwks.json", token=False), {})
    assert (empty.run_id, empty.state, empty.facts, empty.excluded) == (run_id, "ACTIVE", (), 0)

    run.agent().invoke("echo", {"n": 1}, tool_call_id="c1")
    facts = run.end()
    bundle = run.evidence()
    records = {"c1": served(sidecar, record_path(run_id, "c1"))}
    statement = verify(bundle, served(sidecar, "/.well-known/jwks.json", token=False), records)
    assert statement.state == "ENDED"
    assert [(f.tool_call_id, f.result) for f in statement.facts] == [("c1", facts.facts[0].result)]
    assert statement.issued_at >= empty.issued_at


def test_the_telemetry_listener_serves_the_same_key_set(sidecar: Sidecar, signed: Signed) -> None:
    response = httpx.get(f"{sidecar.telemetry_url}/.well-known/jwks.json", timeout=30.0)
    assert response.status_code == 200
    assert response.json() == json.loads(signed.jwks)
    for key in json.loads(signed.jwks)["keys"]:
        assert "d" not in key  # never a private part


# --- Tampering ----------------------------------------------------------------------------------


def change_statement(old: bytes, new: bytes) -> Callable[[dict[str, Any]], None]:
    """A change of the signed statement's bytes, the signature left as it was."""

    def change(bundle: dict[str, Any]) -> None:
        payload = unb64url(bundle["payload"])
        assert old in payload
        bundle["payload"] = b64url(payload.replace(old, new, 1))

    return change


def change_header(**members: Any) -> Callable[[dict[str, Any]], None]:
    """A new protected header: the old one's members, changed (None: removed) or added."""

    def change(bundle: dict[str, Any]) -> None:
        header = json.loads(unb64url(bundle["signatures"][0]["protected"]))
        header.update(members)
        header = {k: v for k, v in header.items() if v is not None}
        bundle["signatures"][0]["protected"] = b64url(json.dumps(header, separators=(",", ":")).encode())

    return change


def reorder_header(bundle: dict[str, Any]) -> None:
    header = json.loads(unb64url(bundle["signatures"][0]["protected"]))
    reordered = {k: header[k] for k in ("typ", "kid", "alg")}
    bundle["signatures"][0]["protected"] = b64url(json.dumps(reordered, separators=(",", ":")).encode())


def change_payload_character(bundle: dict[str, Any]) -> None:
    payload = bundle["payload"]
    middle = len(payload) // 2
    bundle["payload"] = payload[:middle] + ("A" if payload[middle] != "A" else "B") + payload[middle + 1 :]


def flip_signature_bit(bundle: dict[str, Any]) -> None:
    sig = bytearray(unb64url(bundle["signatures"][0]["signature"]))
    sig[0] ^= 1
    bundle["signatures"][0]["signature"] = b64url(bytes(sig))


def truncate_signature(bundle: dict[str, Any]) -> None:
    bundle["signatures"][0]["signature"] = b64url(unb64url(bundle["signatures"][0]["signature"])[:63])


def pad_payload(bundle: dict[str, Any]) -> None:
    bundle["payload"] += "=" * (-len(bundle["payload"]) % 4 or 4)


def pad_signature(bundle: dict[str, Any]) -> None:
    bundle["signatures"][0]["signature"] += "=="  # a 64-byte signature is 86 characters, 2 short of 4n


def standard_base64_payload(bundle: dict[str, Any]) -> None:
    # '+' and '/' are standard base64's, which base64url spells '-' and '_'.
    bundle["payload"] = "+" + bundle["payload"][1:]


def two_signatures(bundle: dict[str, Any]) -> None:
    bundle["signatures"].append(dict(bundle["signatures"][0]))


def no_signature(bundle: dict[str, Any]) -> None:
    bundle["signatures"] = []


def unprotected_header(bundle: dict[str, Any]) -> None:
    bundle["signatures"][0]["header"] = {"kid": "x"}


def extra_member(bundle: dict[str, Any]) -> None:
    bundle["protected"] = bundle["signatures"][0]["protected"]


TAMPERING: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "a byte of the statement": (change_statement(b'"excluded":1', b'"excluded":0'), "bad signature"),
    "a fact's result": (change_statement(b'"Result 1 for redis"', b'"Result 9 for redis"'), "bad signature"),
    "a character of the payload": (change_payload_character, "bad signature"),
    "a bit of the signature": (flip_signature_bit, "bad signature"),
    "a short signature": (truncate_signature, "bad signature"),
    "the header's member order": (reorder_header, "bad signature"),
    "an unknown kid": (change_header(kid=b64url(b"k" * 32)), "unknown kid"),
    "no kid": (change_header(kid=None), "exactly alg, kid and typ"),
    "the header's typ": (change_header(typ="JWT"), "wrong typ 'JWT' in the protected header"),
    "the header's alg": (change_header(alg="none"), "wrong alg 'none'"),
    "an HMAC alg": (change_header(alg="HS256"), "wrong alg 'HS256'"),
    "a member added to the header": (change_header(crit=["exp"]), "exactly alg, kid and typ"),
    "padding on the payload": (pad_payload, "payload is not base64url without padding"),
    "padding on the signature": (pad_signature, "signature is not base64url without padding"),
    "standard base64": (standard_base64_payload, "payload is not base64url without padding"),
    "two signatures": (two_signatures, "exactly one signature"),
    "no signature": (no_signature, "exactly one signature"),
    "an unprotected header": (unprotected_header, "exactly protected and signature"),
    "a member added to the bundle": (extra_member, "exactly payload and signatures"),
}


@pytest.mark.parametrize("name", sorted(TAMPERING))
def test_a_tampered_bundle_is_invalid(name: str, bundle: dict[str, Any], jwks: dict[str, Any]) -> None:
    tamper, reason = TAMPERING[name]
    tamper(bundle)
    with pytest.raises(InvalidEvidence, match=reason) as info:
        verify(bundle, jwks)
    assert str(info.value) == info.value.reason


@pytest.mark.parametrize("text", [b"", b"not json", b"[]", b'{"payload":"", "payload":""}', b"\xff{}"])
def test_a_bundle_that_is_no_json_object_is_invalid(text: bytes, jwks: dict[str, Any]) -> None:
    with pytest.raises(InvalidEvidence, match="malformed bundle"):
        verify(text, jwks)


def test_a_wrong_key_set_is_invalid(bundle: dict[str, Any], jwks: dict[str, Any]) -> None:
    signing = jwks["keys"][0]
    kid = signing["kid"]
    other = jwk_of(OKPKey.generate_key("Ed25519"))
    cases: list[tuple[object, str]] = [
        ({"keys": [other]}, f"unknown kid {kid}"),
        ({"keys": []}, f"unknown kid {kid}"),
        ({"keys": "none"}, "malformed JWKS"),
        (b"{", "malformed JWKS"),
        # The kid kept, the key another: its thumbprint is not the kid.
        ({"keys": [{**other, "kid": kid}]}, "not the key's RFC 7638 thumbprint"),
        ({"keys": [{**signing, "crv": "Ed448"}]}, "not an Ed25519 key"),
        ({"keys": [{**signing, "kty": "EC"}]}, "not an Ed25519 key"),
        ({"keys": [{**signing, "use": "enc"}]}, "not for EdDSA signatures"),
        ({"keys": [{**signing, "x": signing["x"] + "="}]}, "x is not a 32-byte key"),
        # The first key under the kid is the one.
        ({"keys": [{**other, "kid": kid}, signing]}, "not the key's RFC 7638 thumbprint"),
    ]
    for key_set, reason in cases:
        with pytest.raises(InvalidEvidence, match=reason):
            verify(bundle, key_set)  # type: ignore[arg-type]
    # The right key among others, in any place, verifies.
    assert verify(bundle, {"keys": [other, signing]}).kid == kid
    assert verify(bundle, {"keys": [signing, signing]}).kid == kid  # listed twice: one key


def test_a_tampered_record_is_invalid(signed: Signed) -> None:
    def records_with(tool_call_id: str, body: bytes) -> dict[str, bytes]:
        return {**signed.records, tool_call_id: body}

    search = signed.records["call_search"]
    at = search.index(b'"raw_response":')
    changed_raw = search[:at] + search[at:].replace(b"Result 1 for redis", b"Result 9 for redis", 1)
    assert changed_raw != search
    with pytest.raises(InvalidEvidence, match=r"fact 1 \(call_search\): the record's raw_response") as info:
        verify(signed.bundle, signed.jwks, records_with("call_search", changed_raw))
    assert "raw_sha256" in info.value.reason

    at = search.index(b'"request":')
    changed_request = search[:at] + search[at:].replace(b'"redis"', b'"Redis"', 1)
    with pytest.raises(InvalidEvidence, match="the record's request does not match request_sha256"):
        verify(signed.bundle, signed.jwks, records_with("call_search", changed_request))

    # The same values, spelled by Python: the digests cover toolgate's exact texts.
    respelled = json.dumps(json.loads(signed.records["call_echo"])).encode()
    with pytest.raises(InvalidEvidence, match=r"fact 2 \(call_echo\): the record's request"):
        verify(signed.bundle, signed.jwks, records_with("call_echo", respelled))

    # Another call's record, another run's, a missing one, one that is not JSON.
    with pytest.raises(InvalidEvidence, match="record's tool_call_id is not 'call_echo'"):
        verify(signed.bundle, signed.jwks, records_with("call_echo", search))
    other_run = search.replace(signed.run_id.encode(), b"run-other", 1)
    with pytest.raises(InvalidEvidence, match="record's run_id is not"):
        verify(signed.bundle, signed.jwks, records_with("call_search", other_run))
    missing = {k: v for k, v in signed.records.items() if k != "call_none"}
    with pytest.raises(InvalidEvidence, match=r"fact 3 \(call_none\): no record given"):
        verify(signed.bundle, signed.jwks, missing)
    with pytest.raises(InvalidEvidence, match="its record is not a JSON object"):
        verify(signed.bundle, signed.jwks, records_with("call_search", search[:-1]))


# --- Bundles signed by joserfc --------------------------------------------------------------------


def jwk_of(key: OKPKey) -> dict[str, Any]:
    """The public JWK toolgate publishes for an Ed25519 key, kid its RFC 7638 thumbprint."""
    public = key.as_dict(private=False)
    return {
        "kty": "OKP",
        "crv": "Ed25519",
        "x": public["x"],
        "kid": key.thumbprint(),
        "alg": "EdDSA",
        "use": "sig",
    }


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def a_statement(run_id: str, n: int) -> dict[str, Any]:
    """A statement of toolgate's shape with n facts."""
    facts = [
        {
            "seq": i,
            "tool_call_id": f"call_{i}",
            "tool": "search",
            "evidence_status": "EVIDENCE_FOUND",
            "result": {"items": [{"title": f"result {i}"}], "total_items": 1},
            "request_sha256": sha256_hex(f'{{"q":"q{i}"}}'),
            "raw_sha256": sha256_hex(f'{{"results":[{i}]}}'),
            "result_sha256": sha256_hex(f'{{"items":[{i}]}}'),
            "created_at": f"2026-03-04T05:06:0{i}.123Z",
            "updated_at": f"2026-03-04T05:06:0{i}.456Z",
        }
        for i in range(1, n + 1)
    ]
    return {
        "typ": "toolgate.evidence.v1",
        "iss": "toolgate",
        "run_id": run_id,
        "state": "ENDED",
        "issued_at": "2026-03-04T05:07:00.000Z",
        "facts": facts,
        "excluded": 1,
        "tampered": 0,
    }


def sign(statement: dict[str, Any], key: OKPKey, kid: str | None = None) -> dict[str, Any]:
    """A bundle signed by joserfc: the General JSON Serialization, toolgate's protected header."""
    header = {"alg": "EdDSA", "kid": kid or key.thumbprint(), "typ": "toolgate-evidence+json"}
    payload = json.dumps(statement, separators=(",", ":"), ensure_ascii=False).encode()
    with warnings.catch_warnings():
        # joserfc prefers RFC 9864's "Ed25519" to "EdDSA", which toolgate signs with (RFC 8037).
        warnings.simplefilter("ignore", SecurityWarning)
        bundle: dict[str, Any] = dict(
            jws.serialize_json([{"protected": header}], payload, key, algorithms=["EdDSA"])
        )
    return bundle


def test_joserfc_verifies_a_bundle_of_the_sidecar(signed: Signed, jwks: dict[str, Any]) -> None:
    bundle = json.loads(signed.bundle)
    header = json.loads(unb64url(bundle["signatures"][0]["protected"]))
    jwk = next(k for k in jwks["keys"] if k["kid"] == header["kid"])
    # toolgate's header, byte for byte.
    assert unb64url(bundle["signatures"][0]["protected"]) == (
        f'{{"alg":"EdDSA","kid":"{jwk["kid"]}","typ":"toolgate-evidence+json"}}'.encode()
    )
    key = OKPKey.import_key(jwk)
    assert key.thumbprint() == jwk["kid"]  # joserfc's own RFC 7638 thumbprint
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SecurityWarning)
        verified = jws.deserialize_json(bundle, key, algorithms=["EdDSA"])
    assert verified.members[0].protected == {
        "alg": "EdDSA",
        "kid": jwk["kid"],
        "typ": "toolgate-evidence+json",
    }
    assert json.loads(verified.payload) == json.loads(unb64url(bundle["payload"]))
    assert json.loads(verified.payload)["run_id"] == signed.run_id

    flip_signature_bit(bundle)
    with warnings.catch_warnings(), pytest.raises(BadSignatureError):
        warnings.simplefilter("ignore", SecurityWarning)
        jws.deserialize_json(bundle, key, algorithms=["EdDSA"])


def test_verify_accepts_a_bundle_signed_by_joserfc() -> None:
    key = OKPKey.generate_key("Ed25519")
    key_set = {"keys": [jwk_of(key)]}
    statement = verify(sign(a_statement("run-jose", 2), key), key_set)
    assert (statement.run_id, statement.state, statement.kid) == ("run-jose", "ENDED", key.thumbprint())
    assert [f.tool_call_id for f in statement.facts] == ["call_1", "call_2"]
    assert isinstance(statement.facts[0].created_at, datetime)

    # Signed by one key under another's kid: the signature does not verify.
    impostor = OKPKey.generate_key("Ed25519")
    with pytest.raises(InvalidEvidence, match="bad signature"):
        verify(sign(a_statement("run-jose", 2), impostor, kid=key.thumbprint()), key_set)


STATEMENT_FAULTS: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "a wrong typ": (
        lambda s: s.update(typ="toolgate.evidence.v2"),
        "wrong typ 'toolgate.evidence.v2' in the statement",
    ),
    "no typ": (lambda s: s.pop("typ"), "wrong typ None in the statement"),
    "a seq out of order": (lambda s: s["facts"][1].update(seq=3), "fact 2's seq is not 2"),
    "a digest in capitals": (
        lambda s: s["facts"][0].update(raw_sha256="AB" * 32),
        "not a lowercase hex SHA-256",
    ),
    "no result": (lambda s: s["facts"][0].pop("result"), "fact 1 has no result"),
    "a bad time": (lambda s: s.update(issued_at="yesterday"), "issued_at is not an RFC 3339 time"),
    "a count that is a bool": (lambda s: s.update(excluded=True), "excluded is not an integer"),
    "a negative count": (lambda s: s.update(tampered=-1), "tampered is negative"),
}


@pytest.mark.parametrize("name", sorted(STATEMENT_FAULTS))
def test_a_signed_statement_of_the_wrong_shape_is_invalid(name: str) -> None:
    fault, reason = STATEMENT_FAULTS[name]
    key = OKPKey.generate_key("Ed25519")
    statement = a_statement("run-jose", 2)
    fault(statement)
    with pytest.raises(InvalidEvidence, match=reason):
        verify(sign(statement, key), {"keys": [jwk_of(key)]})


# --- The toolgate binary --------------------------------------------------------------------------


def toolgate_verify(
    bundle: bytes, jwks: bytes, tmp_path: Path, records: Path | None = None
) -> tuple[int, str]:
    """`toolgate verify` on files: its exit code and its output."""
    exe = binary("TOOLGATE_BIN", "target/debug/toolgate", "cargo build --bin toolgate")
    (tmp_path / "bundle.json").write_bytes(bundle)
    (tmp_path / "jwks.json").write_bytes(jwks)
    args = [
        str(exe),
        "verify",
        "--bundle",
        str(tmp_path / "bundle.json"),
        "--jwks",
        str(tmp_path / "jwks.json"),
    ]
    if records is not None:
        args += ["--records", str(records)]
    done = subprocess.run(args, capture_output=True, timeout=60)
    return done.returncode, (done.stdout + done.stderr).decode()


def test_the_binary_accepts_a_bundle_signed_by_joserfc_and_refuses_it_tampered(tmp_path: Path) -> None:
    key = OKPKey.generate_key("Ed25519")
    kid = key.thumbprint()
    jwks = json.dumps({"keys": [jwk_of(key)]}).encode()
    bundle = sign(a_statement("run-jose", 3), key)

    code, out = toolgate_verify(json.dumps(bundle).encode(), jwks, tmp_path)
    assert (code, out.strip()) == (0, f"valid: run run-jose, 3 facts, key {kid}"), out

    change_statement(b'"excluded":1', b'"excluded":0')(bundle)
    code, out = toolgate_verify(json.dumps(bundle).encode(), jwks, tmp_path)
    assert code == 1, out
    assert len(out.strip().splitlines()) == 1, out


def test_the_binary_checks_a_bundle_of_the_sidecar_against_its_records(
    signed: Signed, tmp_path: Path
) -> None:
    records = tmp_path / "records"
    records.mkdir()
    for tool_call_id, body in signed.records.items():
        (records / f"{tool_call_id}.json").write_bytes(body)
    kid = json.loads(signed.jwks)["keys"][0]["kid"]
    code, out = toolgate_verify(signed.bundle, signed.jwks, tmp_path, records)
    assert (code, out.strip()) == (0, f"valid: run {signed.run_id}, 3 facts, key {kid}"), out

    search = signed.records["call_search"]
    at = search.index(b'"raw_response":')
    (records / "call_search.json").write_bytes(
        search[:at] + search[at:].replace(b"Result 1 for redis", b"Result 9 for redis", 1)
    )
    code, out = toolgate_verify(signed.bundle, signed.jwks, tmp_path, records)
    assert code == 1, out
    assert len(out.strip().splitlines()) == 1 and "call_search" in out, out

    (records / "call_search.json").unlink()
    code, out = toolgate_verify(signed.bundle, signed.jwks, tmp_path, records)
    assert code == 1, out


# --- The extra ------------------------------------------------------------------------------------


def test_cryptography_is_needed_only_when_verify_runs() -> None:
    script = (
        "import sys\n"
        "sys.modules['cryptography'] = None  # as if it were not installed\n"
        "import toolgate.evidence\n"
        "try:\n"
        "    toolgate.evidence.verify({}, {})\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "pip install 'toolgate[evidence]'" in done.stdout
