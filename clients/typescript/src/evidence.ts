// Offline verification of toolgate's signed evidence, with `jose` (an optional peer dependency,
// imported only when `verifyEvidence` runs, so the core keeps no dependency).
//
// A bundle (`run.evidence()`, `GET /v1/runs/{run_id}/evidence`) is a JWS in its General JSON
// Serialization, signed with Ed25519 (`alg` `EdDSA`), whose payload is the run's statement: its
// facts, each with the SHA-256 digests of the call's request, raw response and projected result as
// toolgate stored them. `verifyEvidence(bundle, jwks)` checks it against toolgate's public keys
// (`GET /.well-known/jwks.json`) with no network and returns the statement. Given the records (the
// bodies of `GET …/invocations/{tool_call_id}`, as served), it also checks that every fact's
// digests match the texts in its record, so the record in hand is the one toolgate signed for.
//
// jose checks the signature; this module checks what is particular to toolgate (the exact
// protected header, the key id as the key's RFC 7638 thumbprint, the statement's `typ` and shape,
// the digests), the same checks, in the same order and with the same reasons, as the Python
// client's `toolgate.evidence.verify`.

import { isObject, type JsonObject, parseTime } from "./wire.js";

/** The JWS algorithm of a bundle: Ed25519. */
export const EVIDENCE_ALG = "EdDSA";

/** The `typ` of a bundle's protected header. */
export const EVIDENCE_HEADER_TYP = "toolgate-evidence+json";

/** The `typ` of the statement a bundle signs. */
export const STATEMENT_TYP = "toolgate.evidence.v1";

/**
 * A bundle, key set or record that does not verify.
 *
 * `reason` names the first failure found (a malformed bundle, an unknown key id, a bad
 * signature, a wrong `typ`, a digest that does not match its record, …); `message` is the reason.
 */
export class InvalidEvidence extends Error {
  /** The first failure found; the same text as `message`. */
  readonly reason: string;

  constructor(reason: string) {
    super(reason);
    this.reason = reason;
  }
}

// Non-enumerable, like Error's own `name`.
Object.defineProperty(InvalidEvidence.prototype, "name", { value: "InvalidEvidence" });

/**
 * One fact of a verified statement: a READY call of the run, with the digests of its record.
 *
 * `seq` counts from 1 in the facts' order (completion order). A digest is the lowercase hex
 * SHA-256 of the part's compact JSON text as stored (`request`, `raw_response`, `agent_result`),
 * or null where the part is null.
 */
export interface StatementFact {
  readonly seq: number;
  readonly toolCallId: string;
  readonly tool: string;
  readonly evidenceStatus: string;
  /** The projected result, any JSON value. */
  readonly result: unknown;
  readonly requestSha256: string | null;
  readonly rawSha256: string | null;
  readonly resultSha256: string | null;
  readonly createdAt: Date;
  readonly updatedAt: Date;
}

/**
 * What a verified bundle says about a run, and the key that signed it.
 *
 * `state` is the run's state when the bundle was issued (an `ACTIVE` run's bundle is a
 * snapshot); `facts` are the run's facts at `issuedAt`, as `run.facts()` listed them; `excluded`
 * and `tampered` count as in `Facts`. `kid` is the id (RFC 7638 thumbprint) of the key that
 * signed it. Frozen, facts included (not their `result`s).
 */
export interface Statement {
  readonly typ: string;
  readonly iss: string;
  readonly runId: string;
  readonly state: string;
  readonly issuedAt: Date;
  readonly facts: readonly StatementFact[];
  readonly excluded: number;
  readonly tampered: number;
  readonly kid: string;
}

/** A record body: the text or the bytes `GET …/invocations/{tool_call_id}` answered. */
export type RecordBody = string | Uint8Array;

/** Record bodies by tool call id. */
export type EvidenceRecords =
  | Readonly<Record<string, RecordBody>>
  | ReadonlyMap<string, RecordBody>;

type Jose = typeof import("jose");

