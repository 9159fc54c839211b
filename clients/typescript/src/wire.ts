// The wire protocol: the error type, the requests to send and the decoding of toolgate's
// answers into the client's types. Everything here but `send` is pure.

import type { CreateRunOptions } from "./index.js";

/** No answer came back: the connection failed, broke off or timed out (`httpStatus` is null). */
export const TRANSPORT_ERROR = "TRANSPORT_ERROR";

/** An answer came back that is not toolgate's: not JSON, or not the shape toolgate sends. */
export const UNEXPECTED_RESPONSE = "UNEXPECTED_RESPONSE";

/** Milliseconds a request may take, connecting included, before it fails with TRANSPORT_ERROR. */
export const DEFAULT_TIMEOUT_MS = 30_000;

/**
 * A call that did not succeed: every failure the client reports is one of these.
 *
 * `code` is the stable code toolgate answered (`DUPLICATE_TOOL_CALL`, `NOT_FOUND`,
 * `UNAUTHENTICATED`, …) or one of the client's own two:
 *
 * - `TRANSPORT_ERROR`: no answer came back (connection refused, broken off, timed out);
 *   `httpStatus` is null. A tool call that failed this way may still have run on the server: do
 *   not repeat it with the same `toolCallId` (it would be `DUPLICATE_TOOL_CALL`); read its record
 *   with `run.invocation()` instead.
 * - `UNEXPECTED_RESPONSE`: something answered with a body that is not toolgate's (a proxy's error
 *   page, a 2xx that is not the expected JSON); `httpStatus` is its status.
 *
 * `message` is toolgate's fixed sentence for the code (or the client's own for the two codes
 * above); it never carries tokens, payloads or response bodies. `toolCallId` is the id the error
 * answer carried (toolgate echoes a safe one and sends null otherwise); for the client's own codes
 * on a tool call it is the id the call was made with.
 *
 * `String(err)` (and `err.toString()`) is `"CODE: message"`, and `err.stack` starts
 * `"ToolgateError [CODE]: message"`, so whatever prints the error shows its code; `err.message`
 * is the sentence alone.
 */
export class ToolgateError extends Error {
  /** The stable error code. */
  readonly code: string;
  /** The HTTP status of the answer; null for TRANSPORT_ERROR. */
  readonly httpStatus: number | null;
  /** The tool call id the error is about, or null. */
  readonly toolCallId: string | null;

  constructor(
    code: string,
    message: string,
    options: { httpStatus?: number | null; toolCallId?: string | null } = {},
  ) {
    super(message);
    this.code = code;
    this.httpStatus = options.httpStatus ?? null;
    this.toolCallId = options.toolCallId ?? null;
    // The stack starts "ToolgateError: <message>"; give it the code the way Node's own errors
    // do ("TypeError [ERR_INVALID_ARG_TYPE]: …"), for loggers that print only the stack.
    const header = `${this.name}: ${message}`;
    if (this.stack?.startsWith(header)) {
      this.stack = `${this.name} [${code}]: ${message}${this.stack.slice(header.length)}`;
    }
  }

  override toString(): string {
    return `${this.code}: ${this.message}`;
  }
}

// Non-enumerable, like Error's own `name`, so it stays out of `{ ...err }` and JSON.
Object.defineProperty(ToolgateError.prototype, "name", { value: "ToolgateError" });

/** A JSON object, as decoded. */
export type JsonObject = { [key: string]: unknown };

/** One HTTP request: method, path below the listener's base URL, and JSON body (none if absent). */
export interface Call {
  method: "GET" | "POST";
  path: string;
  body?: JsonObject;
}

/** A decoded 2xx answer: its JSON body and HTTP status. */
export interface Answer {
  body: unknown;
  status: number;
}

/** A path segment, percent-encoded with nothing left safe (toolgate decodes it once). */
export function segment(value: string): string {
  return encodeURIComponent(value);
}

/** A listener's base URL without its trailing slashes, so paths can be appended. */
export function baseUrl(url: string): string {
  return url.replace(/\/+$/, "");
}

/** The run a run token is bound to: everything before its last `.`. */
export function runIdOf(runToken: string): string {
  const dot = runToken.lastIndexOf(".");
  if (dot <= 0 || dot === runToken.length - 1) {
    // Never echo the token: it is a credential.
    throw new TypeError("not a run token: a run token is '<run_id>.<mac>'");
  }
  return runToken.slice(0, dot);
}

