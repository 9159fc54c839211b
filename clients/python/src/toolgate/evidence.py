"""Offline verification of toolgate's signed evidence (``pip install 'toolgate[evidence]'``).

A bundle (``Run.evidence()``, ``GET /v1/runs/{run_id}/evidence``) is a JWS in its General JSON
Serialization, signed with Ed25519 (``alg`` ``EdDSA``), whose payload is the run's statement: its
facts, each with the SHA-256 digests of the call's request, raw response and projected result as
toolgate stored them. ``verify(bundle, jwks)`` checks it against toolgate's public keys
(``GET /.well-known/jwks.json``) with no network, and returns the statement. Given the records
(the bodies of ``GET …/invocations/{tool_call_id}``, as bytes), it also checks that every fact's
digests match the texts in its record, so the record in hand is the one toolgate signed for.

Any JOSE library can check the signature; this module also checks what is particular to toolgate
(the exact protected header, the key id as the key's RFC 7638 thumbprint, the statement's
``typ``, the digests). It needs ``cryptography``, imported only when ``verify`` runs, so
``import toolgate.evidence`` works with the core alone.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ._models import parse_time

__all__ = ["InvalidEvidence", "Statement", "StatementFact", "verify"]

ALG = "EdDSA"
"""The JWS algorithm of a bundle: Ed25519."""

HEADER_TYP = "toolgate-evidence+json"
"""The ``typ`` of a bundle's protected header."""

STATEMENT_TYP = "toolgate.evidence.v1"
"""The ``typ`` of the statement a bundle signs."""

_B64URL = re.compile(r"[A-Za-z0-9_-]*")
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_JSON_SPACE = " \t\n\r"
_KINDS = {str: "a string", int: "an integer", list: "a list"}
# The record parts a fact's digests cover, each with its digest's name in the statement.
_DIGESTS = (("request", "request_sha256"), ("raw_response", "raw_sha256"), ("agent_result", "result_sha256"))


class InvalidEvidence(Exception):
    """A bundle, key set or record that does not verify.

    ``reason`` names the first failure found (a malformed bundle, an unknown key id, a bad
    signature, a wrong ``typ``, a digest that does not match its record, …); ``str(error)`` is
    the reason.
    """

    reason: str

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:
        return (InvalidEvidence, (self.reason,))


@dataclass(frozen=True)
class StatementFact:
    """One fact of a verified statement: a READY call of the run, with the digests of its record.

    ``seq`` counts from 1 in the facts' order (completion order). A digest is the lowercase hex
    SHA-256 of the part's compact JSON text as stored (``request``, ``raw_response``,
    ``agent_result``), or None where the part is null.
    """

    seq: int
    tool_call_id: str
    tool: str
    evidence_status: str
    result: Any
    request_sha256: str | None
    raw_sha256: str | None
    result_sha256: str | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class Statement:
    """What a verified bundle says about a run, and the key that signed it.

    ``state`` is the run's state when the bundle was issued (an ``ACTIVE`` run's bundle is a
    snapshot); ``facts`` are the run's facts at ``issued_at``, as ``Run.facts()`` listed them;
    ``excluded`` and ``tampered`` count as in ``Facts``. ``kid`` is the id (RFC 7638 thumbprint)
    of the key that signed it.
    """

    typ: str
    iss: str
    run_id: str
    state: str
    issued_at: datetime
    facts: tuple[StatementFact, ...]
    excluded: int
    tampered: int
    kid: str