/**
 * Verifies an evidence bundle offline and resolves to its statement.
 *
 * `bundle` is the bundle as an object (`run.evidence()`) or its JSON text (a string or UTF-8
 * bytes); `jwks` is toolgate's JWK Set (`GET /.well-known/jwks.json`), likewise. Checks the
 * serialization (exactly one signature, base64url without padding), the protected header
 * (exactly `alg` `EdDSA`, `kid` and `typ` `toolgate-evidence+json`), that the key set holds an
 * Ed25519 key under that `kid` whose RFC 7638 thumbprint is the `kid`, the Ed25519 signature
 * (with jose), and the statement (`typ` `toolgate.evidence.v1` and the shape of every field).
 *
 * `records` maps tool call ids to record bodies, the text or bytes `GET …/invocations/{id}`
 * answered (`await response.text()`, or a file saved from it), never a re-serialization of the
 * parsed record: the digests cover the exact texts. Given it, every fact needs its record, whose
 * `run_id`, `tool_call_id` and `tool` must be the fact's and whose `request`, `raw_response` and
 * `agent_result` texts must match the fact's digests. Records of calls that are not facts are
 * ignored.
 *
 * Rejects with `InvalidEvidence` naming the first failure, with a `TypeError` for an argument
 * of the wrong type, and with an `Error` naming `npm install jose` when jose is not installed.
 */
export async function verifyEvidence(
  bundle: object | string,
  jwks: object | string,
  records?: EvidenceRecords,
): Promise<Statement> {
  const jose = await loadJose();
  const envelope = jsonObject(bundle, "bundle");
  if (!sameMembers(envelope, ["payload", "signatures"])) {
    throw new InvalidEvidence(
      "malformed bundle: its members must be exactly payload and signatures",
    );
  }
  const signatures = envelope.signatures;
  if (!Array.isArray(signatures) || signatures.length !== 1) {
    throw new InvalidEvidence("malformed bundle: it must have exactly one signature");
  }
  const signature: unknown = signatures[0];
  if (!isObject(signature) || !sameMembers(signature, ["protected", "signature"])) {
    throw new InvalidEvidence(
      "malformed bundle: its signature's members must be exactly protected and signature",
    );
  }
  const payloadB64 = envelope.payload;
  const protectedB64 = signature.protected;
  const signatureB64 = signature.signature;
  const payload = b64url(jose, payloadB64, "payload");
  const protectedBytes = b64url(jose, protectedB64, "protected header");
  b64url(jose, signatureB64, "signature");

  const kid = protectedHeader(protectedBytes);
  const jwk = await key(jose, jsonObject(jwks, "JWKS"), kid);
  let publicKey: Awaited<ReturnType<Jose["importJWK"]>>;
  try {
    publicKey = await jose.importJWK(jwk, EVIDENCE_ALG);
  } catch {
    throw new InvalidEvidence(`key ${kid} is not a valid Ed25519 public key`);
  }
  try {
    // The members were all checked above: exactly one signature, strings only.
    await jose.generalVerify(
      {
        payload: payloadB64 as string,
        signatures: [{ protected: protectedB64 as string, signature: signatureB64 as string }],
      },
      publicKey,
      { algorithms: [EVIDENCE_ALG] },
    );
  } catch {
    throw new InvalidEvidence(`bad signature (key ${kid})`);
  }

  const result = statement(jsonObject(payload, "statement"), kid);
  if (records !== undefined) {
    for (const fact of result.facts) {
      const body = recordOf(records, fact.toolCallId);
      if (body === undefined) {
        throw new InvalidEvidence(`fact ${fact.seq} (${fact.toolCallId}): no record given`);
      }
      await checkRecord(result.runId, fact, body);
    }
  }
  return result;
}

async function loadJose(): Promise<Jose> {
  try {
    return await import("jose");
  } catch (err) {
    if (isObject(err) && (err.code === "ERR_MODULE_NOT_FOUND" || err.code === "MODULE_NOT_FOUND")) {
      throw new Error("verifyEvidence needs jose: npm install jose", { cause: err });
    }
    throw err;
  }
}

