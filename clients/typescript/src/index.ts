// toolgate's TypeScript client. `Harness` creates and ends runs on toolgate's admin listener;
// `Agent` lists and calls a run's tools on the agent listener, under the agent framework's own
// tool call ids. Every failure is a `ToolgateError` with a stable `code`. `verifyEvidence` checks
// a run's signed evidence offline (with `jose`, imported only when it runs). Framework adapters
// live in the subpaths `@toolgate/client/ai` and `@toolgate/client/openai-agents`.

import type { Facts, JsonObject, ToolResult, ToolSpec } from "./wire.js";
import * as wire from "./wire.js";

export {
  EVIDENCE_ALG,
  EVIDENCE_HEADER_TYP,
  type EvidenceRecords,
  InvalidEvidence,
  type RecordBody,
  STATEMENT_TYP,
  type Statement,
  type StatementFact,
  verifyEvidence,
} from "./evidence.js";

export {
  DEFAULT_TIMEOUT_MS,
  type Fact,
  type Facts,
  type JsonObject,
  ToolgateError,
  type ToolResult,
  type ToolSpec,
  TRANSPORT_ERROR,
  UNEXPECTED_RESPONSE,
} from "./wire.js";

/** A run's call budget; fields left out take the server's configured defaults. */
export interface Budget {
  maxCalls?: number | undefined;
  maxCallsPerTool?: Readonly<Record<string, number>> | undefined;
  maxRecordBytes?: number | undefined;
}

/** What `Harness.createRun` may set; everything left out takes the server's defaults. */
export interface CreateRunOptions {
  /** The tools the run may call; left out, every tool configured at the time of each call. */
  tools?: readonly string[] | undefined;
  /** How long the run lives, in milliseconds. */
  timeoutMs?: number | undefined;
  budget?: Budget | undefined;
  /** Absolute path the run's path arguments resolve against. */
  workspace?: string | undefined;
  /** Absolute path `~` stands for in the run's path arguments. */
  home?: string | undefined;
}

export interface HarnessOptions {
  /** The admin token (`TOOLGATE_ADMIN_TOKEN` of the sidecar). */
  adminToken: string;
  /** The agent listener's base URL: only needed for `run.agent()`. */
  agentUrl?: string | undefined;
  /** Bound on every request, in milliseconds (default 30 000). */
  timeoutMs?: number | undefined;
}

export interface AgentOptions {
  /** Bound on every request, in milliseconds (default 30 000). */
  timeoutMs?: number | undefined;
}

export interface InvokeOptions {
  /** The agent framework's own id of this tool call, sent unchanged. */
  toolCallId: string;
}

/** The run view of `GET /v1/runs/{run_id}`, exactly as the server sends it (snake_case). */
export interface RunView {
  run_id: string;
  state: "ACTIVE" | "ENDED" | "CANCELLED";
  /** RFC 3339 UTC with milliseconds. */
  deadline: string;
  calls_used: number;
  record_bytes_used: number;
  budget: {
    max_calls: number;
    max_calls_per_tool: Record<string, number>;
    max_record_bytes: number;
  };
  /** null: every configured tool. */
  tools: string[] | null;
  workspace: string;
  home: string;
  [key: string]: unknown;
}

/** A run's signed evidence: a JWS in its General JSON Serialization. */
export interface EvidenceBundle {
  /** base64url (no padding) of the UTF-8 JSON statement. */
  payload: string;
  signatures: { protected: string; signature: string }[];
  [key: string]: unknown;
}

/** A harness's admin side, shared with its runs only. */
interface Admin {
  send(call: wire.Call): Promise<wire.Answer>;
  timeoutMs: number;
}

let admin: (harness: Harness) => Admin;

/**
 * The owner of runs, talking to toolgate's admin listener with the admin token.
 *
 * Requests use the platform `fetch`, are bounded by `timeoutMs` and are never retried.
 */
export class Harness {
  /** The admin listener's base URL. */
  readonly adminUrl: string;
  /** The agent listener's base URL, if one was given. */
  readonly agentUrl: string | null;
  readonly #adminToken: string;
  readonly #timeoutMs: number;

  constructor(adminUrl: string, options: HarnessOptions) {
    if (!options.adminToken) {
      throw new TypeError("adminToken is empty");
    }
    this.adminUrl = wire.baseUrl(adminUrl);
    this.agentUrl = options.agentUrl === undefined ? null : wire.baseUrl(options.agentUrl);
    this.#adminToken = options.adminToken;
    this.#timeoutMs = wire.timeoutOf(options.timeoutMs);
  }

