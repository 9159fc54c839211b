// Vercel AI SDK adapter: a run's toolgate tools as an AI SDK `ToolSet`.
//
// `tools(agent)` asks toolgate once for the tools the run may call and builds one AI SDK tool
// per tool, keyed by its name: its description, and its JSON schema exactly as configured
// (`jsonSchema()`, no validator, no strict mode), so toolgate is the one that checks arguments.
//
// Each call carries the SDK's own id of that call, `execute`'s `toolCallId`, to toolgate
// unchanged. An `execute` without one (a call made by hand) is refused before anything is sent:
// toolgate never invents an id, and neither does this adapter.
//
// `execute` never throws for a toolgate failure. It resolves to a `ToolgateOutput`, which the
// application reads in `toolResults`, and `toModelOutput` turns it into what the model reads:
//
// - `READY`: the projected result, as the SDK's structured `json` output.
// - a toolgate error (a duplicate id, a tool the run may not call, a failing upstream, a
//   transport failure, ...): an `error-text` output, `"CODE: message"`
//   (`DUPLICATE_TOOL_CALL: ...`). A thrown error would reach the model as the SDK's own error
//   text, which carries the message without toolgate's code.

import type { JSONSchema7, JSONValue, Tool, ToolResultPart } from "ai";
import { type Agent, type JsonObject, ToolgateError, type ToolResult } from "./index.js";

/** A tool call that did not succeed, as `execute` resolves it. */
export interface ToolgateToolError {
  status: "ERROR";
  /** The id toolgate echoed (null if it was missing or unsafe). */
  toolCallId: string | null;
  /** toolgate's stable code and fixed sentence, or the adapter's own refusal. */
  error: { code: string; message: string };
}

/** What a toolgate tool's `execute` resolves to: toolgate's READY result, or its error. */
export type ToolgateOutput = ToolResult | ToolgateToolError;

/** The tools of one run, keyed by tool name: an AI SDK `ToolSet`. */
export type ToolgateTools = Record<string, Tool<JsonObject, ToolgateOutput>>;

type Sdk = typeof import("ai");

const NO_TOOL_CALL_ID =
  "toolgate needs the id of this tool call and execute was given none; run the tool through " +
  "the AI SDK (generateText, streamText), which passes the model's toolCallId.";
const NOT_AN_OBJECT = "the tool arguments must be a JSON object.";

/**
 * The tools `agent`'s run may call, as an AI SDK `ToolSet` keyed by tool name.
 *
 * Pass it as `tools` to `generateText`, `streamText` or a `ToolLoopAgent`. The tool list is
 * fetched once, here (`GET /v1/tools`).
 */
export async function tools(agent: Agent): Promise<ToolgateTools> {
  const { jsonSchema, tool } = await framework();
  const set: ToolgateTools = {};
  for (const spec of await agent.tools()) {
    const name = spec.name;
    set[name] = tool<JsonObject, ToolgateOutput>({
      description: spec.description,
      inputSchema: jsonSchema<JsonObject>(spec.inputSchema as JSONSchema7),
      execute: (input, options) => call(agent, name, input, options?.toolCallId),
      toModelOutput: ({ output }) => modelOutput(output),
    });
  }
  return set;
}

/** One call through toolgate: its READY result or its error, never an exception from toolgate. */
async function call(
  agent: Agent,
  tool: string,
  input: unknown,
  toolCallId: unknown,
): Promise<ToolgateOutput> {
  if (typeof toolCallId !== "string" || toolCallId === "") {
    return failure("INVALID_TOOL_CALL_ID", NO_TOOL_CALL_ID, null);
  }
  if (typeof input !== "object" || input === null || Array.isArray(input)) {
    return failure("INVALID_INPUT", NOT_AN_OBJECT, toolCallId);
  }
  try {
    return await agent.invoke(tool, input as JsonObject, { toolCallId });
  } catch (err) {
    if (err instanceof ToolgateError) {
      return failure(err.code, err.message, err.toolCallId);
    }
    throw err;
  }
}

function failure(code: string, message: string, toolCallId: string | null): ToolgateToolError {
  return { status: "ERROR", toolCallId, error: { code, message } };
}

/** What the model reads: the projected result as JSON, or the error as `"CODE: message"`. */
function modelOutput(output: ToolgateOutput): ToolResultPart["output"] {
  if (output.status === "READY") {
    return { type: "json", value: output.result as JSONValue };
  }
  return { type: "error-text", value: `${output.error.code}: ${output.error.message}` };
}

async function framework(): Promise<Sdk> {
  try {
    return await import("ai");
  } catch (err) {
    if ((err as { code?: unknown } | null)?.code === "ERR_MODULE_NOT_FOUND") {
      throw new Error("@toolgate/client/ai needs the Vercel AI SDK: npm install ai", {
        cause: err,
      });
    }
    throw err;
  }
}
