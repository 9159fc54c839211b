// Signed evidence: `verifyEvidence` on the real sidecar's bundles and records, against every kind
// of tampering, and both ways with independent implementations: jose verifies toolgate's bundles
// on its own, and the `toolgate verify` binary checks bundles that jose signed.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { after, before, describe, it } from "node:test";
import { fileURLToPath } from "node:url";
import { inspect } from "node:util";

import * as jose from "jose";

import {
  type Facts,
  Harness,
  InvalidEvidence,
  type Run,
  ToolgateError,
  verifyEvidence,
} from "../src/index.js";
import { newId, type Sidecar, startSidecar } from "./sidecar.js";

// The calls of the signed run: READY ones (one finding nothing), and one ERROR that is no fact.
// The echo input is sent as text, with numbers toolgate spells its own way (1.0 and -0.0 stay
// floats, where JavaScript writes 1 and 0; a big integer, exponents) and non-ASCII text: the
// digests cover toolgate's own spelling.
const ECHO_INPUT =
  '{"text":"naïve ✓","big":12345678901234567890123,"tiny":1e-300,"huge":1e300,"f":0.1,"one":1.0,"z":-0.0}';
const READY_IDS = ["call_search", "call_echo", "call_none"];
const ERROR_ID = "call_fail";

type Json = { [key: string]: unknown };
/** A bundle as a test changes it. */
type Bundle = { payload: string; signatures: Json[]; [key: string]: unknown };
type Jwk = { kty: string; crv: string; x: string; kid: string; alg: string; use: string };

/** A run of the sidecar with its bundle, key set and records, each exactly as served. */
interface Signed {
  runId: string;
  run: Run;
  bundle: string;
  jwks: string;
  records: Record<string, string>;
  facts: Facts;
}

let sidecar: Sidecar;
let harness: Harness;
let signed: Signed;

/** The body of a GET on the admin listener, exactly as served. */
async function served(path: string, token = true): Promise<string> {
  const headers: Record<string, string> = token
    ? { authorization: `Bearer ${sidecar.adminToken}` }
    : {};
  const response = await fetch(`${sidecar.adminUrl}${path}`, { headers });
  const body = await response.text();
  assert.equal(response.status, 200, `${path}: ${body}`);
  assert.ok(response.headers.get("content-type")?.startsWith("application/json"));
  return body;
}

function recordPath(runId: string, toolCallId: string): string {
  return `/v1/runs/${encodeURIComponent(runId)}/invocations/${encodeURIComponent(toolCallId)}`;
}

before(async () => {
  sidecar = await startSidecar();
  harness = new Harness(sidecar.adminUrl, {
    adminToken: sidecar.adminToken,
    agentUrl: sidecar.agentUrl,
  });
  // An active run with three READY calls and one ERROR, and its bundle.
  const runId = newId("run-ev");
  const run = await harness.createRun(runId, { tools: ["search", "echo", "fail"] });
  const agent = run.agent();
  await agent.invoke("search", { q: "redis" }, { toolCallId: "call_search" });
  await assert.rejects(agent.invoke("fail", {}, { toolCallId: ERROR_ID }), ToolgateError);
  const echo = await fetch(`${sidecar.agentUrl}/v1/invoke`, {
    method: "POST",
    headers: { authorization: `Bearer ${run.runToken}`, "content-type": "application/json" },
    body: `{"run_id":"${runId}","tool_call_id":"call_echo","tool":"echo","input":${ECHO_INPUT}}`,
  });
  assert.equal(echo.status, 200, await echo.text());
  await agent.invoke("search", { q: "nothing" }, { toolCallId: "call_none" });
  const facts = await run.facts();
  const records: Record<string, string> = {};
  for (const id of [...READY_IDS, ERROR_ID]) {
    records[id] = await served(recordPath(runId, id));
  }
  signed = {
    runId,
    run,
    bundle: await served(`/v1/runs/${runId}/evidence`),
    jwks: await served("/.well-known/jwks.json", false),
    records,
    facts,
  };
});

after(async () => {
  await sidecar?.stop();
});

/** The signed run's bundle, as an object of its own for a test to change. */
function bundle(): Bundle {
  return JSON.parse(signed.bundle) as Bundle;
}

function jwks(): { keys: Jwk[] } {
  return JSON.parse(signed.jwks) as { keys: Jwk[] };
}

/** The InvalidEvidence `promise` rejects with, its reason matching `reason`. */
async function invalid(promise: Promise<unknown>, reason: RegExp): Promise<InvalidEvidence> {
  let caught: unknown;
  await assert.rejects(promise, (err: unknown) => {
    caught = err;
    return true;
  });
  assert.ok(caught instanceof InvalidEvidence, `not an InvalidEvidence: ${inspect(caught)}`);
  assert.ok(caught instanceof Error);
  assert.equal(caught.name, "InvalidEvidence");
  assert.equal(caught.message, caught.reason);
  assert.match(caught.reason, reason);
  return caught;
}

