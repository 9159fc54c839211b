// OpenAI Agents SDK adapter: a run's toolgate tools as the SDK's own `FunctionTool`s.
//
// `tools(agent)` asks toolgate once for the tools the run may call and builds one function tool
// per tool with the SDK's `tool()`: its description, and its JSON schema with `strict: false`,
// since the SDK's strict mode would rewrite the schema (every property required,
// `additionalProperties: false`) before the model sees it; toolgate checks the arguments. The one
// addition: an object schema without `properties` (`{"type": "object"}`, the schema of a tool
// configured without one) gets an empty `properties`, because the OpenAI API refuses a function
// whose parameters lack it. It accepts exactly the same arguments. The name is the SDK's
// rendering of the tool's name (`tool()` turns every character outside `[A-Za-z0-9]` into `_`);
// the call still goes to toolgate under the configured name.
//
// Each call carries the SDK's own id of that call, the `callId` of the `toolCall` in `execute`'s
// third argument (the model's `call_id`), to toolgate unchanged. A call without one (the tool
// invoked by hand) is refused before anything is sent: toolgate never invents an id, and neither
// does this adapter.
//
// The tool's output, which the SDK sends back to the model as the call's `function_call_output`:
//
// - `READY`: the projected result as compact JSON text.
// - a toolgate error (a duplicate id, a tool the run may not call, a failing upstream, a
//   transport failure, ...): `"CODE: message"` (`DUPLICATE_TOOL_CALL: ...`), returned as the
//   output, never thrown: the SDK would otherwise show the model its generic "An error occurred
//   while running the tool" text.
// - arguments that are not a JSON object: `INVALID_INPUT: ...`, with nothing sent. Arguments
//   that are not JSON at all never reach the tool under the Runner, which answers them with its
//   own text; invoked by hand, the tool answers `INVALID_INPUT` for them too.

import type { FunctionTool } from "@openai/agents";
import { type Agent, type JsonObject, ToolgateError } from "./index.js";

type Sdk = typeof import("@openai/agents");

/** The parameter schemas `tool()` takes with `strict: false`. */
type NonStrictParameters = Extract<FunctionTool["parameters"], { additionalProperties: true }>;

/** A toolgate tool as the Agents SDK sees it: JSON-schema parameters, a text output. */
export type ToolgateFunctionTool = FunctionTool<unknown, NonStrictParameters, string>;

const NO_TOOL_CALL_ID =
  "INVALID_TOOL_CALL_ID: toolgate needs the id of this tool call and the call details carry " +
  "none; run the tool through the Agents SDK Runner, which passes the model's callId.";
const NOT_JSON = "INVALID_INPUT: the tool arguments are not valid JSON.";
const NOT_AN_OBJECT = "INVALID_INPUT: the tool arguments must be a JSON object.";

/**
 * The tools `agent`'s run may call, as OpenAI Agents SDK function tools.
 *
 * Pass them to `new Agent({ tools })`. The tool list is fetched once, here (`GET /v1/tools`).
 * Two configured names the SDK would render alike (`web.search`, `web-search`) are refused.
 */
export async function tools(agent: Agent): Promise<ToolgateFunctionTool[]> {
  const sdk = await framework();
  const built: ToolgateFunctionTool[] = [];
  const seen = new Map<string, string>();
  for (const spec of await agent.tools()) {
    const name = spec.name;
    const functionTool = sdk.tool({
      name,
      description: spec.description,
      parameters: parameters(spec.inputSchema),
      strict: false,
      execute: (input, _context, details) => call(agent, name, input, details?.toolCall?.callId),
      errorFunction: (_context, error) => errorText(error, sdk),
    });
    const clash = seen.get(functionTool.name);
    if (clash !== undefined) {
      throw new Error(
        `toolgate tools '${clash}' and '${name}' both become the Agents SDK tool name ` +
          `'${functionTool.name}'; rename one of them in toolgate's config`,
      );
    }
    seen.set(functionTool.name, name);
    built.push(functionTool);
  }
  return built;
}

/** The configured schema as the model is shown it: unchanged, but an object schema without
 * `properties`, which the OpenAI API refuses, gets an empty one (the same arguments valid). */
function parameters(schema: JsonObject): NonStrictParameters {
  if (schema.type === "object" && !("properties" in schema)) {
    return { ...schema, properties: {} } as unknown as NonStrictParameters;
  }
  return schema as unknown as NonStrictParameters;
}

/** One call through toolgate: the model-visible output text, never an exception from toolgate. */
async function call(
  agent: Agent,
  tool: string,
  input: unknown,
  toolCallId: string | undefined,
): Promise<string> {
  if (typeof toolCallId !== "string" || toolCallId === "") {
    return NO_TOOL_CALL_ID;
  }
  if (typeof input !== "object" || input === null || Array.isArray(input)) {
    return NOT_AN_OBJECT;
  }
  try {
    const result = await agent.invoke(tool, input as JsonObject, { toolCallId });
    return JSON.stringify(result.result);
  } catch (err) {
    if (err instanceof ToolgateError) {
      return String(err);
    }
    throw err;
  }
}

/** The output for a failure the SDK caught around `execute`: arguments the SDK could not parse
 * as JSON, or an error that is not toolgate's. */
function errorText(error: unknown, sdk: Sdk): string {
  if (error instanceof ToolgateError) {
    return String(error);
  }
  // The only model-behaviour error a JSON-schema tool raises: unparseable arguments.
  if (error instanceof sdk.ModelBehaviorError) {
    return NOT_JSON;
  }
  return String(error);
}

async function framework(): Promise<Sdk> {
  try {
    return await import("@openai/agents");
  } catch (err) {
    if ((err as { code?: unknown } | null)?.code === "ERR_MODULE_NOT_FOUND") {
      throw new Error(
        "@toolgate/client/openai-agents needs the OpenAI Agents SDK: npm install @openai/agents",
        { cause: err },
      );
    }
    throw err;
  }
}