function sameMembers(obj: JsonObject, names: readonly string[]): boolean {
  const keys = Object.keys(obj);
  return keys.length === names.length && names.every((name) => Object.hasOwn(obj, name));
}

/** A value as JSON text for a reason: the way toolgate's own `verify` spells it. */
function shown(value: unknown): string {
  try {
    return JSON.stringify(value ?? null) ?? String(value);
  } catch {
    return String(value);
  }
}

const utf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

/** `value` as a JSON object: an object as it is, JSON text parsed (no duplicate member). */
function jsonObject(value: unknown, what: string): JsonObject {
  let text: string;
  if (typeof value === "string") {
    text = value;
  } else if (value instanceof Uint8Array) {
    try {
      text = utf8.decode(value);
    } catch {
      throw new InvalidEvidence(`malformed ${what}: not a JSON object`);
    }
  } else if (isObject(value)) {
    return value;
  } else {
    throw new TypeError(`the ${what} must be an object, a string or a Uint8Array`);
  }
  if (!isJson(text)) {
    throw new InvalidEvidence(`malformed ${what}: not a JSON object`);
  }
  const parsed: unknown = JSON.parse(text);
  if (!isObject(parsed)) {
    throw new InvalidEvidence(`malformed ${what}: not a JSON object`);
  }
  return parsed;
}

const B64URL = /^[A-Za-z0-9_-]*$/;

/** base64url without padding, in its one canonical spelling. */
function b64url(jose: Jose, value: unknown, what: string): Uint8Array {
  const bad = (): InvalidEvidence =>
    new InvalidEvidence(`malformed bundle: the ${what} is not base64url without padding`);
  if (typeof value !== "string" || !B64URL.test(value) || value.length % 4 === 1) {
    throw bad();
  }
  let decoded: Uint8Array;
  try {
    decoded = jose.base64url.decode(value);
  } catch {
    throw bad();
  }
  if (jose.base64url.encode(decoded) !== value) {
    throw bad(); // unused bits set in the last character
  }
  return decoded;
}

/** The key id of a protected header that is exactly toolgate's. */
function protectedHeader(bytes: Uint8Array): string {
  const header = jsonObject(bytes, "protected header");
  if (!sameMembers(header, ["alg", "kid", "typ"])) {
    throw new InvalidEvidence(
      "malformed bundle: the protected header must be exactly alg, kid and typ",
    );
  }
  if (header.alg !== EVIDENCE_ALG) {
    throw new InvalidEvidence(
      `wrong alg ${shown(header.alg)}: a bundle is signed with ${EVIDENCE_ALG}`,
    );
  }
  if (header.typ !== EVIDENCE_HEADER_TYP) {
    throw new InvalidEvidence(
      `wrong typ ${shown(header.typ)} in the protected header: expected ${EVIDENCE_HEADER_TYP}`,
    );
  }
  const kid = header.kid;
  if (typeof kid !== "string" || kid === "") {
    throw new InvalidEvidence("malformed bundle: the protected header's kid is not a string");
  }
  return kid;
}

/**
 * The public JWK the key set holds under `kid`, checked to be an Ed25519 key whose RFC 7638
 * thumbprint is `kid`; only its `kty`, `crv` and `x` are kept.
 */