/** A request timeout in milliseconds, checked before any request is made. */
export function timeoutOf(timeoutMs: number | undefined): number {
  const ms = timeoutMs ?? DEFAULT_TIMEOUT_MS;
  if (!Number.isFinite(ms) || ms <= 0) {
    throw new RangeError("timeoutMs must be a positive number of milliseconds");
  }
  return Math.ceil(ms);
}

/** The snake_case fields of `POST /v1/runs`; fields left undefined are omitted (server defaults). */
export function createRun(runId: string, options: CreateRunOptions): Call {
  const body: JsonObject = { run_id: runId };
  if (options.tools !== undefined) {
    body.tools = [...options.tools];
  }
  if (options.timeoutMs !== undefined) {
    body.timeout_ms = options.timeoutMs;
  }
  if (options.budget !== undefined) {
    const { maxCalls, maxCallsPerTool, maxRecordBytes } = options.budget;
    const budget: JsonObject = {};
    if (maxCalls !== undefined) {
      budget.max_calls = maxCalls;
    }
    if (maxCallsPerTool !== undefined) {
      budget.max_calls_per_tool = { ...maxCallsPerTool };
    }
    if (maxRecordBytes !== undefined) {
      budget.max_record_bytes = maxRecordBytes;
    }
    body.budget = budget;
  }
  if (options.workspace !== undefined) {
    body.workspace = options.workspace;
  }
  if (options.home !== undefined) {
    body.home = options.home;
  }
  return { method: "POST", path: "/v1/runs", body };
}

/** A request on one run: `/v1/runs/{run_id}` or `/v1/runs/{run_id}/{action}`. */
export function runCall(method: "GET" | "POST", runId: string, action?: string): Call {
  const path = `/v1/runs/${segment(runId)}`;
  return { method, path: action === undefined ? path : `${path}/${action}` };
}

/** `GET /v1/runs/{run_id}/invocations/{tool_call_id}`. */
export function invocation(runId: string, toolCallId: string): Call {
  return {
    method: "GET",
    path: `/v1/runs/${segment(runId)}/invocations/${segment(toolCallId)}`,
  };
}

/** `POST /v1/invoke`: the envelope form of a tool call. */
export function invoke(runId: string, tool: string, input: unknown, toolCallId: string): Call {
  return {
    method: "POST",
    path: "/v1/invoke",
    body: { run_id: runId, tool_call_id: toolCallId, tool, input },
  };
}

/** `GET /v1/tools`: the tools the token's run may call. */
export const TOOLS: Call = { method: "GET", path: "/v1/tools" };

/**
 * Sends one request with the platform `fetch`, never retried, and decodes the answer: the JSON
 * body of a 2xx, or a ToolgateError. `toolCallId` is the id of the tool call the request makes,
 * if any: it goes on the client's own errors.
 */
export async function send(
  base: string,
  call: Call,
  token: string,
  timeoutMs: number,
  toolCallId: string | null = null,
): Promise<Answer> {
  const headers: Record<string, string> = {
    authorization: `Bearer ${token}`,
    accept: "application/json",
  };
  const init: RequestInit = {
    method: call.method,
    headers,
    // A redirect is not toolgate's answer: it is decoded as UNEXPECTED_RESPONSE, never followed.
    redirect: "manual",
    signal: AbortSignal.timeout(timeoutMs),
  };
  if (call.body !== undefined) {
    headers["content-type"] = "application/json";
    init.body = JSON.stringify(call.body);
  }
  let status: number;
  let raw: string;
  try {
    const response = await fetch(base + call.path, init);
    status = response.status;
    raw = await response.text();
  } catch (err) {
    throw transportError(err, toolCallId);
  }
  return { body: decode(status, raw, toolCallId), status };
}

/**
 * The JSON body of a 2xx answer; any other answer thrown as a ToolgateError (toolgate's own
 * error, or UNEXPECTED_RESPONSE).
 */
