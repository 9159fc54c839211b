// The core client against a real toolgate: every Harness, Run and Agent method, and every error
// code a client can provoke on the memory store. Answers that are not toolgate's come from a
// small local HTTP server.

import assert from "node:assert/strict";
import { createServer, type IncomingHttpHeaders } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, describe, it } from "node:test";
import { inspect } from "node:util";

import { Agent, type Facts, Harness, Run, ToolgateError } from "../src/index.js";
import { freePort, newId, type Sidecar, startSidecar } from "./sidecar.js";

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

/** The rejection of `promise`, checked for its code and status and for its string forms. */
async function refused(
  promise: Promise<unknown>,
  code: string,
  httpStatus: number | null,
): Promise<ToolgateError> {
  let caught: unknown;
  await assert.rejects(promise, (err: unknown) => {
    caught = err;
    return true;
  });
  assert.ok(caught instanceof ToolgateError, `not a ToolgateError: ${inspect(caught)}`);
  const err = caught;
  assert.deepEqual([err.code, err.httpStatus], [code, httpStatus], inspect(err));
  assert.ok(err instanceof Error);
  assert.equal(err.name, "ToolgateError");
  assert.ok(err.message.length > 0);
  assert.ok(!err.message.startsWith(code), "the message is the sentence alone");
  assert.equal(String(err), `${code}: ${err.message}`);
  assert.ok(err.stack?.startsWith(`ToolgateError [${code}]: ${err.message}\n`), err.stack);
  return err;
}

function runId(): string {
  return newId("run");
}

// --- Harness and Run ---------------------------------------------------------------------------

