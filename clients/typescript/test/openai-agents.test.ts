// The OpenAI Agents SDK adapter against a real toolgate, driven by the SDK's own loop (`Runner`,
// tracing off) and a scripted `Model` implementation: the model picks the call ids, toolgate
// keys its records by them, and the `function_call_result` items the model reads on its next
// turn carry what toolgate answered, errors included.

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import {
  type AgentInputItem,
  type AgentOutputItem,
  type FunctionTool,
  type Model,
  type ModelRequest,
  type ModelResponse,
  RunContext,
  Runner,
  Agent as SdkAgent,
  type SerializedTool,
  type StreamEvent,
  Usage,
} from "@openai/agents";

import { Agent, Harness, type JsonObject, type Run, ToolgateError } from "../src/index.js";
import { type ToolgateFunctionTool, tools } from "../src/openai-agents.js";
import { newId, type Sidecar, startSidecar } from "./sidecar.js";

const TOOLS = ["echo", "fail", "search"];

let sidecar: Sidecar;
let harness: Harness;

before(async () => {
  sidecar = await startSidecar();
  harness = new Harness(sidecar.adminUrl, {
    adminToken: sidecar.adminToken,
    agentUrl: sidecar.agentUrl,
  });
});

after(async () => {
  await sidecar?.stop();
});

/** What the model was sent on one turn: its input items and the tools it was shown. */
interface Seen {
  input: AgentInputItem[];
  tools: SerializedTool[];
}

/**
 * A model that answers from a script: the given turns (the function calls of one turn run in
 * parallel), then a final message; it keeps what each request sent it.
 */
class ScriptedModel implements Model {
  readonly seen: Seen[] = [];
  readonly #turns: AgentOutputItem[][];

  constructor(turns: AgentOutputItem[][]) {
    this.#turns = [...turns, [message("done")]];
  }

  async getResponse(request: ModelRequest): Promise<ModelResponse> {
    const input = typeof request.input === "string" ? [] : request.input;
    // A deep copy: the runner goes on with its own items.
    this.seen.push(structuredClone({ input, tools: request.tools }));
    const output = this.#turns[this.seen.length - 1];
    assert.ok(output, `the script has no turn ${this.seen.length}`);
    return { usage: new Usage(), output, responseId: `resp-${this.seen.length}` };
  }

  // biome-ignore lint/correctness/useYield: the scripted model never streams.
  async *getStreamedResponse(): AsyncIterable<StreamEvent> {
    throw new Error("the scripted model does not stream");
  }