async function key(
  jose: Jose,
  jwks: JsonObject,
  kid: string,
): Promise<{ kty: "OKP"; crv: "Ed25519"; x: string }> {
  const keys = jwks.keys;
  if (!Array.isArray(keys)) {
    throw new InvalidEvidence("malformed JWKS: no keys list");
  }
  // The first key under the kid: a key listed twice (signing key and previous key) is one key.
  const jwk: unknown = keys.find((k: unknown) => isObject(k) && k.kid === kid);
  if (!isObject(jwk)) {
    throw new InvalidEvidence(`unknown kid ${kid}: the JWKS has no such key`);
  }
  if (jwk.kty !== "OKP" || jwk.crv !== "Ed25519") {
    throw new InvalidEvidence(`key ${kid} is not an Ed25519 key (kty OKP, crv Ed25519)`);
  }
  if ((jwk.alg ?? EVIDENCE_ALG) !== EVIDENCE_ALG || (jwk.use ?? "sig") !== "sig") {
    throw new InvalidEvidence(`key ${kid} is not for ${EVIDENCE_ALG} signatures`);
  }
  const x = jwk.x;
  if (
    typeof x !== "string" ||
    !B64URL.test(x) ||
    x.length !== 43 ||
    jose.base64url.encode(jose.base64url.decode(x)) !== x
  ) {
    throw new InvalidEvidence(`key ${kid}: x is not a 32-byte key in base64url without padding`);
  }
  const publicJwk = { kty: "OKP", crv: "Ed25519", x } as const;
  if ((await jose.calculateJwkThumbprint(publicJwk, "sha256")) !== kid) {
    throw new InvalidEvidence(`key ${kid}: the kid is not the key's RFC 7638 thumbprint`);
  }
  return publicJwk;
}

// --- The statement ------------------------------------------------------------------------------

const SHA256_HEX = /^[0-9a-f]{64}$/;

type Kind = "string" | "integer" | "list";
const KINDS: Record<Kind, string> = { string: "a string", integer: "an integer", list: "a list" };

function get(obj: JsonObject, name: string, kind: "string", what: string): string;
function get(obj: JsonObject, name: string, kind: "integer", what: string): number;
function get(obj: JsonObject, name: string, kind: "list", what: string): unknown[];
function get(obj: JsonObject, name: string, kind: Kind, what: string): unknown {
  if (!Object.hasOwn(obj, name)) {
    throw new InvalidEvidence(`malformed statement: ${what} has no ${name}`);
  }
  const value = obj[name];
  const ok =
    kind === "string"
      ? typeof value === "string"
      : kind === "integer"
        ? Number.isSafeInteger(value)
        : Array.isArray(value);
  if (!ok) {
    throw new InvalidEvidence(`malformed statement: ${what}'s ${name} is not ${KINDS[kind]}`);
  }
  return value;
}

function time(obj: JsonObject, name: string, what: string): Date {
  const parsed = parseTime(get(obj, name, "string", what));
  if (parsed === null) {
    throw new InvalidEvidence(`malformed statement: ${what}'s ${name} is not an RFC 3339 time`);
  }
  return parsed;
}

function digest(obj: JsonObject, name: string, what: string): string | null {
  if (!Object.hasOwn(obj, name)) {
    throw new InvalidEvidence(`malformed statement: ${what} has no ${name}`);
  }
  const value = obj[name];
  if (value === null) {
    return null;
  }
  if (typeof value !== "string" || !SHA256_HEX.test(value)) {
    throw new InvalidEvidence(
      `malformed statement: ${what}'s ${name} is not a lowercase hex SHA-256`,
    );
  }
  return value;
}

function count(obj: JsonObject, name: string): number {
  const value = get(obj, name, "integer", "the statement");
  if (value < 0) {
    throw new InvalidEvidence(`malformed statement: ${name} is negative`);
  }
  return value;
}

