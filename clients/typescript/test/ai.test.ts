// The Vercel AI SDK adapter against a real toolgate, driven by the SDK's own loop (`generateText`
// with `stopWhen`) and its own mock model (`MockLanguageModelV3` from `ai/test`): the model picks
// the tool call ids, toolgate keys its records by them, and the prompt the model reads on its
// next step carries what toolgate answered, errors included.

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import { generateText, stepCountIs, type ToolSet } from "ai";
import { MockLanguageModelV3 } from "ai/test";

import { type ToolgateOutput, type ToolgateTools, tools } from "../src/ai.js";
import { Agent, Harness, type JsonObject, type Run, ToolgateError } from "../src/index.js";
import { newId, type Sidecar, startSidecar } from "./sidecar.js";

type GenerateResult = Awaited<ReturnType<MockLanguageModelV3["doGenerate"]>>;
type ModelCall = MockLanguageModelV3["doGenerateCalls"][number];
type ModelOutput = { type: string; value: unknown };

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

const USAGE: GenerateResult["usage"] = {
  inputTokens: { total: 1, noCache: 1, cacheRead: undefined, cacheWrite: undefined },
  outputTokens: { total: 1, text: 1, reasoning: undefined },
};

/** One model step that calls tools: `[id, tool, input]` each (a string input is sent as is). */
function calls(...items: [string, string, JsonObject | string][]): GenerateResult {
  return {
    content: items.map(([toolCallId, toolName, input]) => ({
      type: "tool-call" as const,
      toolCallId,
      toolName,
      input: typeof input === "string" ? input : JSON.stringify(input),
    })),
    finishReason: { unified: "tool-calls", raw: "tool_calls" },
    usage: USAGE,
    warnings: [],
  };
}

const DONE: GenerateResult = {
  content: [{ type: "text", text: "done" }],
  finishReason: { unified: "stop", raw: "stop" },
  usage: USAGE,
  warnings: [],
};

/** The SDK's mock model: the given steps (the calls of one step run in parallel), then "done". */
function model(...steps: GenerateResult[]): MockLanguageModelV3 {
  return new MockLanguageModelV3({ doGenerate: [...steps, DONE] });
}

/** One `generateText` loop over the mock model; every scripted step must be used. */
async function drive(llm: MockLanguageModelV3, set: ToolSet, steps: number) {
  const result = await generateText({
    model: llm,
    prompt: "go",
    tools: set,
    stopWhen: stepCountIs(steps + 2),
  });
  assert.equal(result.text, "done");
  assert.equal(llm.doGenerateCalls.length, steps + 1, "every scripted step was used");
  return result;
}

/** The tool results a model step was given, by tool call id. */
function outputs(call: ModelCall): Map<string, ModelOutput> {
  const seen = new Map<string, ModelOutput>();
  for (const message of call.prompt) {
    if (message.role !== "tool") {
      continue;
    }
    for (const part of message.content) {
      if (part.type === "tool-result") {
        seen.set(part.toolCallId, part.output as ModelOutput);
      }
    }
  }
  return seen;
}

function nth(llm: MockLanguageModelV3, step: number): ModelCall {
  const call = llm.doGenerateCalls[step];
  assert.ok(call, `the model was called for step ${step}`);
  return call;
}

function output(seen: Map<string, ModelOutput>, id: string): ModelOutput {
  const found = seen.get(id);
  assert.ok(found, `the model was given a result for ${id}`);
  return found;
}

/** An error result, asserted to start with `code`; its text. */
function errorText(found: ModelOutput, code: string): string {
  assert.equal(found.type, "error-text");
  assert.equal(typeof found.value, "string");
  const text = found.value as string;
  assert.ok(text.startsWith(`${code}: `), text);
  return text;
}

async function state(run: Run): Promise<number> {
  return (await run.state()).calls_used;
}

async function notRecorded(run: Run, id: string): Promise<void> {
  await assert.rejects(
    run.invocation(id),
    (err: unknown) => err instanceof ToolgateError && err.code === "NOT_FOUND",
  );
}