const b64url = (data: Uint8Array | string): string => Buffer.from(data).toString("base64url");
const unb64url = (text: string): Buffer => Buffer.from(text, "base64url");

function signatureOf(b: Bundle): Json {
  const signature = b.signatures[0];
  assert.ok(signature);
  return signature;
}

// --- Bundles of the sidecar ---------------------------------------------------------------------

describe("bundles of the sidecar", () => {
  it("a bundle verifies with its records, and its facts are the run's", async () => {
    const statement = await verifyEvidence(signed.bundle, signed.jwks, signed.records);
    assert.deepEqual(Object.keys(statement).sort(), [
      "excluded",
      "facts",
      "iss",
      "issuedAt",
      "kid",
      "runId",
      "state",
      "tampered",
      "typ",
    ]);
    assert.deepEqual(
      [statement.typ, statement.iss, statement.runId, statement.state],
      ["toolgate.evidence.v1", "toolgate", signed.runId, "ACTIVE"],
    );
    assert.equal(statement.kid, jwks().keys[0]?.kid); // the signing key comes first
    assert.deepEqual([statement.excluded, statement.tampered], [1, 0]);
    assert.deepEqual(
      [statement.excluded, statement.tampered],
      [signed.facts.excluded, signed.facts.tampered],
    );

    // The facts of the statement are the run's facts: the same ids, order, tools and results.
    assert.deepEqual(
      statement.facts.map((f) => f.seq),
      [1, 2, 3],
    );
    assert.deepEqual(
      statement.facts.map((f) => ({
        toolCallId: f.toolCallId,
        tool: f.tool,
        evidenceStatus: f.evidenceStatus,
        result: f.result,
      })),
      signed.facts.facts,
    );
    assert.deepEqual(
      statement.facts.map((f) => f.toolCallId),
      READY_IDS,
    );
    assert.equal(statement.facts[2]?.evidenceStatus, "NO_EVIDENCE");
    assert.deepEqual(Object.keys(statement.facts[0] ?? {}).sort(), [
      "createdAt",
      "evidenceStatus",
      "rawSha256",
      "requestSha256",
      "result",
      "resultSha256",
      "seq",
      "tool",
      "toolCallId",
      "updatedAt",
    ]);

    // Each fact's digests are those of its record, as the harness reads it.
    assert.ok(statement.issuedAt instanceof Date);
    for (const fact of statement.facts) {
      const record = await signed.run.invocation(fact.toolCallId);
      assert.deepEqual(
        [record.request_sha256, record.raw_sha256, record.result_sha256],
        [fact.requestSha256, fact.rawSha256, fact.resultSha256],
      );
      assert.ok(fact.requestSha256 && fact.rawSha256 && fact.resultSha256);
      assert.ok(fact.createdAt instanceof Date && fact.updatedAt instanceof Date);
      assert.ok(fact.createdAt <= fact.updatedAt && fact.updatedAt <= statement.issuedAt);
      assert.equal(record.status, "READY");
      assert.equal(typeof record.seal, "string");
    }
    // The ERROR call is sealed too, and is no fact.
    assert.equal((await signed.run.invocation(ERROR_ID)).status, "ERROR");
  });

  it("a bundle verifies as an object, as text, as bytes and without records", async () => {
    const statement = await verifyEvidence(signed.bundle, signed.jwks);
    assert.deepEqual(await verifyEvidence(bundle(), jwks()), statement);
    const utf8 = new TextEncoder();
    assert.deepEqual(
      await verifyEvidence(utf8.encode(signed.bundle), utf8.encode(signed.jwks)),
      statement,
    );
    // A bundle asked for again is issued again: the same but for issuedAt.
    const again = await verifyEvidence(await signed.run.evidence(), jwks());
    assert.ok(again.issuedAt >= statement.issuedAt);
    assert.deepEqual({ ...again, issuedAt: null }, { ...statement, issuedAt: null });
    // Records as text, as bytes or in a Map; records of calls that are no facts are not needed.
    const ready = Object.fromEntries(READY_IDS.map((id) => [id, signed.records[id] ?? ""]));
    assert.deepEqual(await verifyEvidence(bundle(), jwks(), ready), statement);
    const bytes = Object.fromEntries(READY_IDS.map((id) => [id, utf8.encode(ready[id])]));
    assert.deepEqual(await verifyEvidence(bundle(), jwks(), bytes), statement);
    assert.deepEqual(
      await verifyEvidence(bundle(), jwks(), new Map(Object.entries(signed.records))),
      statement,
    );
    // The statement and its facts are frozen.
    assert.throws(() => {
      (statement as { runId: string }).runId = "other";
    }, TypeError);
    assert.throws(() => {
      (statement.facts as unknown[]).pop();
    }, TypeError);
    assert.throws(() => {
      (statement.facts[0] as { tool: string }).tool = "other";
    }, TypeError);
  });

  it("the bundle of an ended run and of an empty one", async () => {
    const runId = newId("run-ev");
    const run = await harness.createRun(runId, { tools: ["echo"] });
    const keys = await served("/.well-known/jwks.json", false);
    const empty = await verifyEvidence(await run.evidence(), keys, {});
    assert.deepEqual(
      [empty.runId, empty.state, empty.facts, empty.excluded],
      [runId, "ACTIVE", [], 0],
    );

    await run.agent().invoke("echo", { n: 1 }, { toolCallId: "c1" });
    const facts = await run.end();
    const records = { c1: await served(recordPath(runId, "c1")) };
    const statement = await verifyEvidence(await run.evidence(), keys, records);
    assert.equal(statement.state, "ENDED");
    assert.deepEqual(
      statement.facts.map((f) => [f.toolCallId, f.result]),
      [["c1", facts.facts[0]?.result]],
    );
    assert.ok(statement.issuedAt >= empty.issuedAt);
  });

  it("jose verifies a bundle of the sidecar on its own", async () => {
    const b = bundle();
    const { kid, x } = jwks().keys[0] as Jwk;
    // toolgate's header, byte for byte.
    assert.equal(
      unb64url(signatureOf(b).protected as string).toString(),
      `{"alg":"EdDSA","kid":"${kid}","typ":"toolgate-evidence+json"}`,
    );
    const jwk = { kty: "OKP", crv: "Ed25519", x };
    assert.equal(await jose.calculateJwkThumbprint(jwk), kid); // jose's own RFC 7638 thumbprint
    const key = await jose.importJWK(jwk, "EdDSA");
    const general = b as unknown as jose.GeneralJWSInput;
    const verified = await jose.generalVerify(general, key, { algorithms: ["EdDSA"] });
    assert.deepEqual(verified.protectedHeader, {
      alg: "EdDSA",
      kid,
      typ: "toolgate-evidence+json",
    });
    const payload = JSON.parse(new TextDecoder().decode(verified.payload)) as Json;
    assert.equal(payload.run_id, signed.runId);
    flipSignatureBit(b);
    await assert.rejects(
      jose.generalVerify(general, key, { algorithms: ["EdDSA"] }),
      jose.errors.JWSSignatureVerificationFailed,
    );
  });
});