  assertComplete(): void {
    assert.equal(this.seen.length, this.#turns.length, "every scripted turn was used");
  }
}

function message(text: string): AgentOutputItem {
  return {
    type: "message",
    role: "assistant",
    status: "completed",
    content: [{ type: "output_text", text }],
  };
}

/** A function call with the model's own call id; a string is sent as the arguments as is. */
function functionCall(name: string, args: JsonObject | string, callId: string): AgentOutputItem {
  return {
    type: "function_call",
    callId,
    name,
    arguments: typeof args === "string" ? args : JSON.stringify(args),
    status: "completed",
  };
}

/** One agent run in the SDK's own loop (tracing off); every script turn must be used. */
async function drive(llm: ScriptedModel, agentTools: ToolgateFunctionTool[]): Promise<unknown> {
  const agent = new SdkAgent({
    name: "assistant",
    instructions: "Use the tools.",
    model: llm,
    tools: agentTools,
  });
  const result = await new Runner({ tracingDisabled: true }).run(agent, "go");
  llm.assertComplete();
  return result.finalOutput;
}

/** The tool outputs a model turn was given, by call id. */
function outputs(seen: Seen | undefined): Map<string, string> {
  assert.ok(seen, "the model was called for this turn");
  const found = new Map<string, string>();
  for (const item of seen.input) {
    if (item.type === "function_call_result") {
      const out = item.output;
      assert.ok(typeof out === "object" && !Array.isArray(out) && out.type === "text");
      found.set(item.callId, out.text);
    }
  }
  return found;
}

function text(found: Map<string, string>, callId: string): string {
  const value = found.get(callId);
  assert.ok(value !== undefined, `the model was given an output for ${callId}`);
  return value;
}

function startsWith(value: string, code: string): void {
  assert.ok(value.startsWith(`${code}: `), value);
}

async function callsUsed(run: Run): Promise<number> {
  return (await run.state()).calls_used;
}

async function notRecorded(run: Run, id: string): Promise<void> {
  await assert.rejects(
    run.invocation(id),
    (err: unknown) => err instanceof ToolgateError && err.code === "NOT_FOUND",
  );
}

describe("OpenAI Agents SDK tools", () => {
  it("keys records by the model's call ids, parallel calls included", async () => {
    const run = await harness.createRun(newId("run"), { tools: TOOLS });
    const sdkTools = await tools(run.agent());
    const [searched, echoed, failed] = [newId("call"), newId("call"), newId("call")];
    const colon = `call:${newId("x")}`;
    const llm = new ScriptedModel([
      // Two calls in one turn: the runner runs them in parallel.
      [
        functionCall("search", { q: "redis" }, searched),
        functionCall("echo", { msg: "hi", n: 1 }, echoed),
      ],
      [functionCall("fail", {}, failed), functionCall("echo", { msg: "colon" }, colon)],
    ]);

    assert.equal(await drive(llm, sdkTools), "done");

    // Exactly the ids the model emitted, and nothing else, reached toolgate.
    assert.equal(await callsUsed(run), 4);
    const records: Record<string, JsonObject> = {};
    for (const id of [searched, echoed, failed, colon]) {
      records[id] = await run.invocation(id);
      assert.equal(records[id].tool_call_id, id);
    }
    assert.deepEqual(
      [searched, echoed, failed, colon].map((id) => records[id]?.status),
      ["READY", "READY", "ERROR", "READY"],
    );
    assert.equal(records[searched]?.tool, "search");
    assert.deepEqual(records[searched]?.request, { q: "redis" });
    assert.deepEqual(records[echoed]?.request, { msg: "hi", n: 1 });

    assert.equal(outputs(llm.seen[0]).size, 0);
    // The next turn reads the projected results as compact JSON, under the model's call ids.
    const second = outputs(llm.seen[1]);
    assert.equal(text(second, searched), JSON.stringify(records[searched]?.agent_result));
    assert.equal(text(second, echoed), JSON.stringify(records[echoed]?.agent_result));
    assert.ok(text(second, echoed).includes('"msg":"hi"'));
    const found = JSON.parse(text(second, searched)) as { items: Record<string, unknown>[] };
    assert.ok(found.items.length > 0);
    for (const hit of found.items) {
      assert.ok(Object.keys(hit).every((k) => ["title", "url", "snippet"].includes(k)));
    }
    // A failing tool reaches the model as an output starting with its code; the run went on.
    const third = outputs(llm.seen[2]);
    assert.equal(records[failed]?.error_code, "TOOL_EXECUTION_FAILED");
    startsWith(text(third, failed), "TOOL_EXECUTION_FAILED");
    assert.ok(!text(third, failed).includes("An error occurred"), "not the SDK's generic text");
    assert.equal(text(third, colon), JSON.stringify(records[colon]?.agent_result));

    const facts = await run.end();
    // Completion order: the parallel pair in either order, then the later READY call.
    assert.deepEqual(
      new Set(facts.facts.slice(0, 2).map((f) => f.toolCallId)),
      new Set([searched, echoed]),
    );
    assert.deepEqual(
      facts.facts.slice(2).map((f) => f.toolCallId),
      [colon],
    );
    assert.equal(facts.excluded, 1);
    assert.deepEqual(await run.facts(), facts);
  });

  it("shows the model each tool's description and schema as configured, not strict", async () => {
    const run = await harness.createRun(newId("run"), { tools: TOOLS });
    const agent = run.agent();
    const configured = new Map((await agent.tools()).map((t) => [t.name, t]));
    const sdkTools = await tools(agent);
    const llm = new ScriptedModel([[functionCall("echo", { msg: "x" }, newId("call"))]]);

    await drive(llm, sdkTools);

    for (const seen of llm.seen) {
      const shown = seen.tools.filter((t) => t.type === "function");
      assert.deepEqual(shown.map((t) => t.name).sort(), TOOLS);
      for (const t of shown) {
        const spec = configured.get(t.name);
        assert.ok(spec);
        assert.equal(t.description, spec.description);
        assert.equal(t.strict, false);
        assert.deepEqual(t.parameters, shownAs(spec.inputSchema));
      }
    }
    // No strict-mode rewriting: search keeps its one required field and stays open to others.
    const byName = new Map<string, FunctionTool<unknown, never, string>>(
      sdkTools.map((t) => [t.name, t as unknown as FunctionTool<unknown, never, string>]),
    );
    assert.deepEqual(configured.get("search")?.inputSchema, {
      type: "object",
      required: ["q"],
      properties: { q: { type: "string", maxLength: 512 } },
    });
    assert.deepEqual(byName.get("search")?.parameters, configured.get("search")?.inputSchema);
    // A tool configured without a schema: toolgate's `{"type": "object"}`, with the empty
    // `properties` the OpenAI API requires.
    assert.deepEqual(configured.get("echo")?.inputSchema, { type: "object" });
    assert.deepEqual(byName.get("echo")?.parameters, { type: "object", properties: {} });
  });

  it("refuses a replayed turn as DUPLICATE_TOOL_CALL and keeps the first records", async () => {
    const run = await harness.createRun(newId("run"), { tools: TOOLS });
    const sdkTools = await tools(run.agent());
    const [one, two] = [newId("call"), newId("call")];
    const turn = () => [
      functionCall("echo", { msg: "first" }, one),
      functionCall("search", { q: "redis" }, two),
    ];
    await drive(new ScriptedModel([turn()]), sdkTools);
    const before = [await run.invocation(one), await run.invocation(two)];

    // The same turn again, in a new Runner run (a resumed or retried agent): refused, run goes on.
    const replay = new ScriptedModel([turn()]);
    assert.equal(await drive(replay, sdkTools), "done");

    const seen = outputs(replay.seen[1]);
    startsWith(text(seen, one), "DUPLICATE_TOOL_CALL");
    startsWith(text(seen, two), "DUPLICATE_TOOL_CALL");
    const after = [await run.invocation(one), await run.invocation(two)];
    const withoutTtl = ({ ttl_ms: _, ...rest }: JsonObject) => rest;
    assert.deepEqual(after.map(withoutTtl), before.map(withoutTtl));
    assert.equal(await callsUsed(run), 2);
    assert.deepEqual((await run.end()).facts.map((f) => f.toolCallId).sort(), [one, two].sort());
  });

  it("sends bad arguments to the model, with nothing recorded", async () => {
    const run = await harness.createRun(newId("run"), { tools: TOOLS });
    const sdkTools = await tools(run.agent());
    const [broken, notObject, offSchema] = [newId("call"), newId("call"), newId("call")];
    const llm = new ScriptedModel([
      [
        functionCall("echo", '{"msg": ', broken),
        functionCall("echo", "[1, 2]", notObject),
        functionCall("search", { q: 42 }, offSchema),
      ],
    ]);

    assert.equal(await drive(llm, sdkTools), "done");

    const seen = outputs(llm.seen[1]);
    // Unparseable arguments never reach the tool: the runner answers them with its own text.
    assert.match(text(seen, broken), /valid JSON/);
    assert.equal(text(seen, notObject), "INVALID_INPUT: the tool arguments must be a JSON object.");
    // The schema is toolgate's to check, not the SDK's: its refusal reaches the model as is.
    startsWith(text(seen, offSchema), "INVALID_INPUT");
    assert.equal(await callsUsed(run), 0);
    for (const id of [broken, notObject, offSchema]) {
      await notRecorded(run, id);
    }

    // Invoked outside the runner, the tool itself turns unparseable arguments into INVALID_INPUT.
    const echo = sdkTools.find((t) => t.name === "echo");
    assert.ok(echo);
    const direct = newId("call");
    const details = {
      toolCall: { type: "function_call", callId: direct, name: "echo", arguments: '{"msg": ' },
    } as const;
    assert.equal(
      await echo.invoke(new RunContext(), '{"msg": ', details),
      "INVALID_INPUT: the tool arguments are not valid JSON.",
    );
    await notRecorded(run, direct);
  });

  it("sends a run ended mid-loop to the model as RUN_INACTIVE", async () => {
    const run = await harness.createRun(newId("run"), { tools: TOOLS });
    const sdkTools = await tools(run.agent());
    await run.end();
    const late = newId("call");
    const llm = new ScriptedModel([[functionCall("echo", { msg: "late" }, late)]]);

    assert.equal(await drive(llm, sdkTools), "done");

    startsWith(text(outputs(llm.seen[1]), late), "RUN_INACTIVE");
  });

  it("sends TRANSPORT_ERROR to the model when toolgate does not answer", async () => {
    const run = await harness.createRun(newId("run"), { tools: TOOLS });
    const specs = await run.agent().tools();
    // The same run token on a port nothing listens on; the tool list is the live one.
    const dead = new Agent("http://127.0.0.1:9", run.runToken, { timeoutMs: 2000 });
    dead.tools = async () => specs;
    const lost = newId("call");
    const llm = new ScriptedModel([[functionCall("echo", { msg: "x" }, lost)]]);

    assert.equal(await drive(llm, await tools(dead)), "done");

    startsWith(text(outputs(llm.seen[1]), lost), "TRANSPORT_ERROR");
    await notRecorded(run, lost);
  });

  it("refuses a call whose details carry no call id and sends nothing", async () => {
    const run = await harness.createRun(newId("run"), { tools: TOOLS });
    const echo = (await tools(run.agent())).find((t) => t.name === "echo");
    assert.ok(echo);
    const context = new RunContext();
    const noCallId = {
      toolCall: { type: "function_call", callId: "", name: "echo", arguments: "{}" },
    } as const;

    for (const details of [undefined, {}, noCallId]) {
      const out = await echo.invoke(context, '{"msg": "x"}', details);
      assert.equal(typeof out, "string");
      startsWith(out, "INVALID_TOOL_CALL_ID");
      assert.match(out, /id of this tool call/);
    }
    assert.equal(await callsUsed(run), 0);
  });
});

describe("OpenAI Agents SDK tool names", () => {
  // A stand-in for the server's answers: tool names the test sidecar does not configure.
  function agentWith(names: string[], invoked: string[]): Agent {
    const agent = new Agent("http://127.0.0.1:9", "run-names.mac");
    agent.tools = async () =>
      names.map((name) => ({ name, description: "", inputSchema: { type: "object" } }));
    agent.invoke = async (tool, _input, { toolCallId }) => {
      invoked.push(tool);
      return { status: "READY", toolCallId, evidenceStatus: "EVIDENCE_FOUND", result: tool };
    };
    return agent;
  }

  it("calls toolgate under the configured name whatever name the SDK shows", async () => {
    const invoked: string[] = [];
    const [dotted] = await tools(agentWith(["web.search"], invoked));
    assert.ok(dotted);
    assert.equal(dotted.name, "web_search");
    const details = {
      toolCall: { type: "function_call", callId: "call_1", name: "web_search", arguments: "{}" },
    } as const;
    assert.equal(await dotted.invoke(new RunContext(), "{}", details), '"web.search"');
    assert.deepEqual(invoked, ["web.search"]);
  });

  it("refuses two tools the SDK would show under one name", async () => {
    await assert.rejects(tools(agentWith(["web.search", "web-search"], [])), (err: unknown) => {
      assert.ok(err instanceof Error);
      assert.match(err.message, /'web\.search' and 'web-search' both become .* 'web_search'/);
      return true;
    });
  });
});

/** A configured schema as the model must be shown it: unchanged, but an object schema without
 * `properties` (which the OpenAI API refuses) gets an empty one. */
function shownAs(schema: JsonObject): JsonObject {
  return schema.type === "object" && !("properties" in schema)
    ? { ...schema, properties: {} }
    : schema;
}