function statement(payload: JsonObject, kid: string): Statement {
  if (payload.typ !== STATEMENT_TYP) {
    throw new InvalidEvidence(
      `wrong typ ${shown(payload.typ)} in the statement: expected ${STATEMENT_TYP}`,
    );
  }
  const what = "the statement";
  const facts = get(payload, "facts", "list", what).map((item: unknown, index): StatementFact => {
    const seq = index + 1;
    const factWhat = `fact ${seq}`;
    if (!isObject(item)) {
      throw new InvalidEvidence(`malformed statement: ${factWhat} is not an object`);
    }
    if (get(item, "seq", "integer", factWhat) !== seq) {
      throw new InvalidEvidence(`malformed statement: ${factWhat}'s seq is not ${seq}`);
    }
    if (!Object.hasOwn(item, "result")) {
      throw new InvalidEvidence(`malformed statement: ${factWhat} has no result`);
    }
    return Object.freeze({
      seq,
      toolCallId: get(item, "tool_call_id", "string", factWhat),
      tool: get(item, "tool", "string", factWhat),
      evidenceStatus: get(item, "evidence_status", "string", factWhat),
      result: item.result,
      requestSha256: digest(item, "request_sha256", factWhat),
      rawSha256: digest(item, "raw_sha256", factWhat),
      resultSha256: digest(item, "result_sha256", factWhat),
      createdAt: time(item, "created_at", factWhat),
      updatedAt: time(item, "updated_at", factWhat),
    });
  });
  return Object.freeze({
    typ: STATEMENT_TYP,
    iss: get(payload, "iss", "string", what),
    runId: get(payload, "run_id", "string", what),
    state: get(payload, "state", "string", what),
    issuedAt: time(payload, "issued_at", what),
    facts: Object.freeze(facts),
    excluded: count(payload, "excluded"),
    tampered: count(payload, "tampered"),
    kid,
  });
}

// --- Records ------------------------------------------------------------------------------------

// The record parts a fact's digests cover, each with its digest's name in the statement.
const DIGESTS = [
  ["request", "request_sha256", "requestSha256"],
  ["raw_response", "raw_sha256", "rawSha256"],
  ["agent_result", "result_sha256", "resultSha256"],
] as const;

function recordOf(records: EvidenceRecords, toolCallId: string): unknown {
  if (records instanceof Map) {
    return records.get(toolCallId);
  }
  if (!isObject(records)) {
    throw new TypeError("records must be an object or a Map of record bodies by tool call id");
  }
  // Own members only: a tool call id such as "constructor" is no record.
  return Object.hasOwn(records, toolCallId) ? records[toolCallId] : undefined;
}

/** A record body against its fact: the same run and call, and the same digests. */
async function checkRecord(runId: string, fact: StatementFact, body: unknown): Promise<void> {
  const where = `fact ${fact.seq} (${fact.toolCallId})`;
  let text: string;
  if (typeof body === "string") {
    text = body;
  } else if (body instanceof Uint8Array) {
    try {
      text = utf8.decode(body);
    } catch {
      throw new InvalidEvidence(`${where}: its record is not a JSON object`);
    }
  } else {
    throw new TypeError(
      `the record of ${fact.toolCallId} must be a string or a Uint8Array, not ${typeof body}`,
    );
  }
  const members = topLevelTexts(text);
  if (members === null) {
    throw new InvalidEvidence(`${where}: its record is not a JSON object`);
  }
  const expected = [
    ["run_id", runId],
    ["tool_call_id", fact.toolCallId],
    ["tool", fact.tool],
  ] as const;
  for (const [name, value] of expected) {
    const member = members.get(name);
    if (member === undefined || JSON.parse(member) !== value) {
      throw new InvalidEvidence(`${where}: its record's ${name} is not ${shown(value)}`);
    }
  }
  for (const [part, digestName, field] of DIGESTS) {
    const member = members.get(part);
    if (member === undefined) {
      throw new InvalidEvidence(`${where}: its record has no ${part}`);
    }
    const actual = member === "null" ? null : await sha256Hex(member);
    if (actual !== fact[field]) {
      throw new InvalidEvidence(`${where}: the record's ${part} does not match ${digestName}`);
    }
  }
}

/** The lowercase hex SHA-256 of a text's UTF-8 bytes (WebCrypto). */
async function sha256Hex(text: string): Promise<string> {
  const hash = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(text));
  return Array.from(new Uint8Array(hash), (b) => b.toString(16).padStart(2, "0")).join("");
}

// --- A JSON scanner -----------------------------------------------------------------------------
//
// JSON.parse keeps the last of two members of one name and gives no positions. The scanner
// checks the grammar (RFC 8259), refuses duplicate member names, and gives the span of each
// member of a top-level object: the digests cover toolgate's own spelling of every value, which
// no re-serialization reproduces (big integers, exponents, escapes).

class NotJson extends Error {}