// --- Tampering ----------------------------------------------------------------------------------

/** A change of the signed statement's text, the signature left as it was. */
function changeStatement(old: string, replacement: string): (b: Bundle) => void {
  return (b) => {
    const payload = unb64url(b.payload).toString();
    assert.ok(payload.includes(old), `${old} is not in ${payload}`);
    b.payload = b64url(payload.replace(old, replacement));
  };
}

/** A new protected header: the old one's members, changed (null: removed) or added. */
function changeHeader(members: Json): (b: Bundle) => void {
  return (b) => {
    const signature = signatureOf(b);
    const header = JSON.parse(unb64url(signature.protected as string).toString()) as Json;
    Object.assign(header, members);
    for (const [name, value] of Object.entries(header)) {
      if (value === null) {
        delete header[name];
      }
    }
    signature.protected = b64url(JSON.stringify(header));
  };
}

function reorderHeader(b: Bundle): void {
  const signature = signatureOf(b);
  const header = JSON.parse(unb64url(signature.protected as string).toString()) as Json;
  signature.protected = b64url(
    JSON.stringify({ typ: header.typ, kid: header.kid, alg: header.alg }),
  );
}

function changePayloadCharacter(b: Bundle): void {
  const middle = Math.floor(b.payload.length / 2);
  const replacement = b.payload[middle] === "A" ? "B" : "A";
  b.payload = b.payload.slice(0, middle) + replacement + b.payload.slice(middle + 1);
}

function flipSignatureBit(b: Bundle): void {
  const signature = signatureOf(b);
  const sig = unb64url(signature.signature as string);
  sig[0] = (sig[0] ?? 0) ^ 1;
  signature.signature = b64url(sig);
}