describe("Harness and Run", () => {
  it("createRun returns the run's token and its deadline as a Date", async () => {
    const id = runId();
    const start = Date.now();
    const run = await harness.createRun(id, { tools: ["search"], timeoutMs: 120_000 });
    assert.ok(run instanceof Run);
    assert.equal(run.runId, id);
    assert.ok(run.runToken.startsWith(`${id}.`) && run.runToken.length > id.length + 1);
    assert.ok(run.deadline instanceof Date);
    const ahead = run.deadline.getTime() - start;
    assert.ok(ahead > 115_000 && ahead < 125_000, `deadline ${ahead} ms ahead`);
  });

  it("createRun sends every option, in the wire's snake_case", async () => {
    const id = runId();
    const run = await harness.createRun(id, {
      tools: ["search", "echo"],
      timeoutMs: 60_000,
      budget: { maxCalls: 7, maxCallsPerTool: { search: 3 }, maxRecordBytes: 100_000 },
      workspace: "/srv/w",
      home: "/home/a",
    });
    const state = await run.state();
    assert.equal(state.run_id, id);
    assert.equal(state.state, "ACTIVE");
    assert.deepEqual(state.tools, ["search", "echo"]);
    assert.deepEqual(state.budget, {
      max_calls: 7,
      max_calls_per_tool: { search: 3 },
      max_record_bytes: 100_000,
    });
    assert.deepEqual([state.workspace, state.home], ["/srv/w", "/home/a"]);
    assert.equal(state.calls_used, 0);
    assert.equal(state.record_bytes_used, 0);
    assert.equal(state.deadline, run.deadline.toISOString());
  });

  it("createRun with no options takes the server's defaults", async () => {
    const run = await harness.createRun(runId());
    const state = await run.state();
    assert.equal(state.tools, null);
    assert.equal(state.budget.max_calls, 100);
    assert.equal(state.workspace, "/workspace");
    const partial = await (await harness.createRun(runId(), { budget: { maxCalls: 2 } })).state();
    assert.equal(partial.budget.max_calls, 2);
    assert.equal(partial.budget.max_record_bytes, state.budget.max_record_bytes);
  });

  it("a taken run id is RUN_EXISTS", async () => {
    const id = runId();
    await harness.createRun(id);
    const err = await refused(harness.createRun(id), "RUN_EXISTS", 409);
    assert.equal(err.toolCallId, null);
  });

  for (const [name, options] of [
    ["a relative workspace", { workspace: "relative/dir" }],
    ["the root as home", { home: "/" }],
    ["a timeout over the maximum", { timeoutMs: 3_600_001 }],
    ["a negative budget", { budget: { maxCalls: -1 } }],
  ] as const) {
    it(`${name} is INVALID_INPUT`, async () => {
      await refused(harness.createRun(runId(), options), "INVALID_INPUT", 400);
    });
  }

  it("an unsafe run id is INVALID_INPUT", async () => {
    await refused(harness.createRun("bad id"), "INVALID_INPUT", 400);
  });

  it("a bad admin token is UNAUTHENTICATED and never shown", async () => {
    const bad = new Harness(sidecar.adminUrl, { adminToken: "not-the-admin-token" });
    const err = await refused(bad.createRun(runId()), "UNAUTHENTICATED", 401);
    const shown = [String(err), err.stack, inspect(err), inspect(bad), JSON.stringify(bad)];
    assert.ok(!shown.join(" ").includes("not-the-admin-token"));
  });

  it("an empty admin token is refused before any request", () => {
    assert.throws(() => new Harness(sidecar.adminUrl, { adminToken: "" }), TypeError);
  });

  it("a timeout that is not a positive number is refused", () => {
    for (const timeoutMs of [0, -1, Number.NaN, Number.POSITIVE_INFINITY]) {
      assert.throws(
        () => new Harness(sidecar.adminUrl, { adminToken: "a", timeoutMs }),
        RangeError,
      );
      assert.throws(() => new Agent(sidecar.agentUrl, "run-1.mac", { timeoutMs }), RangeError);
    }
  });

  it("every run method on an unknown run is NOT_FOUND", async () => {
    const id = runId();
    const ghost = new Run(harness, id, `${id}.forged`, new Date());
    const calls: [string, () => Promise<unknown>][] = [
      ["end", () => ghost.end()],
      ["cancel", () => ghost.cancel()],
      ["facts", () => ghost.facts()],
      ["state", () => ghost.state()],
      ["evidence", () => ghost.evidence()],
      ["invocation", () => ghost.invocation("c1")],
    ];
    for (const [name, call] of calls) {
      const err = await refused(call(), "NOT_FOUND", 404);
      assert.equal(err.toolCallId, null, name);
    }
  });

  it("an unknown record is NOT_FOUND and an unsafe record id INVALID_INPUT", async () => {
    const run = await harness.createRun(runId());
    await refused(run.invocation("call-never-made"), "NOT_FOUND", 404);
    await refused(run.invocation("bad id"), "INVALID_INPUT", 400);
  });

  it("end returns the facts and ends the run", async () => {
    const id = runId();
    const run = await harness.createRun(id, { tools: ["search", "echo", "fail"] });
    const agent = run.agent();
    await agent.invoke("search", { q: "redis" }, { toolCallId: "call_1" });
    await refused(agent.invoke("fail", {}, { toolCallId: "call_2" }), "TOOL_EXECUTION_FAILED", 502);
    await agent.invoke("echo", { x: 1 }, { toolCallId: "call_3" });
    await agent.invoke("search", { q: "nothing" }, { toolCallId: "call_4" });

    const facts = await run.end();
    assert.equal(facts.runId, id);
    assert.deepEqual(
      facts.facts.map((f) => f.toolCallId),
      ["call_1", "call_3", "call_4"],
    );
    const [first, second, third] = facts.facts;
    assert.ok(first && second && third);
    assert.deepEqual(Object.keys(first).sort(), ["evidenceStatus", "result", "tool", "toolCallId"]);
    assert.equal(first.tool, "search");
    assert.equal(first.evidenceStatus, "EVIDENCE_FOUND");
    assert.equal((first.result as { total_items: number }).total_items, 7);
    assert.deepEqual(second.result, { item: { x: 1 } });
    assert.equal(third.evidenceStatus, "NO_EVIDENCE");
    assert.deepEqual([facts.excluded, facts.tampered], [1, 0]);

    assert.equal((await run.state()).state, "ENDED");
    assert.deepEqual(await run.end(), facts); // ending again answers the same facts
    assert.deepEqual(await run.facts(), facts);
    const err = await refused(
      agent.invoke("search", { q: "redis" }, { toolCallId: "call_5" }),
      "RUN_INACTIVE",
      409,
    );
    assert.equal(err.toolCallId, "call_5");
  });

  it("cancel returns the run view", async () => {
    const id = runId();
    const run = await harness.createRun(id);
    const view = await run.cancel();
    assert.equal(view.run_id, id);
    assert.equal(view.state, "CANCELLED");
    assert.equal((await run.cancel()).state, "CANCELLED");
    assert.deepEqual((await run.end()).facts, []);
    assert.equal((await run.state()).state, "CANCELLED");
    await refused(run.agent().invoke("echo", {}, { toolCallId: "c1" }), "RUN_INACTIVE", 409);
  });

  it("facts while the run is active", async () => {
    const id = runId();
    const run = await harness.createRun(id);
    const empty: Facts = { runId: id, facts: [], excluded: 0, tampered: 0 };
    assert.deepEqual(await run.facts(), empty);
    await run.agent().invoke("echo", { a: [1, 2] }, { toolCallId: "c1" });
    assert.deepEqual((await run.facts()).facts, [
      {
        toolCallId: "c1",
        tool: "echo",
        evidenceStatus: "EVIDENCE_FOUND",
        result: { item: { a: [1, 2] } },
      },
    ]);
    assert.equal((await run.state()).state, "ACTIVE");
  });

  it("invocation is the whole record, exactly as the server sends it", async () => {
    const id = runId();
    const run = await harness.createRun(id);
    await run.agent().invoke("search", { q: "redis" }, { toolCallId: "call_rec" });
    const record = await run.invocation("call_rec");
    assert.equal(record.run_id, id);
    assert.equal(record.tool_call_id, "call_rec");
    assert.deepEqual(
      [record.tool, record.status, record.evidence_status],
      ["search", "READY", "EVIDENCE_FOUND"],
    );
    assert.deepEqual(record.request, { q: "redis" });
    // The raw response: only the harness sees it.
    assert.equal((record.raw_response as { results: unknown[] }).results.length, 7);
    assert.equal((record.agent_result as { total_items: number }).total_items, 7);
    assert.ok((record.ttl_ms as number) > 0);
    assert.equal(record.toolCallId, undefined);
  });

  it("run.agent() needs an agentUrl", async () => {
    const plain = new Harness(sidecar.adminUrl, { adminToken: sidecar.adminToken });
    const run = await plain.createRun(runId());
    assert.throws(() => run.agent(), /agentUrl/);
    assert.equal(plain.agentUrl, null);
  });

  it("an agent from run.agent() is the agent of the run's token", async () => {
    const run = await harness.createRun(runId());
    const agent = run.agent();
    assert.ok(agent instanceof Agent);
    assert.equal(agent.runId, run.runId);
    assert.equal(agent.agentUrl, sidecar.agentUrl);
    const direct = new Agent(sidecar.agentUrl, run.runToken);
    assert.equal((await direct.invoke("echo", {}, { toolCallId: "c1" })).status, "READY");
  });

  it("base URLs may end with a slash", async () => {
    const slashed = new Harness(`${sidecar.adminUrl}/`, {
      adminToken: sidecar.adminToken,
      agentUrl: `${sidecar.agentUrl}//`,
    });
    assert.equal(slashed.adminUrl, sidecar.adminUrl);
    const run = await slashed.createRun(runId());
    assert.equal((await run.agent().invoke("echo", {}, { toolCallId: "c1" })).status, "READY");
  });

  it("logging, serializing and errors never show a token", async () => {
    const run = await harness.createRun(runId());
    const agent = run.agent();
    const err = await refused(agent.invoke("nope", {}, { toolCallId: "c1" }), "UNKNOWN_TOOL", 404);
    const shown = [
      inspect(harness),
      inspect(run),
      inspect(agent),
      JSON.stringify(harness),
      JSON.stringify(run),
      JSON.stringify(agent),
      String(err),
      err.stack,
      inspect(err),
      JSON.stringify(err),
    ].join(" ");
    assert.ok(inspect(run).includes(run.runId) && inspect(agent).includes(run.runId));
    const mac = run.runToken.slice(run.runToken.lastIndexOf(".") + 1);
    assert.ok(!shown.includes(mac));
    assert.ok(!shown.includes(sidecar.adminToken));
  });
});