def verify(
    bundle: dict[str, Any] | str | bytes,
    jwks: dict[str, Any] | str | bytes,
    records: Mapping[str, bytes] | None = None,
) -> Statement:
    """Verify an evidence bundle offline and return its statement.

    ``bundle`` is the bundle as a dict (``Run.evidence()``) or its JSON text; ``jwks`` is
    toolgate's JWK Set (``GET /.well-known/jwks.json``), likewise. Checks the serialization
    (exactly one signature, base64url without padding), the protected header (exactly ``alg``
    ``EdDSA``, ``kid`` and ``typ`` ``toolgate-evidence+json``), that the key set holds an Ed25519
    key under that ``kid`` whose RFC 7638 thumbprint is the ``kid``, the Ed25519 signature, and
    the statement (``typ`` ``toolgate.evidence.v1`` and the shape of every field).

    ``records`` maps tool call ids to record bodies, the bytes ``GET …/invocations/{id}``
    answered (not re-serialized: the digests cover the exact texts). Given it, every fact needs
    its record, whose run id and tool call id must be the fact's and whose ``request``,
    ``raw_response`` and ``agent_result`` texts must match the fact's digests. Records of calls
    that are not facts are ignored.

    Raises ``InvalidEvidence`` naming the first failure, and ``ImportError`` without
    ``cryptography``.
    """
    ed25519, invalid_signature = _crypto()
    envelope = _json_object(bundle, "bundle")
    if set(envelope) != {"payload", "signatures"}:
        raise InvalidEvidence("malformed bundle: its members must be exactly payload and signatures")
    signatures = envelope["signatures"]
    if not isinstance(signatures, list) or len(signatures) != 1:
        raise InvalidEvidence("malformed bundle: it must have exactly one signature")
    signature = signatures[0]
    if not isinstance(signature, dict) or set(signature) != {"protected", "signature"}:
        raise InvalidEvidence(
            "malformed bundle: its signature's members must be exactly protected and signature"
        )
    payload_b64 = envelope["payload"]
    protected_b64 = signature["protected"]
    payload = _b64url(payload_b64, "payload")
    protected = _b64url(protected_b64, "protected header")
    sig = _b64url(signature["signature"], "signature")

    kid = _protected_header(protected)
    key = _key(_json_object(jwks, "JWKS"), kid)
    try:
        public_key = ed25519.from_public_bytes(key)
    except ValueError:
        raise InvalidEvidence(f"key {kid} is not a valid Ed25519 public key") from None
    try:
        public_key.verify(sig, f"{protected_b64}.{payload_b64}".encode("ascii"))
    except invalid_signature:
        raise InvalidEvidence(f"bad signature (key {kid})") from None

    statement = _statement(_json_object(payload, "statement"), kid)
    if records is not None:
        for fact in statement.facts:
            body = records.get(fact.tool_call_id)
            if body is None:
                raise InvalidEvidence(f"fact {fact.seq} ({fact.tool_call_id}): no record given")
            _check_record(statement.run_id, fact, body)
    return statement


def _crypto() -> tuple[Any, type[Exception]]:
    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    except ImportError as e:
        raise ImportError("toolgate.evidence needs cryptography: pip install 'toolgate[evidence]'") from e
    return Ed25519PublicKey, InvalidSignature


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise ValueError("a duplicate member")
    return obj


def _json_object(value: object, what: str) -> dict[str, Any]:
    """``value`` as a JSON object: a dict as it is, JSON text parsed (UTF-8, no duplicate member)."""
    if isinstance(value, dict):
        return value
    if not isinstance(value, (str, bytes, bytearray)):
        raise TypeError(f"the {what} must be a dict, str or bytes, not {type(value).__name__}")
    try:
        text = value if isinstance(value, str) else bytes(value).decode("utf-8")
        parsed = json.loads(text, object_pairs_hook=_no_duplicates)
    except ValueError:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise InvalidEvidence(f"malformed {what}: not a JSON object") from None
    if not isinstance(parsed, dict):
        raise InvalidEvidence(f"malformed {what}: not a JSON object")
    return parsed


def _b64url(value: object, what: str) -> bytes:
    """base64url without padding, in its one canonical spelling."""
    if not isinstance(value, str) or not _B64URL.fullmatch(value) or len(value) % 4 == 1:
        raise InvalidEvidence(f"malformed bundle: the {what} is not base64url without padding")
    try:
        decoded = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
    except binascii.Error:
        raise InvalidEvidence(f"malformed bundle: the {what} is not base64url without padding") from None
    if _b64url_encode(decoded) != value:  # unused bits set in the last character
        raise InvalidEvidence(f"malformed bundle: the {what} is not base64url without padding")
    return decoded