const NUMBER = /-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?/y;
const ESCAPES = new Set(['"', "\\", "/", "b", "f", "n", "r", "t"]);
const HEX4 = /^[0-9A-Fa-f]{4}$/;

function skipSpace(text: string, i: number): number {
  let at = i;
  for (;;) {
    const c = text.charCodeAt(at);
    if (c === 0x20 || c === 0x09 || c === 0x0a || c === 0x0d) {
      at += 1;
    } else {
      return at;
    }
  }
}

/** The end of the string that starts at `i` (at its opening quote). */
function scanString(text: string, i: number): number {
  let at = i + 1;
  for (;;) {
    if (at >= text.length) {
      throw new NotJson();
    }
    const c = text.charCodeAt(at);
    if (c === 0x22) {
      return at + 1;
    }
    if (c < 0x20) {
      throw new NotJson();
    }
    if (c === 0x5c) {
      const escaped = text.charAt(at + 1);
      if (escaped === "u") {
        if (!HEX4.test(text.slice(at + 2, at + 6))) {
          throw new NotJson();
        }
        at += 6;
      } else if (ESCAPES.has(escaped)) {
        at += 2;
      } else {
        throw new NotJson();
      }
    } else {
      at += 1;
    }
  }
}

/**
 * The end of the JSON value that starts at `i`. `spans`, for a top-level object, receives each
 * member's value text by name.
 */
function scanValue(text: string, i: number, spans?: Map<string, string>): number {
  const c = text.charAt(i);
  if (c === "{") {
    const names = new Set<string>();
    let at = skipSpace(text, i + 1);
    if (text.charAt(at) === "}") {
      return at + 1;
    }
    for (;;) {
      if (text.charAt(at) !== '"') {
        throw new NotJson();
      }
      const nameEnd = scanString(text, at);
      const name = JSON.parse(text.slice(at, nameEnd)) as string;
      if (names.has(name)) {
        throw new NotJson();
      }
      names.add(name);
      at = skipSpace(text, nameEnd);
      if (text.charAt(at) !== ":") {
        throw new NotJson();
      }
      const start = skipSpace(text, at + 1);
      const end = scanValue(text, start);
      spans?.set(name, text.slice(start, end));
      at = skipSpace(text, end);
      if (text.charAt(at) === ",") {
        at = skipSpace(text, at + 1);
      } else if (text.charAt(at) === "}") {
        return at + 1;
      } else {
        throw new NotJson();
      }
    }
  }
  if (c === "[") {
    let at = skipSpace(text, i + 1);
    if (text.charAt(at) === "]") {
      return at + 1;
    }
    for (;;) {
      at = skipSpace(text, scanValue(text, at));
      if (text.charAt(at) === ",") {
        at = skipSpace(text, at + 1);
      } else if (text.charAt(at) === "]") {
        return at + 1;
      } else {
        throw new NotJson();
      }
    }
  }
  if (c === '"') {
    return scanString(text, i);
  }
  for (const literal of ["true", "false", "null"]) {
    if (text.startsWith(literal, i)) {
      return i + literal.length;
    }
  }
  NUMBER.lastIndex = i;
  if (NUMBER.test(text)) {
    return NUMBER.lastIndex;
  }
  throw new NotJson();
}

/** Whether `text` is one JSON value with no object holding two members of one name. */
function isJson(text: string): boolean {
  try {
    return skipSpace(text, scanValue(text, skipSpace(text, 0))) === text.length;
  } catch {
    // NotJson, or a RangeError from nesting deeper than the stack.
    return false;
  }
}

/**
 * The exact text of every member's value of the JSON object `text` is, as it stands in `text`;
 * null if `text` is not one JSON object with distinct member names.
 */
function topLevelTexts(text: string): Map<string, string> | null {
  const spans = new Map<string, string>();
  try {
    const start = skipSpace(text, 0);
    if (text.charAt(start) !== "{") {
      return null;
    }
    if (skipSpace(text, scanValue(text, start, spans)) !== text.length) {
      return null;
    }
  } catch {
    return null;
  }
  return spans;
}