export function decode(status: number, text: string, toolCallId: string | null = null): unknown {
  let body: unknown;
  let parsed = true;
  try {
    body = JSON.parse(text);
  } catch {
    parsed = false;
  }
  if (status >= 200 && status < 300) {
    if (!parsed) {
      throw unexpected("JSON", status, toolCallId);
    }
    return body;
  }
  if (isObject(body) && body.status === "ERROR" && isObject(body.error)) {
    const { code, message } = body.error;
    const echoed = body.tool_call_id ?? null;
    if (
      typeof code === "string" &&
      typeof message === "string" &&
      (echoed === null || typeof echoed === "string")
    ) {
      throw new ToolgateError(code, message, { httpStatus: status, toolCallId: echoed });
    }
  }
  throw unexpected("a toolgate error", status, toolCallId);
}

/**
 * A request that got no answer. The message names the kind of failure only (a system error code
 * such as `ECONNRESET`, or the error's name): the underlying error's text can carry URLs and host
 * names.
 */
export function transportError(err: unknown, toolCallId: string | null = null): ToolgateError {
  const code = systemCode(err);
  let message: string;
  if (err instanceof Error && err.name === "TimeoutError") {
    message = "toolgate did not answer in time.";
  } else if (code !== null && CONNECT_CODES.has(code)) {
    message = "Could not connect to toolgate.";
  } else {
    const kind = code ?? (err instanceof Error ? err.name : typeof err);
    message = `The request to toolgate failed (${kind}).`;
  }
  return new ToolgateError(TRANSPORT_ERROR, message, { httpStatus: null, toolCallId });
}

const CONNECT_CODES = new Set([
  "ECONNREFUSED",
  "ENOTFOUND",
  "EAI_AGAIN",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "UND_ERR_CONNECT_TIMEOUT",
]);

/** The system error code (`ECONNREFUSED`, …) on a fetch failure or its causes, if any. */
function systemCode(err: unknown): string | null {
  for (let e: unknown = err, depth = 0; isObject(e) && depth < 4; e = e.cause, depth++) {
    if (typeof e.code === "string" && /^[A-Z][A-Z0-9_]*$/.test(e.code)) {
      return e.code;
    }
  }
  return null;
}

/** The error for an answer that is not the shape toolgate sends. */
export function unexpected(
  what: string,
  httpStatus: number | null,
  toolCallId: string | null = null,
): ToolgateError {
  return new ToolgateError(UNEXPECTED_RESPONSE, `toolgate's answer is not ${what}.`, {
    httpStatus,
    toolCallId,
  });
}