def _b64url_encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def _protected_header(protected: bytes) -> str:
    """The key id of a protected header that is exactly toolgate's."""
    header = _json_object(protected, "protected header")
    if set(header) != {"alg", "kid", "typ"}:
        raise InvalidEvidence("malformed bundle: the protected header must be exactly alg, kid and typ")
    if header["alg"] != ALG:
        raise InvalidEvidence(f"wrong alg {header['alg']!r}: a bundle is signed with {ALG}")
    if header["typ"] != HEADER_TYP:
        raise InvalidEvidence(f"wrong typ {header['typ']!r} in the protected header: expected {HEADER_TYP}")
    kid = header["kid"]
    if not isinstance(kid, str) or not kid:
        raise InvalidEvidence("malformed bundle: the protected header's kid is not a string")
    return kid


def _thumbprint(x: str) -> str:
    """The RFC 7638 thumbprint of an Ed25519 public key whose JWK ``x`` is ``x``: toolgate's kid."""
    canonical = json.dumps({"crv": "Ed25519", "kty": "OKP", "x": x}, separators=(",", ":"))
    return _b64url_encode(hashlib.sha256(canonical.encode("utf-8")).digest())


def _key(jwks: dict[str, Any], kid: str) -> bytes:
    """The raw public key that the JWK Set holds under ``kid``, checked to be an Ed25519 key whose
    thumbprint is ``kid``."""
    keys = jwks.get("keys")
    if not isinstance(keys, list):
        raise InvalidEvidence("malformed JWKS: no keys list")
    # The first key under the kid: a key listed twice (signing key and previous key) is one key.
    jwk = next((k for k in keys if isinstance(k, dict) and k.get("kid") == kid), None)
    if jwk is None:
        raise InvalidEvidence(f"unknown kid {kid}: the JWKS has no such key")
    if jwk.get("kty") != "OKP" or jwk.get("crv") != "Ed25519":
        raise InvalidEvidence(f"key {kid} is not an Ed25519 key (kty OKP, crv Ed25519)")
    if jwk.get("alg", ALG) != ALG or jwk.get("use", "sig") != "sig":
        raise InvalidEvidence(f"key {kid} is not for {ALG} signatures")
    x = jwk.get("x")
    if not isinstance(x, str) or not _B64URL.fullmatch(x) or len(x) != 43:
        raise InvalidEvidence(f"key {kid}: x is not a 32-byte key in base64url without padding")
    raw = base64.urlsafe_b64decode(x + "=")
    if _b64url_encode(raw) != x:
        raise InvalidEvidence(f"key {kid}: x is not a 32-byte key in base64url without padding")
    if _thumbprint(x) != kid:
        raise InvalidEvidence(f"key {kid}: the kid is not the key's RFC 7638 thumbprint")
    return raw


def _get(obj: dict[str, Any], key: str, kind: type, what: str) -> Any:
    if key not in obj:
        raise InvalidEvidence(f"malformed statement: {what} has no {key}")
    value = obj[key]
    # bool is an int in Python; a count must not be True.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise InvalidEvidence(f"malformed statement: {what}'s {key} is not {_KINDS[kind]}")
    return value


def _time(obj: dict[str, Any], key: str, what: str) -> datetime:
    parsed = parse_time(_get(obj, key, str, what))
    if parsed is None:
        raise InvalidEvidence(f"malformed statement: {what}'s {key} is not an RFC 3339 time")
    return parsed


def _digest(obj: dict[str, Any], key: str, what: str) -> str | None:
    if key not in obj:
        raise InvalidEvidence(f"malformed statement: {what} has no {key}")
    value = obj[key]
    if value is None:
        return None
    if not isinstance(value, str) or not _SHA256_HEX.fullmatch(value):
        raise InvalidEvidence(f"malformed statement: {what}'s {key} is not a lowercase hex SHA-256")
    return value


def _count(obj: dict[str, Any], key: str) -> int:
    value: int = _get(obj, key, int, "the statement")
    if value < 0:
        raise InvalidEvidence(f"malformed statement: {key} is negative")
    return value