const TAMPERING: [string, (b: Bundle) => void, RegExp][] = [
  ["a byte of the statement", changeStatement('"excluded":1', '"excluded":0'), /^bad signature/],
  [
    "a fact's result",
    changeStatement('"Result 1 for redis"', '"Result 9 for redis"'),
    /^bad signature \(key /,
  ],
  ["a character of the payload", changePayloadCharacter, /^bad signature/],
  ["a bit of the signature", flipSignatureBit, /^bad signature/],
  [
    "a short signature",
    (b) => {
      const signature = signatureOf(b);
      signature.signature = b64url(unb64url(signature.signature as string).subarray(0, 63));
    },
    /^bad signature/,
  ],
  ["the header's member order", reorderHeader, /^bad signature/],
  ["an unknown kid", changeHeader({ kid: b64url("k".repeat(32)) }), /^unknown kid /],
  ["no kid", changeHeader({ kid: null }), /exactly alg, kid and typ/],
  [
    "the header's typ",
    changeHeader({ typ: "JWT" }),
    /^wrong typ "JWT" in the protected header: expected toolgate-evidence\+json$/,
  ],
  ["the header's alg", changeHeader({ alg: "none" }), /^wrong alg "none"/],
  ["an HMAC alg", changeHeader({ alg: "HS256" }), /^wrong alg "HS256"/],
  ["a member added to the header", changeHeader({ crit: ["exp"] }), /exactly alg, kid and typ/],
  ["a kid that is no string", changeHeader({ kid: 7 }), /kid is not a string/],
  [
    "padding on the payload",
    (b) => {
      b.payload += "=".repeat((4 - (b.payload.length % 4)) % 4 || 4);
    },
    /the payload is not base64url without padding/,
  ],
  [
    "padding on the signature",
    (b) => {
      // a 64-byte signature is 86 characters, 2 short of 4n
      signatureOf(b).signature += "==";
    },
    /the signature is not base64url without padding/,
  ],
  [
    "standard base64",
    (b) => {
      b.payload = `+${b.payload.slice(1)}`;
    },
    /the payload is not base64url without padding/,
  ],
  [
    "two signatures",
    (b) => {
      b.signatures.push({ ...signatureOf(b) });
    },
    /exactly one signature/,
  ],
  [
    "no signature",
    (b) => {
      b.signatures = [];
    },
    /exactly one signature/,
  ],
  [
    "an unprotected header",
    (b) => {
      signatureOf(b).header = { kid: "x" };
    },
    /exactly protected and signature/,
  ],
  [
    "a member added to the bundle",
    (b) => {
      b.protected = signatureOf(b).protected;
    },
    /exactly payload and signatures/,
  ],
];

describe("a tampered bundle is invalid", () => {
  for (const [name, tamper, reason] of TAMPERING) {
    it(name, async () => {
      const b = bundle();
      tamper(b);
      await invalid(verifyEvidence(b, jwks()), reason);
      // The same as text.
      await invalid(verifyEvidence(JSON.stringify(b), signed.jwks), reason);
    });
  }

  it("a bundle that is no JSON object is invalid", async () => {
    const texts: (string | Uint8Array)[] = [
      "",
      "not json",
      "[]",
      '{"payload":"", "payload":""}',
      '{"payload":"x"} trailing',
      new Uint8Array([0xff, 0x7b, 0x7d]),
      new Uint8Array([0xef, 0xbb, 0xbf, 0x7b, 0x7d]), // a byte order mark
    ];
    for (const text of texts) {
      await invalid(verifyEvidence(text, jwks()), /^malformed bundle: not a JSON object$/);
    }
    // A statement with a member twice, under a valid signature, is malformed.
    const { privateKey, jwk } = await newKey();
    const twice = (await sign(aStatement("run-jose", 1), privateKey, jwk.kid)) as Bundle;
    const payload = unb64url(twice.payload).toString().replace('"iss":', '"iss":"x","iss":');
    const resigned = await new jose.GeneralSign(new TextEncoder().encode(payload))
      .addSignature(privateKey)
      .setProtectedHeader({ alg: "EdDSA", kid: jwk.kid, typ: "toolgate-evidence+json" })
      .sign();
    await invalid(
      verifyEvidence(resigned, { keys: [jwk] }),
      /^malformed statement: not a JSON object$/,
    );
  });

  it("a bundle, key set or records of the wrong type is a TypeError", async () => {
    await assert.rejects(verifyEvidence(42 as unknown as string, jwks()), TypeError);
    await assert.rejects(verifyEvidence(bundle(), [] as unknown as object), TypeError);
    await assert.rejects(
      verifyEvidence(bundle(), jwks(), { ...signed.records, call_echo: 7 as unknown as string }),
      TypeError,
    );
  });
});

describe("a wrong key set is invalid", () => {
  it("for every kind of wrong key", async () => {
    const signing = jwks().keys[0] as Jwk;
    const kid = signing.kid;
    const other = (await newKey()).jwk;
    const cases: [unknown, RegExp][] = [
      [{ keys: [other] }, new RegExp(`^unknown kid ${kid}: the JWKS has no such key$`)],
      [{ keys: [] }, new RegExp(`^unknown kid ${kid}`)],
      [{ keys: "none" }, /^malformed JWKS: no keys list$/],
      [{}, /^malformed JWKS: no keys list$/],
      ["{", /^malformed JWKS: not a JSON object$/],
      // The kid kept, the key another: its thumbprint is not the kid.
      [{ keys: [{ ...other, kid }] }, /the kid is not the key's RFC 7638 thumbprint$/],
      [{ keys: [{ ...signing, crv: "Ed448" }] }, /is not an Ed25519 key/],
      [{ keys: [{ ...signing, kty: "EC" }] }, /is not an Ed25519 key/],
      [{ keys: [{ ...signing, use: "enc" }] }, /is not for EdDSA signatures$/],
      [{ keys: [{ ...signing, alg: "Ed25519" }] }, /is not for EdDSA signatures$/],
      [{ keys: [{ ...signing, x: `${signing.x}=` }] }, /x is not a 32-byte key/],
      [{ keys: [{ ...signing, x: signing.x.slice(1) }] }, /x is not a 32-byte key/],
      // The first key under the kid is the one.
      [{ keys: [{ ...other, kid }, signing] }, /not the key's RFC 7638 thumbprint/],
    ];
    for (const [keySet, reason] of cases) {
      await invalid(verifyEvidence(bundle(), keySet as object), reason);
    }
    // The right key among others, in any place, verifies.
    assert.equal((await verifyEvidence(bundle(), { keys: [other, signing] })).kid, kid);
    assert.equal((await verifyEvidence(bundle(), { keys: [signing, signing] })).kid, kid);
  });
});

describe("a tampered record is invalid", () => {
  const recordsWith = (
    id: string,
    body: string | Uint8Array,
  ): Record<string, string | Uint8Array> => ({
    ...signed.records,
    [id]: body,
  });

  it("a changed raw response, request or spelling", async () => {
    const search = signed.records.call_search ?? "";
    const at = search.indexOf('"raw_response":');
    const changedRaw =
      search.slice(0, at) + search.slice(at).replace("Result 1 for redis", "Result 9 for redis");
    assert.notEqual(changedRaw, search);
    const err = await invalid(
      verifyEvidence(signed.bundle, signed.jwks, recordsWith("call_search", changedRaw)),
      /^fact 1 \(call_search\): the record's raw_response does not match raw_sha256$/,
    );
    assert.ok(err.reason.includes("raw_sha256"));
    // As bytes, the same.
    await invalid(
      verifyEvidence(
        signed.bundle,
        signed.jwks,
        recordsWith("call_search", new TextEncoder().encode(changedRaw)),
      ),
      /the record's raw_response does not match raw_sha256/,
    );

    const atRequest = search.indexOf('"request":');
    const changedRequest =
      search.slice(0, atRequest) + search.slice(atRequest).replace('"redis"', '"Redis"');
    await invalid(
      verifyEvidence(signed.bundle, signed.jwks, recordsWith("call_search", changedRequest)),
      /the record's request does not match request_sha256$/,
    );

    // The same values, spelled by JavaScript: the digests cover toolgate's exact texts.
    const echo = signed.records.call_echo ?? "";
    assert.ok(echo.includes('"one":1.0,"z":-0.0'), echo);
    const respelled = JSON.stringify(JSON.parse(echo));
    assert.notEqual(respelled, echo);
    await invalid(
      verifyEvidence(signed.bundle, signed.jwks, recordsWith("call_echo", respelled)),
      /^fact 2 \(call_echo\): the record's request does not match request_sha256$/,
    );
    // The same text with spaces around its members still has the same value texts.
    const spaced = ` \n${echo.replace(/^\{/, "{ ").replace(/\}$/, " }")}\n`;
    await verifyEvidence(signed.bundle, signed.jwks, recordsWith("call_echo", spaced));
  });

  it("another call's record, another run's, a missing one, one that is not JSON", async () => {
    const search = signed.records.call_search ?? "";
    await invalid(
      verifyEvidence(signed.bundle, signed.jwks, recordsWith("call_echo", search)),
      /^fact 2 \(call_echo\): its record's tool_call_id is not "call_echo"$/,
    );
    const otherRun = search.replace(signed.runId, "run-other");
    await invalid(
      verifyEvidence(signed.bundle, signed.jwks, recordsWith("call_search", otherRun)),
      /its record's run_id is not /,
    );
    const otherTool = search.replace('"tool":"search"', '"tool":"echo"');
    assert.notEqual(otherTool, search);
    await invalid(
      verifyEvidence(signed.bundle, signed.jwks, recordsWith("call_search", otherTool)),
      /its record's tool is not "search"$/,
    );
    const { call_none: _, ...missing } = signed.records;
    await invalid(
      verifyEvidence(signed.bundle, signed.jwks, missing),
      /^fact 3 \(call_none\): no record given$/,
    );
    // An inherited member is no record.
    await invalid(
      verifyEvidence(signed.bundle, signed.jwks, Object.create(missing) as Record<string, string>),
      /^fact 1 \(call_search\): no record given$/,
    );
    for (const broken of [
      search.slice(0, -1),
      `${search}x`,
      `[${search}]`,
      search.replace('{"', '{"run_id":"x","'),
      new Uint8Array([0xff]),
    ]) {
      await invalid(
        verifyEvidence(signed.bundle, signed.jwks, recordsWith("call_search", broken)),
        /^fact 1 \(call_search\): its record is not a JSON object$/,
      );
    }
    const noRaw = search.replace('"raw_response":', '"raw_responses":');
    await invalid(
      verifyEvidence(signed.bundle, signed.jwks, recordsWith("call_search", noRaw)),
      /its record has no raw_response$/,
    );
  });
});

// --- Bundles signed by jose ---------------------------------------------------------------------

interface NewKey {
  privateKey: jose.CryptoKey;
  jwk: Jwk;
}

/** A fresh Ed25519 key and the public JWK toolgate publishes for it, kid its thumbprint. */
async function newKey(): Promise<NewKey> {
  const { privateKey, publicKey } = await jose.generateKeyPair("EdDSA");
  const { x } = await jose.exportJWK(publicKey);
  assert.ok(x);
  const kid = await jose.calculateJwkThumbprint({ kty: "OKP", crv: "Ed25519", x });
  return { privateKey, jwk: { kty: "OKP", crv: "Ed25519", x, kid, alg: "EdDSA", use: "sig" } };
}

function sha256Hex(text: string): Promise<string> {
  return crypto.subtle
    .digest("SHA-256", new TextEncoder().encode(text))
    .then((hash) => Buffer.from(hash).toString("hex"));
}

/** A statement of toolgate's shape with n facts. */
function aStatement(runId: string, n: number): Json & { facts: Json[] } {
  const facts = Array.from({ length: n }, (_, index) => {
    const i = index + 1;
    return {
      seq: i,
      tool_call_id: `call_${i}`,
      tool: "search",
      evidence_status: "EVIDENCE_FOUND",
      result: { items: [{ title: `result ${i}` }], total_items: 1 },
      request_sha256: "",
      raw_sha256: "",
      result_sha256: null,
      created_at: `2026-03-04T05:06:0${i}.123Z`,
      updated_at: `2026-03-04T05:06:0${i}.456Z`,
    };
  });
  return {
    typ: "toolgate.evidence.v1",
    iss: "toolgate",
    run_id: runId,
    state: "ENDED",
    issued_at: "2026-03-04T05:07:00.000Z",
    facts,
    excluded: 1,
    tampered: 0,
  };
}

/** `aStatement` with its digests filled in. */
async function aDigestedStatement(runId: string, n: number): Promise<Json & { facts: Json[] }> {
  const statement = aStatement(runId, n);
  for (const [index, fact] of statement.facts.entries()) {
    fact.request_sha256 = await sha256Hex(`{"q":"q${index + 1}"}`);
    fact.raw_sha256 = await sha256Hex(`{"results":[${index + 1}]}`);
  }
  return statement;
}

/** A bundle signed by jose's GeneralSign: toolgate's protected header, one signature. */
async function sign(statement: Json, privateKey: jose.CryptoKey, kid: string): Promise<object> {
  return new jose.GeneralSign(new TextEncoder().encode(JSON.stringify(statement)))
    .addSignature(privateKey)
    .setProtectedHeader({ alg: "EdDSA", kid, typ: "toolgate-evidence+json" })
    .sign();
}

describe("bundles signed by jose", () => {
  it("verifyEvidence accepts a bundle signed by jose", async () => {
    const { privateKey, jwk } = await newKey();
    const statement = await aDigestedStatement("run-jose", 2);
    const result = await verifyEvidence(await sign(statement, privateKey, jwk.kid), {
      keys: [jwk],
    });
    assert.deepEqual(
      [result.runId, result.state, result.kid, result.excluded],
      ["run-jose", "ENDED", jwk.kid, 1],
    );
    assert.deepEqual(
      result.facts.map((f) => f.toolCallId),
      ["call_1", "call_2"],
    );
    assert.equal(result.facts[0]?.resultSha256, null);
    assert.deepEqual(result.facts[0]?.createdAt, new Date("2026-03-04T05:06:01.123Z"));
    assert.deepEqual(result.issuedAt, new Date("2026-03-04T05:07:00.000Z"));

    // Signed by one key under another's kid: the signature does not verify.
    const impostor = await newKey();
    await invalid(
      verifyEvidence(await sign(statement, impostor.privateKey, jwk.kid), { keys: [jwk] }),
      new RegExp(`^bad signature \\(key ${jwk.kid}\\)$`),
    );
  });

  const faults: [string, (s: Json & { facts: Json[] }) => void, RegExp][] = [
    [
      "a wrong typ",
      (s) => {
        s.typ = "toolgate.evidence.v2";
      },
      /^wrong typ "toolgate.evidence.v2" in the statement: expected toolgate.evidence.v1$/,
    ],
    [
      "no typ",
      (s) => {
        delete s.typ;
      },
      /^wrong typ null in the statement/,
    ],
    [
      "a seq out of order",
      (s) => {
        (s.facts[1] as Json).seq = 3;
      },
      /fact 2's seq is not 2$/,
    ],
    [
      "a digest in capitals",
      (s) => {
        (s.facts[0] as Json).raw_sha256 = "AB".repeat(32);
      },
      /fact 1's raw_sha256 is not a lowercase hex SHA-256$/,
    ],
    [
      "no result",
      (s) => {
        delete (s.facts[0] as Json).result;
      },
      /fact 1 has no result$/,
    ],
    [
      "no digest",
      (s) => {
        delete (s.facts[0] as Json).request_sha256;
      },
      /fact 1 has no request_sha256$/,
    ],
    [
      "a fact that is no object",
      (s) => {
        s.facts[1] = ["call_2"] as unknown as Json;
      },
      /fact 2 is not an object$/,
    ],
    [
      "a tool that is no string",
      (s) => {
        (s.facts[0] as Json).tool = 1;
      },
      /fact 1's tool is not a string$/,
    ],
    [
      "a bad time",
      (s) => {
        s.issued_at = "yesterday";
      },
      /the statement's issued_at is not an RFC 3339 time$/,
    ],
    [
      "an impossible date",
      (s) => {
        (s.facts[0] as Json).created_at = "2026-02-30T00:00:00Z";
      },
      /fact 1's created_at is not an RFC 3339 time$/,
    ],
    [
      "a count that is a bool",
      (s) => {
        s.excluded = true;
      },
      /the statement's excluded is not an integer$/,
    ],
    [
      "a count that is a fraction",
      (s) => {
        s.excluded = 1.5;
      },
      /the statement's excluded is not an integer$/,
    ],
    [
      "a negative count",
      (s) => {
        s.tampered = -1;
      },
      /^malformed statement: tampered is negative$/,
    ],
    [
      "facts that are no list",
      (s) => {
        s.facts = {} as unknown as Json[];
      },
      /the statement's facts is not a list$/,
    ],
    [
      "no run id",
      (s) => {
        delete s.run_id;
      },
      /^malformed statement: the statement has no run_id$/,
    ],
  ];

  for (const [name, fault, reason] of faults) {
    it(`a signed statement of the wrong shape is invalid: ${name}`, async () => {
      const { privateKey, jwk } = await newKey();
      const statement = await aDigestedStatement("run-jose", 2);
      fault(statement);
      await invalid(
        verifyEvidence(await sign(statement, privateKey, jwk.kid), { keys: [jwk] }),
        reason,
      );
    });
  }
});

// --- The toolgate binary ------------------------------------------------------------------------

function toolgateBin(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, "Cargo.toml"))) {
    const up = dirname(dir);
    assert.notEqual(up, dir, "no Cargo.toml above the test directory");
    dir = up;
  }
  const path = process.env.TOOLGATE_BIN || join(dir, "target/debug/toolgate");
  assert.ok(existsSync(path), `${path} is missing: run \`cargo build --bin toolgate\``);
  return path;
}