  static {
    // Runs send with their harness's token; nothing outside this module can.
    admin = (harness) => ({
      send: (call) => wire.send(harness.adminUrl, call, harness.#adminToken, harness.#timeoutMs),
      timeoutMs: harness.#timeoutMs,
    });
  }

  /**
   * Creates a run (`POST /v1/runs`) and returns its handle, run token included.
   *
   * Options left out take the server's configured defaults. A taken id is `RUN_EXISTS`; a bad
   * field or an unsafe id `INVALID_INPUT`.
   */
  async createRun(runId: string, options: CreateRunOptions = {}): Promise<Run> {
    const created = wire.parseCreated(await admin(this).send(wire.createRun(runId, options)));
    return new Run(this, created.runId, created.runToken, created.deadline);
  }
}

/**
 * One run, as its harness sees it; made by `Harness.createRun`.
 *
 * `runToken` is the credential the agent calls tools with: hand it to the agent only. It is not
 * an own enumerable property, so logging or serializing a Run does not show it.
 */
export class Run {
  readonly runId: string;
  /** When the run times out. */
  readonly deadline: Date;
  readonly #harness: Harness;
  readonly #runToken: string;

  constructor(harness: Harness, runId: string, runToken: string, deadline: Date) {
    this.#harness = harness;
    this.runId = runId;
    this.#runToken = runToken;
    this.deadline = deadline;
  }

  /** The run token (`<run_id>.<mac>`): the agent's credential for this run. */
  get runToken(): string {
    return this.#runToken;
  }

  /** An Agent for this run on the harness's `agentUrl`, with the harness's timeout. */
  agent(): Agent {
    const agentUrl = this.#harness.agentUrl;
    if (agentUrl === null) {
      throw new Error(
        "the Harness has no agentUrl: pass { agentUrl } to new Harness() to use run.agent()",
      );
    }
    return new Agent(agentUrl, this.#runToken, { timeoutMs: admin(this.#harness).timeoutMs });
  }

  /** Ends the run (`ENDED`) and returns its facts. Ending an ended run returns them again. */
  async end(): Promise<Facts> {
    return wire.parseFacts(
      await admin(this.#harness).send(wire.runCall("POST", this.runId, "end")),
    );
  }

  /** Cancels the run (`CANCELLED`; calls in flight are aborted); returns the run view. */
  async cancel(): Promise<RunView> {
    const answer = await admin(this.#harness).send(wire.runCall("POST", this.runId, "cancel"));
    return wire.asObject<RunView>(answer, "a run");
  }

  /** The run's facts so far: its READY calls in completion order. */
  async facts(): Promise<Facts> {
    return wire.parseFacts(
      await admin(this.#harness).send(wire.runCall("GET", this.runId, "facts")),
    );
  }

  /** The run view (`GET /v1/runs/{run_id}`), as the server sends it. */
  async state(): Promise<RunView> {
    return wire.asObject<RunView>(
      await admin(this.#harness).send(wire.runCall("GET", this.runId)),
      "a run",
    );
  }

  /**
   * The whole canonical record of one call, raw response included, plus `ttl_ms`: exactly as the
   * server sends it (snake_case). `NOT_FOUND` if the run has no such record.
   */
  async invocation(toolCallId: string): Promise<JsonObject> {
    const answer = await admin(this.#harness).send(wire.invocation(this.runId, toolCallId));
    return wire.asObject(answer, "a record");
  }

  /** The run's signed evidence bundle (`GET /v1/runs/{run_id}/evidence`), as sent. */
  async evidence(): Promise<EvidenceBundle> {
    const answer = await admin(this.#harness).send(wire.runCall("GET", this.runId, "evidence"));
    return wire.asObject<EvidenceBundle>(answer, "an evidence bundle");
  }
}

/**
 * A run's agent side: lists and calls tools on toolgate's agent listener with the run token.
 *
 * The run id is taken from the token (everything before its last `.`). `toolCallId` is the agent
 * framework's own id of the call, sent unchanged; nothing is ever retried, since a second call
 * with the same id is refused as `DUPLICATE_TOOL_CALL`.
 */
export class Agent {
  /** The agent listener's base URL. */
  readonly agentUrl: string;
  /** The run the token is bound to. */
  readonly runId: string;
  readonly #runToken: string;
  readonly #timeoutMs: number;

  constructor(agentUrl: string, runToken: string, options: AgentOptions = {}) {
    this.runId = wire.runIdOf(runToken);
    this.agentUrl = wire.baseUrl(agentUrl);
    this.#runToken = runToken;
    this.#timeoutMs = wire.timeoutOf(options.timeoutMs);
  }

  /** The tools this run may call: `[{ name, description, inputSchema }]`. */
  async tools(): Promise<ToolSpec[]> {
    return wire.parseTools(
      await wire.send(this.agentUrl, wire.TOOLS, this.#runToken, this.#timeoutMs),
    );
  }

  /**
   * Calls `tool` with `input` under the framework's `toolCallId` (`POST /v1/invoke`).
   *
   * Resolves to the READY result; any refusal or failure rejects with a `ToolgateError`. After a
   * `TRANSPORT_ERROR` the call may still have run: read it with `run.invocation()`, do not
   * repeat it.
   */
  async invoke(
    tool: string,
    input: Record<string, unknown>,
    options: InvokeOptions,
  ): Promise<ToolResult> {
    const { toolCallId } = options;
    const call = wire.invoke(this.runId, tool, input, toolCallId);
    const answer = await wire.send(
      this.agentUrl,
      call,
      this.#runToken,
      this.#timeoutMs,
      toolCallId,
    );
    return wire.parseToolResult(answer, toolCallId);
  }
}