def _statement(payload: dict[str, Any], kid: str) -> Statement:
    typ = payload.get("typ")
    if typ != STATEMENT_TYP:
        raise InvalidEvidence(f"wrong typ {typ!r} in the statement: expected {STATEMENT_TYP}")
    what = "the statement"
    facts = []
    for seq, item in enumerate(_get(payload, "facts", list, what), start=1):
        fact_what = f"fact {seq}"
        if not isinstance(item, dict):
            raise InvalidEvidence(f"malformed statement: {fact_what} is not an object")
        if _get(item, "seq", int, fact_what) != seq:
            raise InvalidEvidence(f"malformed statement: {fact_what}'s seq is not {seq}")
        if "result" not in item:
            raise InvalidEvidence(f"malformed statement: {fact_what} has no result")
        facts.append(
            StatementFact(
                seq=seq,
                tool_call_id=_get(item, "tool_call_id", str, fact_what),
                tool=_get(item, "tool", str, fact_what),
                evidence_status=_get(item, "evidence_status", str, fact_what),
                result=item["result"],
                request_sha256=_digest(item, "request_sha256", fact_what),
                raw_sha256=_digest(item, "raw_sha256", fact_what),
                result_sha256=_digest(item, "result_sha256", fact_what),
                created_at=_time(item, "created_at", fact_what),
                updated_at=_time(item, "updated_at", fact_what),
            )
        )
    return Statement(
        typ=STATEMENT_TYP,
        iss=_get(payload, "iss", str, what),
        run_id=_get(payload, "run_id", str, what),
        state=_get(payload, "state", str, what),
        issued_at=_time(payload, "issued_at", what),
        facts=tuple(facts),
        excluded=_count(payload, "excluded"),
        tampered=_count(payload, "tampered"),
        kid=kid,
    )


def _check_record(run_id: str, fact: StatementFact, body: bytes) -> None:
    """A record body against its fact: the same run and call, and the same digests."""
    where = f"fact {fact.seq} ({fact.tool_call_id})"
    if not isinstance(body, (bytes, bytearray, memoryview)):
        raise TypeError(f"the record of {fact.tool_call_id} must be bytes, not {type(body).__name__}")
    try:
        members = _top_level_texts(bytes(body).decode("utf-8"))
    except ValueError:
        raise InvalidEvidence(f"{where}: its record is not a JSON object") from None
    for key, expected in (("run_id", run_id), ("tool_call_id", fact.tool_call_id), ("tool", fact.tool)):
        if key not in members or json.loads(members[key]) != expected:
            raise InvalidEvidence(f"{where}: its record's {key} is not {expected!r}")
    for part, digest_key in _DIGESTS:
        if part not in members:
            raise InvalidEvidence(f"{where}: its record has no {part}")
        text = members[part]
        actual = None if text == "null" else hashlib.sha256(text.encode("utf-8")).hexdigest()
        if actual != getattr(fact, digest_key):
            raise InvalidEvidence(f"{where}: the record's {part} does not match {digest_key}")


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i] in _JSON_SPACE:
        i += 1
    return i


def _top_level_texts(text: str) -> dict[str, str]:
    """The exact text of every member's value of a JSON object, as it stands in ``text``.

    Each value is scanned with the standard decoder and its span kept, never re-serialized: the
    digests cover toolgate's own spelling of numbers and strings. ValueError if ``text`` is not
    one JSON object with distinct member names.
    """
    decoder = json.JSONDecoder()
    texts: dict[str, str] = {}
    i = _skip_space(text, 0)
    if text[i : i + 1] != "{":
        raise ValueError("not an object")
    i = _skip_space(text, i + 1)
    if text[i : i + 1] == "}":
        i += 1
    else:
        while True:
            if text[i : i + 1] != '"':
                raise ValueError("a member name is not a string")
            name, i = decoder.raw_decode(text, i)
            i = _skip_space(text, i)
            if text[i : i + 1] != ":":
                raise ValueError("no colon after a member name")
            start = _skip_space(text, i + 1)
            _, end = decoder.raw_decode(text, start)
            if name in texts:
                raise ValueError("a duplicate member")
            texts[name] = text[start:end]
            i = _skip_space(text, end)
            if text[i : i + 1] == ",":
                i = _skip_space(text, i + 1)
            elif text[i : i + 1] == "}":
                i += 1
                break
            else:
                raise ValueError("no comma or closing brace after a member")
    if _skip_space(text, i) != len(text):
        raise ValueError("text after the object")
    return texts