/** Whether a decoded value is a JSON object (not null, not an array). */
export function isObject(value: unknown): value is JsonObject {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function object(value: unknown, what: string, status: number): JsonObject {
  if (!isObject(value)) {
    throw unexpected(what, status);
  }
  return value;
}

function text(obj: JsonObject, key: string, what: string, status: number): string {
  const value = obj[key];
  if (typeof value !== "string") {
    throw unexpected(what, status);
  }
  return value;
}

function count(obj: JsonObject, key: string, what: string, status: number): number {
  const value = obj[key];
  if (typeof value !== "number" || !Number.isInteger(value) || value < 0) {
    throw unexpected(what, status);
  }
  return value;
}

/** A tool call that succeeded: toolgate's `READY` answer. */
export interface ToolResult {
  status: "READY";
  toolCallId: string;
  /** `EVIDENCE_FOUND`, or `NO_EVIDENCE` (a negative observation, not an error). */
  evidenceStatus: string;
  /** The bounded projection of the tool's response (any JSON value), never the raw response. */
  result: unknown;
}

/** One READY call of a run, as the run's facts list it. */
export interface Fact {
  toolCallId: string;
  tool: string;
  evidenceStatus: string;
  result: unknown;
}

/**
 * A run's progress: its READY calls in completion order. `excluded` counts the run's finalized
 * calls that are not facts (errors, expired or foreign records, records failing their seal);
 * `tampered` is how many of those failed the seal (0 from a server that does not report it).
 */
export interface Facts {
  runId: string;
  facts: Fact[];
  excluded: number;
  tampered: number;
}

/** A tool the run may call, as `GET /v1/tools` lists it. */
export interface ToolSpec {
  name: string;
  description: string;
  /** The tool's JSON Schema for its input (`{"type": "object"}` when none is configured). */
  inputSchema: JsonObject;
}

/** The answer to creating a run. */
export interface CreatedRun {
  runId: string;
  runToken: string;
  deadline: Date;
}

/** A 2xx answer's body if it is a JSON object, else UNEXPECTED_RESPONSE. */
export function asObject<T extends JsonObject = JsonObject>(
  { body, status }: Answer,
  what: string,
): T {
  return object(body, what, status) as T;
}

/** A tool call's 2xx answer. */
export function parseToolResult({ body, status }: Answer, toolCallId: string): ToolResult {
  const what = "a tool result";
  if (
    !isObject(body) ||
    body.status !== "READY" ||
    !("result" in body) ||
    typeof body.tool_call_id !== "string" ||
    typeof body.evidence_status !== "string"
  ) {
    throw unexpected(what, status, toolCallId);
  }
  return {
    status: "READY",
    toolCallId: body.tool_call_id,
    evidenceStatus: body.evidence_status,
    result: body.result,
  };
}

/** The answer of `GET …/facts` and `POST …/end`. */
export function parseFacts({ body, status }: Answer): Facts {
  const what = "a run's facts";
  const obj = object(body, what, status);
  const items = obj.facts;
  if (!Array.isArray(items)) {
    throw unexpected(what, status);
  }
  const facts = items.map((item: unknown): Fact => {
    const fact = object(item, what, status);
    if (!("result" in fact)) {
      throw unexpected(what, status);
    }
    return {
      toolCallId: text(fact, "tool_call_id", what, status),
      tool: text(fact, "tool", what, status),
      evidenceStatus: text(fact, "evidence_status", what, status),
      result: fact.result,
    };
  });
  return {
    runId: text(obj, "run_id", what, status),
    facts,
    excluded: count(obj, "excluded", what, status),
    tampered: obj.tampered === undefined ? 0 : count(obj, "tampered", what, status),
  };
}

/** The answer of `POST /v1/runs`. */
export function parseCreated({ body, status }: Answer): CreatedRun {
  const what = "a created run";
  const obj = object(body, what, status);
  const deadline = parseTime(text(obj, "deadline", what, status));
  if (deadline === null) {
    throw unexpected(what, status);
  }
  return {
    runId: text(obj, "run_id", what, status),
    runToken: text(obj, "run_token", what, status),
    deadline,
  };
}

/** The answer of `GET /v1/tools`: its `tools`, with `input_schema` as `inputSchema`. */
export function parseTools({ body, status }: Answer): ToolSpec[] {
  const what = "a tool list";
  const items = object(body, what, status).tools;
  if (!Array.isArray(items)) {
    throw unexpected(what, status);
  }
  return items.map((item: unknown): ToolSpec => {
    const tool = object(item, what, status);
    const schema = tool.input_schema ?? { type: "object" };
    const description = tool.description ?? "";
    if (typeof tool.name !== "string" || typeof description !== "string" || !isObject(schema)) {
      throw unexpected(what, status);
    }
    return { name: tool.name, description, inputSchema: schema };
  });
}

const RFC3339 =
  /^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?(?:([Zz])|([+-])(\d{2}):(\d{2}))$/;

/**
 * An RFC 3339 time as a Date, or null if it is not one. Written out because `Date.parse`
 * accepts impossible dates (February 30th) and formats RFC 3339 does not allow.
 */
export function parseTime(value: string): Date | null {
  const m = RFC3339.exec(value);
  if (m === null) {
    return null;
  }
  const [year, month, day, hour, minute, second] = m.slice(1, 7).map(Number) as [
    number,
    number,
    number,
    number,
    number,
    number,
  ];
  const millis = Number((m[7] ?? "0").slice(0, 3).padEnd(3, "0"));
  const utc = new Date(Date.UTC(year, month - 1, day, hour, minute, Math.min(second, 59), millis));
  if (
    utc.getUTCFullYear() !== year ||
    utc.getUTCMonth() !== month - 1 ||
    utc.getUTCDate() !== day ||
    utc.getUTCHours() !== hour ||
    utc.getUTCMinutes() !== minute ||
    second > 60
  ) {
    return null;
  }
  let offsetMinutes = 0;
  if (m[8] === undefined) {
    const hours = Number(m[10]);
    const minutes = Number(m[11]);
    if (hours > 23 || minutes > 59) {
      return null;
    }
    offsetMinutes = (m[9] === "-" ? -1 : 1) * (hours * 60 + minutes);
  }
  return new Date(utc.getTime() - offsetMinutes * 60_000);
}