// --- Agent -------------------------------------------------------------------------------------

describe("Agent", () => {
  it("takes the run id from the token", () => {
    assert.equal(new Agent(sidecar.agentUrl, "run-1.abc").runId, "run-1");
    assert.equal(new Agent(sidecar.agentUrl, "run.v2.abc").runId, "run.v2");
    for (const token of ["no-dot-secret", ".secret", "run-1."]) {
      assert.throws(
        () => new Agent(sidecar.agentUrl, token),
        (err: unknown) => err instanceof TypeError && !err.message.includes(token),
      );
    }
  });

  it("tools() lists the run's read-only tools", async () => {
    const run = await harness.createRun(runId(), {
      tools: ["search", "echo", "write_note", "not-configured"],
    });
    const tools = await run.agent().tools();
    assert.deepEqual(tools.map((t) => t.name).sort(), ["echo", "search"]);
    const search = tools.find((t) => t.name === "search");
    assert.deepEqual(search, {
      name: "search",
      description: "Search the sample index.",
      inputSchema: {
        type: "object",
        required: ["q"],
        properties: { q: { type: "string", maxLength: 512 } },
      },
    });
    assert.deepEqual(tools.find((t) => t.name === "echo")?.inputSchema, { type: "object" });
  });

  it("tools() of a run without a tool list", async () => {
    const tools = await (await harness.createRun(runId())).agent().tools();
    assert.deepEqual(tools.map((t) => t.name).sort(), [
      "big",
      "echo",
      "fail",
      "read_file",
      "search",
      "slow",
    ]);
  });

  it("invoke() returns the projected result", async () => {
    const agent = (await harness.createRun(runId())).agent();
    const r = await agent.invoke("search", { q: "redis" }, { toolCallId: "call_abc" });
    assert.deepEqual(
      [r.status, r.toolCallId, r.evidenceStatus],
      ["READY", "call_abc", "EVIDENCE_FOUND"],
    );
    const result = r.result as { total_items: number; items: Record<string, unknown>[] };
    assert.equal(result.total_items, 7);
    assert.equal(result.items.length, 5);
    assert.deepEqual(Object.keys(result.items[0] ?? {}).sort(), ["snippet", "title", "url"]);
  });

  it("an id with a colon works end to end", async () => {
    const run = await harness.createRun(runId());
    const id = "functions.search:0";
    const r = await run.agent().invoke("echo", { k: "v" }, { toolCallId: id });
    assert.equal(r.toolCallId, id);
    assert.equal((await run.invocation(id)).tool_call_id, id);
    assert.deepEqual(
      (await run.facts()).facts.map((f) => f.toolCallId),
      [id],
    );
  });

  it("a bad run token is UNAUTHENTICATED", async () => {
    const id = runId();
    await harness.createRun(id);
    const agent = new Agent(sidecar.agentUrl, `${id}.forged-mac`);
    const err = await refused(
      agent.invoke("echo", {}, { toolCallId: "c1" }),
      "UNAUTHENTICATED",
      401,
    );
    assert.equal(err.toolCallId, "c1"); // a safe id is echoed even before it is checked
    await refused(agent.tools(), "UNAUTHENTICATED", 401);
  });

  const preflight: [string, Record<string, unknown>, string[] | undefined, string, number][] = [
    ["search", { q: 5 }, undefined, "INVALID_INPUT", 400],
    ["search", {}, undefined, "INVALID_INPUT", 400],
    ["read_file", { path: "" }, undefined, "INVALID_INPUT", 400],
    ["nope", {}, undefined, "UNKNOWN_TOOL", 404],
    ["echo", {}, ["search"], "UNAUTHORIZED", 403],
    ["write_note", { text: "x" }, undefined, "TOOL_NOT_READ_ONLY", 403],
    ["read_file", { path: "/etc/passwd" }, undefined, "POLICY_DENIED", 403],
    ["read_file", { path: "../etc/passwd" }, undefined, "POLICY_DENIED", 403],
  ];
  for (const [tool, input, tools, code, status] of preflight) {
    it(`preflight: ${tool} ${JSON.stringify(input)} is ${code}`, async () => {
      const run = await harness.createRun(runId(), tools === undefined ? {} : { tools });
      const err = await refused(
        run.agent().invoke(tool, input, { toolCallId: "call_pre" }),
        code,
        status,
      );
      assert.equal(err.toolCallId, "call_pre");
      // A refused call leaves no record and spends no budget.
      assert.equal((await run.state()).calls_used, 0);
      await refused(run.invocation("call_pre"), "NOT_FOUND", 404);
    });
  }

  it("a path inside the workspace is forwarded canonical", async () => {
    const run = await harness.createRun(runId(), { workspace: "/srv/work" });
    const r = await run
      .agent()
      .invoke("read_file", { path: "notes/./a.txt" }, { toolCallId: "c1" });
    assert.deepEqual(r.result, { item: { path: "/srv/work/notes/a.txt" } });
  });

  it("an unsafe tool call id is INVALID_TOOL_CALL_ID", async () => {
    const agent = (await harness.createRun(runId())).agent();
    for (const bad of ["bad id", "", "-leading-dash", "x".repeat(129)]) {
      const err = await refused(
        agent.invoke("echo", {}, { toolCallId: bad }),
        "INVALID_TOOL_CALL_ID",
        400,
      );
      assert.equal(err.toolCallId, null);
    }
  });

  it("another run's id in the envelope is RUN_MISMATCH", async () => {
    const other = await harness.createRun(runId());
    const agent = (await harness.createRun(runId())).agent();
    // The client always sends its token's run; reach past it to send another run's id.
    (agent as { runId: string }).runId = other.runId;
    await refused(agent.invoke("echo", {}, { toolCallId: "c1" }), "RUN_MISMATCH", 403);
  });

  it("a second call with the same id is DUPLICATE_TOOL_CALL", async () => {
    const run = await harness.createRun(runId());
    const agent = run.agent();
    const first = await agent.invoke("echo", { n: 1 }, { toolCallId: "call_dup" });
    const err = await refused(
      agent.invoke("echo", { n: 2 }, { toolCallId: "call_dup" }),
      "DUPLICATE_TOOL_CALL",
      409,
    );
    assert.equal(err.toolCallId, "call_dup");
    assert.deepEqual((await run.invocation("call_dup")).request, { n: 1 }); // first record untouched
    assert.deepEqual(
      (await run.facts()).facts.map((f) => f.result),
      [first.result],
    );
  });

  it("an error is not retried, and its retry is a duplicate", async () => {
    const run = await harness.createRun(runId());
    const agent = run.agent();
    await refused(agent.invoke("fail", {}, { toolCallId: "call_f" }), "TOOL_EXECUTION_FAILED", 502);
    assert.equal((await run.state()).calls_used, 1); // one request reached the tool
    await refused(agent.invoke("fail", {}, { toolCallId: "call_f" }), "DUPLICATE_TOOL_CALL", 409);
  });

  it("the run's call budget is BUDGET_EXHAUSTED", async () => {
    const agent = (await harness.createRun(runId(), { budget: { maxCalls: 1 } })).agent();
    await agent.invoke("echo", {}, { toolCallId: "c1" });
    const err = await refused(
      agent.invoke("echo", {}, { toolCallId: "c2" }),
      "BUDGET_EXHAUSTED",
      429,
    );
    assert.equal(err.toolCallId, "c2");
  });

  it("a tool's call budget is BUDGET_EXHAUSTED for that tool only", async () => {
    const run = await harness.createRun(runId(), { budget: { maxCallsPerTool: { echo: 1 } } });
    const agent = run.agent();
    await agent.invoke("echo", {}, { toolCallId: "c1" });
    await refused(agent.invoke("echo", {}, { toolCallId: "c2" }), "BUDGET_EXHAUSTED", 429);
    assert.equal((await agent.invoke("search", { q: "x" }, { toolCallId: "c3" })).status, "READY");
  });

  for (const [tool, code, status] of [
    ["fail", "TOOL_EXECUTION_FAILED", 502],
    ["slow", "TOOL_TIMEOUT", 504],
    ["big", "RESULT_TOO_LARGE", 502],
  ] as const) {
    it(`an upstream failure: ${tool} is ${code}`, async () => {
      const run = await harness.createRun(runId());
      const err = await refused(
        run.agent().invoke(tool, {}, { toolCallId: "call_up" }),
        code,
        status,
      );
      assert.equal(err.toolCallId, "call_up");
      const record = await run.invocation("call_up");
      assert.deepEqual([record.status, record.error_code], ["ERROR", code]);
      assert.equal((await run.facts()).excluded, 1);
    });
  }

  it("a closed port is TRANSPORT_ERROR", async () => {
    const url = `http://127.0.0.1:${await freePort()}`;
    const id = runId();
    const agent = new Agent(url, `${id}.secret-mac`);
    const err = await refused(
      agent.invoke("echo", {}, { toolCallId: "c1" }),
      "TRANSPORT_ERROR",
      null,
    );
    assert.equal(err.toolCallId, "c1");
    assert.equal(err.message, "Could not connect to toolgate.");
    const shown = `${err} ${err.stack} ${inspect(err)}`;
    assert.ok(!shown.includes("secret-mac") && !String(err).includes("127.0.0.1"));
    await refused(agent.tools(), "TRANSPORT_ERROR", null);

    const h = new Harness(url, { adminToken: "admin-secret" });
    const adminErr = await refused(h.createRun(id), "TRANSPORT_ERROR", null);
    assert.equal(adminErr.toolCallId, null);
    assert.ok(!`${adminErr} ${adminErr.stack} ${inspect(adminErr)}`.includes("admin-secret"));
  });

  it("a connection broken off is TRANSPORT_ERROR naming only the kind of failure", async () => {
    const server = createServer((req) => req.socket.destroy());
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const { port } = server.address() as AddressInfo;
    try {
      const agent = new Agent(`http://127.0.0.1:${port}`, "run-1.secret-mac");
      const err = await refused(
        agent.invoke("echo", {}, { toolCallId: "c1" }),
        "TRANSPORT_ERROR",
        null,
      );
      assert.match(err.message, /^The request to toolgate failed \([A-Za-z_]+\)\.$/);
      assert.equal(err.toolCallId, "c1");
    } finally {
      await new Promise((resolve) => server.close(resolve));
    }
  });

  it("a timeout is TRANSPORT_ERROR, and the call still ran", async () => {
    const run = await harness.createRun(runId());
    const agent = new Agent(sidecar.agentUrl, run.runToken, { timeoutMs: 100 });
    const err = await refused(
      agent.invoke("slow", {}, { toolCallId: "call_slow" }),
      "TRANSPORT_ERROR",
      null,
    );
    assert.equal(err.toolCallId, "call_slow");
    assert.equal(err.message, "toolgate did not answer in time.");
    // The call reached toolgate and goes on there: its record appears for the harness to read.
    const deadline = Date.now() + 10_000;
    for (;;) {
      try {
        const record = await run.invocation("call_slow");
        assert.equal(record.tool_call_id, "call_slow");
        break;
      } catch (e) {
        if (!(e instanceof ToolgateError) || e.code !== "NOT_FOUND" || Date.now() > deadline) {
          throw e;
        }
      }
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  });
});

// --- ToolgateError -----------------------------------------------------------------------------

describe("ToolgateError", () => {
  it("is an Error with a code, a status, a sentence and a tool call id", () => {
    const err = new ToolgateError("DUPLICATE_TOOL_CALL", "The run already has this tool call id.", {
      httpStatus: 409,
      toolCallId: "call_1",
    });
    assert.ok(err instanceof Error);
    assert.equal(err.name, "ToolgateError");
    assert.equal(err.message, "The run already has this tool call id.");
    assert.equal(String(err), "DUPLICATE_TOOL_CALL: The run already has this tool call id.");
    assert.equal(`${err}`, String(err));
    assert.deepEqual(
      [err.code, err.httpStatus, err.toolCallId],
      ["DUPLICATE_TOOL_CALL", 409, "call_1"],
    );
    assert.ok(err.stack?.startsWith("ToolgateError [DUPLICATE_TOOL_CALL]: The run already"));
    const bare = new ToolgateError("TRANSPORT_ERROR", "Could not connect to toolgate.");
    assert.deepEqual([bare.httpStatus, bare.toolCallId], [null, null]);
  });
});

// --- answers that are not toolgate's -----------------------------------------------------------

interface Seen {
  method: string;
  path: string;
  headers: IncomingHttpHeaders;
  body: string;
}

/** A local HTTP server answering every request with `status` and `body`; it records what came. */
async function stub(
  status: number,
  body: string,
): Promise<{ url: string; seen: Seen[]; close(): Promise<void> }> {
  const seen: Seen[] = [];
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (chunk: Buffer) => chunks.push(chunk));
    req.on("end", () => {
      seen.push({
        method: req.method ?? "",
        path: req.url ?? "",
        headers: req.headers,
        body: Buffer.concat(chunks).toString(),
      });
      res.writeHead(status, { "content-type": "text/plain" }).end(body);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    seen,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

describe("answers that are not toolgate's", () => {
  const cases: [number, string][] = [
    [502, "<html>Bad Gateway</html>"],
    [404, '{"detail": "Not Found"}'],
    [409, '{"status": "ERROR", "tool_call_id": 5, "error": {"code": "X", "message": "y"}}'],
    [200, "not json"],
    [200, '{"status": "ERROR"}'],
    [200, '{"status": "READY", "tool_call_id": "c1", "evidence_status": "NO_EVIDENCE"}'],
    [200, "[]"],
    [302, ""],
  ];
  for (const [status, body] of cases) {
    it(`${status} ${body || "(empty)"} is UNEXPECTED_RESPONSE`, async () => {
      const server = await stub(status, body);
      try {
        const agent = new Agent(`${server.url}/`, "run-1.mac");
        const err = await refused(
          agent.invoke("echo", { a: 1 }, { toolCallId: "c1" }),
          "UNEXPECTED_RESPONSE",
          status,
        );
        assert.equal(err.toolCallId, "c1");
        assert.ok(!`${err} ${err.stack}`.includes("Bad Gateway"));
        assert.equal(server.seen.length, 1); // never retried, never redirected
        const [request] = server.seen;
        assert.deepEqual([request?.method, request?.path], ["POST", "/v1/invoke"]);
        assert.equal(request?.headers.authorization, "Bearer run-1.mac");
        assert.equal(request?.headers["content-type"], "application/json");
        assert.deepEqual(JSON.parse(request?.body ?? ""), {
          run_id: "run-1",
          tool_call_id: "c1",
          tool: "echo",
          input: { a: 1 },
        });
      } finally {
        await server.close();
      }
    });
  }

  it("every admin answer is checked for its shape", async () => {
    const server = await stub(200, '{"run_id": "r"}');
    try {
      const h = new Harness(server.url, { adminToken: "a" });
      await refused(h.createRun("r"), "UNEXPECTED_RESPONSE", 200);
      const run = new Run(h, "r", "r.m", new Date());
      await refused(run.end(), "UNEXPECTED_RESPONSE", 200);
      await refused(run.facts(), "UNEXPECTED_RESPONSE", 200);
      const tools = new Agent(server.url, "r.m").tools();
      await refused(tools, "UNEXPECTED_RESPONSE", 200);
    } finally {
      await server.close();
    }
  });

  it("an impossible deadline is UNEXPECTED_RESPONSE", async () => {
    const server = await stub(
      201,
      '{"run_id": "r", "run_token": "r.m", "deadline": "2026-02-30T22:13:04.123Z"}',
    );
    try {
      const h = new Harness(server.url, { adminToken: "a" });
      await refused(h.createRun("r"), "UNEXPECTED_RESPONSE", 201);
    } finally {
      await server.close();
    }
  });

  it("path segments are percent-encoded", async () => {
    const created = '{"run_id": "r", "run_token": "r.m", "deadline": "2026-11-29T22:13:04.123Z"}';
    const server = await stub(201, created);
    try {
      const h = new Harness(server.url, { adminToken: "a" });
      const run = await h.createRun("r");
      assert.equal(run.deadline.toISOString(), "2026-11-29T22:13:04.123Z");
      await run.invocation("functions.search:0/x y");
      assert.equal(server.seen[1]?.path, "/v1/runs/r/invocations/functions.search%3A0%2Fx%20y");
      assert.equal(server.seen[1]?.headers.authorization, "Bearer a");
      assert.deepEqual(JSON.parse(server.seen[0]?.body ?? ""), { run_id: "r" });
    } finally {
      await server.close();
    }
  });

  it("evidence() is GET /v1/runs/{run_id}/evidence, answered as sent", async () => {
    const bundle = {
      payload: "eyJ0eXAiOiJ0b29sZ2F0ZS5ldmlkZW5jZS52MSJ9",
      signatures: [{ protected: "eyJhbGciOiJFZERTQSJ9", signature: "c2ln" }],
    };
    const server = await stub(200, JSON.stringify(bundle));
    try {
      const run = new Run(new Harness(server.url, { adminToken: "a" }), "run 1", "x.m", new Date());
      assert.deepEqual(await run.evidence(), bundle);
      assert.deepEqual(
        [server.seen[0]?.method, server.seen[0]?.path, server.seen[0]?.headers.authorization],
        ["GET", "/v1/runs/run%201/evidence", "Bearer a"],
      );
    } finally {
      await server.close();
    }
  });
});