describe("AI SDK tools", () => {
  it("keys records by the model's tool call ids, parallel calls included", async () => {
    const run = await harness.createRun(newId("run"), { tools: TOOLS });
    const set = await tools(run.agent());
    const [searched, echoed, failed] = [newId("call"), newId("call"), newId("call")];
    const colon = `call:${newId("x")}`;
    const llm = model(
      // Two calls in one step: generateText runs them in parallel.
      calls([searched, "search", { q: "redis" }], [echoed, "echo", { msg: "hi", n: 1 }]),
      calls([failed, "fail", {}], [colon, "echo", { msg: "colon" }]),
    );

    const result = await drive(llm, set, 2);

    // Exactly the ids the model emitted, and nothing else, reached toolgate.
    assert.equal(await state(run), 4);
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

    assert.equal(outputs(nth(llm, 0)).size, 0);
    // The next step reads the projected results, structured, under the model's ids.
    const second = outputs(nth(llm, 1));
    assert.deepEqual(output(second, searched), {
      type: "json",
      value: records[searched]?.agent_result,
    });
    assert.deepEqual(output(second, echoed), {
      type: "json",
      value: records[echoed]?.agent_result,
    });
    const found = output(second, searched).value as { items: Record<string, unknown>[] };
    assert.ok(found.items.length > 0);
    for (const hit of found.items) {
      assert.ok(Object.keys(hit).every((k) => ["title", "url", "snippet"].includes(k)));
    }
    // A failing tool reaches the model as an error result starting with its code; the loop went on.
    const third = outputs(nth(llm, 2));
    assert.equal(records[failed]?.error_code, "TOOL_EXECUTION_FAILED");
    errorText(output(third, failed), "TOOL_EXECUTION_FAILED");
    assert.deepEqual(output(third, colon), { type: "json", value: records[colon]?.agent_result });

    // The application sees toolgate's whole answer in the SDK's own tool results.
    const byId = new Map<string, ToolgateOutput>(
      result.steps.flatMap((step) =>
        step.toolResults.map((r) => [r.toolCallId, r.output as ToolgateOutput] as const),
      ),
    );
    const ready = byId.get(searched);
    assert.ok(ready?.status === "READY");
    assert.equal(ready.toolCallId, searched);
    assert.ok(["EVIDENCE_FOUND", "NO_EVIDENCE"].includes(ready.evidenceStatus));
    const error = byId.get(failed);
    assert.ok(error?.status === "ERROR");
    assert.deepEqual([error.toolCallId, error.error.code], [failed, "TOOL_EXECUTION_FAILED"]);
    assert.deepEqual(
      result.steps.flatMap((step) => step.content.filter((part) => part.type === "tool-error")),
      [],
      "no toolgate answer became an SDK tool error",
    );

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

  it("shows the model each tool's description and schema exactly as configured", async () => {
    const run = await harness.createRun(newId("run"), { tools: TOOLS });
    const agent = run.agent();
    const configured = await agent.tools();
    const set: ToolgateTools = await tools(agent);
    assert.deepEqual(Object.keys(set).sort(), TOOLS);
    const llm = model(calls([newId("call"), "echo", { msg: "x" }]));

    await drive(llm, set, 1);

    for (const call of llm.doGenerateCalls) {
      const shown = (call.tools ?? []).map((t) => {
        assert.ok(t.type === "function");
        // Not strict: the provider gets the schema as it is, with no strict-mode rewriting.
        assert.equal(t.strict, undefined);
        return {
          type: t.type,
          name: t.name,
          description: t.description,
          inputSchema: t.inputSchema,
        };
      });
      assert.deepEqual(
        shown.sort((a, b) => a.name.localeCompare(b.name)),
        configured
          .map((t) => ({
            type: "function",
            name: t.name,
            description: t.description,
            inputSchema: t.inputSchema,
          }))
          .sort((a, b) => a.name.localeCompare(b.name)),
      );
    }
    // No strict-mode rewriting: search keeps its one required field and stays open to others,
    // and a tool configured without a schema is shown toolgate's `{"type": "object"}`.
    const shown = new Map((nth(llm, 0).tools ?? []).map((t) => [t.name, t]));
    const search = shown.get("search");
    assert.ok(search?.type === "function");
    assert.deepEqual(search.inputSchema, {
      type: "object",
      required: ["q"],
      properties: { q: { type: "string", maxLength: 512 } },
    });
    const echo = shown.get("echo");
    assert.ok(echo?.type === "function");
    assert.deepEqual(echo.inputSchema, { type: "object" });
  });

  it("refuses a replayed step as DUPLICATE_TOOL_CALL and keeps the first records", async () => {
    const run = await harness.createRun(newId("run"), { tools: TOOLS });
    const set = await tools(run.agent());
    const [one, two] = [newId("call"), newId("call")];
    const step = calls([one, "echo", { msg: "first" }], [two, "search", { q: "redis" }]);
    await drive(model(step), set, 1);
    const before = [await run.invocation(one), await run.invocation(two)];

    // The same step again, in a new loop (a resumed or retried agent): refused, the loop goes on.
    const replay = model(step);
    await drive(replay, set, 1);

    const seen = outputs(nth(replay, 1));
    errorText(output(seen, one), "DUPLICATE_TOOL_CALL");
    errorText(output(seen, two), "DUPLICATE_TOOL_CALL");
    const after = [await run.invocation(one), await run.invocation(two)];
    const withoutTtl = ({ ttl_ms: _, ...rest }: JsonObject) => rest;
    assert.deepEqual(after.map(withoutTtl), before.map(withoutTtl));
    assert.equal(await state(run), 2);
    assert.deepEqual((await run.end()).facts.map((f) => f.toolCallId).sort(), [one, two].sort());
  });

  it("sends bad arguments to the model as errors, with nothing recorded", async () => {
    const run = await harness.createRun(newId("run"), { tools: TOOLS });
    const set = await tools(run.agent());
    const [broken, notObject, offSchema] = [newId("call"), newId("call"), newId("call")];
    const llm = model(
      calls(
        [broken, "echo", '{"msg": '],
        [notObject, "echo", "[1, 2]"],
        [offSchema, "search", { q: 42 }],
      ),
    );

    await drive(llm, set, 1);

    const seen = outputs(nth(llm, 1));
    // Unparseable arguments never reach the tool: the SDK answers them with its own error.
    assert.equal(output(seen, broken).type, "error-text");
    assert.equal(
      errorText(output(seen, notObject), "INVALID_INPUT"),
      "INVALID_INPUT: the tool arguments must be a JSON object.",
    );
    // The schema is toolgate's to check, not the SDK's: its refusal reaches the model as is.
    errorText(output(seen, offSchema), "INVALID_INPUT");
    assert.equal(await state(run), 0);
    for (const id of [broken, notObject, offSchema]) {
      await notRecorded(run, id);
    }
  });

  it("sends the refusals of the run itself to the model", async () => {
    const run = await harness.createRun(newId("run"), { tools: ["echo"] });
    const set = await tools(run.agent());
    // The list is the run's: `fail` is not in it, so a model naming it gets the SDK's own
    // unknown-tool error. A tool the run may no longer call is refused by toolgate.
    assert.deepEqual(Object.keys(set), ["echo"]);
    await run.end();
    const late = newId("call");
    const llm = model(calls([late, "echo", { msg: "late" }]));

    await drive(llm, set, 1);

    errorText(output(outputs(nth(llm, 1)), late), "RUN_INACTIVE");
  });

  it("refuses an execute without a tool call id and sends nothing", async () => {
    const run = await harness.createRun(newId("run"), { tools: TOOLS });
    const echo = (await tools(run.agent())).echo;
    assert.ok(echo?.execute);

    for (const toolCallId of ["", undefined]) {
      const options = { toolCallId, messages: [] } as unknown as Parameters<
        NonNullable<typeof echo.execute>
      >[1];
      const answer = (await echo.execute({ msg: "x" }, options)) as ToolgateOutput;
      assert.ok(answer.status === "ERROR");
      assert.equal(answer.error.code, "INVALID_TOOL_CALL_ID");
      assert.match(answer.error.message, /id of this tool call/);
      assert.equal(answer.toolCallId, null);
    }
    assert.equal(await state(run), 0);
  });

  it("reaches the model with TRANSPORT_ERROR when toolgate does not answer", async () => {
    const run = await harness.createRun(newId("run"), { tools: TOOLS });
    const live = run.agent();
    const specs = await live.tools();
    // The same run token on a port nothing listens on; the tool list is the live one.
    const dead = new Agent("http://127.0.0.1:9", run.runToken, { timeoutMs: 2000 });
    dead.tools = async () => specs;
    const lost = newId("call");
    const llm = model(calls([lost, "echo", { msg: "x" }]));

    await drive(llm, await tools(dead), 1);

    errorText(output(outputs(nth(llm, 1)), lost), "TRANSPORT_ERROR");
    await notRecorded(run, lost);
  });
});