/** `toolgate verify` on files: its exit code and its output (stdout and stderr). */
async function toolgateVerify(
  dir: string,
  bundleText: string,
  jwksText: string,
  records?: string,
): Promise<{ code: number | null; out: string }> {
  writeFileSync(join(dir, "bundle.json"), bundleText);
  writeFileSync(join(dir, "jwks.json"), jwksText);
  const args = ["verify", "--bundle", join(dir, "bundle.json"), "--jwks", join(dir, "jwks.json")];
  if (records !== undefined) {
    args.push("--records", records);
  }
  const proc = spawn(toolgateBin(), args, { stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  proc.stdout.setEncoding("utf8").on("data", (chunk: string) => {
    out += chunk;
  });
  proc.stderr.setEncoding("utf8").on("data", (chunk: string) => {
    out += chunk;
  });
  const code = await new Promise<number | null>((resolve, reject) => {
    proc.once("error", reject);
    proc.once("close", resolve);
  });
  return { code, out };
}

describe("the toolgate binary", () => {
  let dir: string;
  before(() => {
    dir = mkdtempSync(join(tmpdir(), "toolgate-evidence-ts-"));
  });
  after(() => {
    rmSync(dir, { recursive: true, force: true });
  });

  it("accepts a bundle signed by jose and refuses it tampered", async () => {
    const { privateKey, jwk } = await newKey();
    const keySet = JSON.stringify({ keys: [jwk] });
    const b = (await sign(await aDigestedStatement("run-jose", 3), privateKey, jwk.kid)) as Bundle;

    let { code, out } = await toolgateVerify(dir, JSON.stringify(b), keySet);
    assert.deepEqual([code, out.trim()], [0, `valid: run run-jose, 3 facts, key ${jwk.kid}`]);
    // verifyEvidence agrees.
    assert.equal((await verifyEvidence(b, keySet)).facts.length, 3);

    changeStatement('"excluded":1', '"excluded":0')(b);
    ({ code, out } = await toolgateVerify(dir, JSON.stringify(b), keySet));
    assert.equal(code, 1, out);
    assert.equal(out.trim().split("\n").length, 1, out);
    assert.match(out, /bad signature/);
  });

  it("checks a bundle of the sidecar against its records, as verifyEvidence does", async () => {
    const records = join(dir, "records");
    mkdirSync(records);
    for (const [id, body] of Object.entries(signed.records)) {
      writeFileSync(join(records, `${id}.json`), body);
    }
    const kid = jwks().keys[0]?.kid;
    let { code, out } = await toolgateVerify(dir, signed.bundle, signed.jwks, records);
    assert.deepEqual([code, out.trim()], [0, `valid: run ${signed.runId}, 3 facts, key ${kid}`]);

    const search = signed.records.call_search ?? "";
    const at = search.indexOf('"raw_response":');
    const changed =
      search.slice(0, at) + search.slice(at).replace("Result 1 for redis", "Result 9 for redis");
    writeFileSync(join(records, "call_search.json"), changed);
    ({ code, out } = await toolgateVerify(dir, signed.bundle, signed.jwks, records));
    assert.equal(code, 1, out);
    assert.equal(out.trim().split("\n").length, 1, out);
    assert.match(out, /call_search/);
    await invalid(
      verifyEvidence(signed.bundle, signed.jwks, { ...signed.records, call_search: changed }),
      /call_search/,
    );

    rmSync(join(records, "call_search.json"));
    ({ code } = await toolgateVerify(dir, signed.bundle, signed.jwks, records));
    assert.equal(code, 1);
  });
});

// --- jose, only when verifyEvidence runs --------------------------------------------------------

describe("without jose", () => {
  it("the core loads, and verifyEvidence rejects naming npm install jose", async () => {
    // The compiled core, alone in a directory with no node_modules above it.
    const dir = mkdtempSync(join(tmpdir(), "toolgate-no-jose-"));
    try {
      const built = dirname(fileURLToPath(new URL("../src/index.js", import.meta.url)));
      for (const file of ["index.js", "wire.js", "evidence.js"]) {
        copyFileSync(join(built, file), join(dir, file));
      }
      writeFileSync(join(dir, "package.json"), '{"type": "module"}\n');
      writeFileSync(
        join(dir, "check.js"),
        [
          'const { Harness, verifyEvidence, InvalidEvidence } = await import("./index.js");',
          "console.log(typeof Harness, typeof InvalidEvidence);",
          "try {",
          "  await verifyEvidence({}, {});",
          '  console.log("resolved");',
          "} catch (e) {",
          "  console.log(e instanceof InvalidEvidence ? 'InvalidEvidence' : e.name, e.message);",
          "}",
          "",
        ].join("\n"),
      );
      const proc = spawn(process.execPath, [join(dir, "check.js")], {
        cwd: dir,
        stdio: ["ignore", "pipe", "pipe"],
      });
      let out = "";
      proc.stdout.setEncoding("utf8").on("data", (chunk: string) => {
        out += chunk;
      });
      proc.stderr.setEncoding("utf8").on("data", (chunk: string) => {
        out += chunk;
      });
      const code = await new Promise<number | null>((resolve) => proc.once("close", resolve));
      assert.equal(code, 0, out);
      assert.deepEqual(out.trim().split("\n"), [
        "function function",
        "Error verifyEvidence needs jose: npm install jose",
      ]);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
