// The README's examples, run exactly as pasted, against `toolgate demo`.
//
// Every ```js block right after an `<!-- example: NAME -->` comment in README.md is a complete
// script for the demo sidecar (agent 127.0.0.1:15001, admin 127.0.0.1:15002, admin token
// `demo-admin-token`), saved as `NAME.mjs` and run with `node`, as the README tells a reader to.
// Each one runs twice (a second paste must work too: every run gets a fresh id), and must exit 0,
// print the model's own tool call ids where the README says they show (what the model read back,
// the facts, the record), and print exactly what the README's "It prints:" block after it shows.
//
// The scripts import `@toolgate/client` by name, as a reader's project does. They run in a
// directory under build/ with a package.json of its own (so the package's own name does not
// resolve to itself, through dist/) and a node_modules/@toolgate/client whose exports point at
// build/src, the sources `npm test` has just compiled; every other import (`ai`, `@openai/agents`,
// `jose`) resolves to the package's node_modules, as installed by `npm ci`.
//
// The demo listens on fixed ports (15001, 15002, 15090): they must be free. The binary is
// TOOLGATE_BIN, else the debug build (`cargo build --bin toolgate` at the repository root).

import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import {
  closeSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readFileSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { createServer } from "node:net";
import { dirname, join } from "node:path";
import { after, before, describe, it } from "node:test";
import { fileURLToPath } from "node:url";

/** The package's root: build/test/readme.test.js is two levels below it. */
const PACKAGE = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const README = join(PACKAGE, "README.md");
const ADMIN_URL = "http://127.0.0.1:15002";
/** The demo's listeners: agent, admin, telemetry (the last on every interface). */
const DEMO_PORTS: [string, number][] = [
  ["127.0.0.1", 15001],
  ["127.0.0.1", 15002],
  ["0.0.0.0", 15090],
];
const READY_MS = 60_000;
const RUN_MS = 120_000;

// A marked block: the comment, then a fence right after it (```js: what Node runs as pasted);
// optionally followed by "It prints:" and a ```text block with its output.
const EXAMPLE =
  /^<!-- example: ([a-z0-9-]+) -->\n```(\w*)\n(.*?)^```\n(?:\nIt prints:\n\n```text\n(.*?)^```$)?/gms;
const MARKER = /^<!-- example: /gm;

/** What each example must print: its ids, where the README says they show. */
const EXPECTED: Record<string, string[]> = {
  core: [
    "tools: [ 'search' ]",
    "READY EVIDENCE_FOUND 5",
    "refused: DUPLICATE_TOOL_CALL 409 call_1",
    "facts: [ [ 'call_1', 'search' ] ] excluded: 0",
    "record: call_1 READY { q: 'redis' }",
  ],
  evidence: [
    "true ENDED 0",
    "1 call_1 search EVIDENCE_FOUND",
    "signed by the signing key: true",
    "invalid: fact 1 (call_1): the record's raw_response does not match raw_sha256",
  ],
  ai: [
    'call_ai_search: {"type":"json","value":{"items":[{"title":"redis result 1"',
    'call_ai_log: {"type":"error-text","value":"RESULT_TOO_LARGE: ',
    "answer: Redis it is.",
    "facts: [ [ 'call_ai_search', 'search' ] ] excluded: 1",
    "record: call_ai_search READY { q: 'redis' }",
  ],
  "openai-agents": [
    'call_oa_search: {"items":[{"title":"redis result 1"',
    "call_oa_log: RESULT_TOO_LARGE: ",
    "answer: Redis it is.",
    "facts: [ [ 'call_oa_search', 'search' ] ] excluded: 1",
    "record: call_oa_search READY { q: 'redis' }",
  ],
};

/** The ids each example's model (or, for the core and the evidence, its caller) gives its calls. */
const IDS: Record<string, string[]> = {
  core: ["call_1"],
  evidence: ["call_1"],
  ai: ["call_ai_search", "call_ai_log"],
  "openai-agents": ["call_oa_search", "call_oa_log"],
};

interface Example {
  code: string;
  /** The README's "It prints:" block after the example, if it has one. */
  prints: string | null;
}

/** The README's marked examples by name, each exactly as a reader would copy it. */
function examples(): Map<string, Example> {
  const readme = readFileSync(README, "utf8");
  const found = new Map<string, Example>();
  for (const m of readme.matchAll(EXAMPLE)) {
    const [, name, lang, code, prints] = m;
    assert.ok(name !== undefined && code !== undefined);
    assert.equal(
      lang,
      "js",
      `the README example ${name} is \`\`\`${lang}: Node runs \`\`\`js as pasted`,
    );
    assert.ok(!found.has(name), `two README examples are marked ${name}`);
    found.set(name, { code, prints: prints ?? null });
  }
  const markers = [...readme.matchAll(MARKER)].length;
  assert.equal(markers, found.size, "an `<!-- example: NAME -->` comment not right above a fence");
  return found;
}

/** Whether a listener holds the port (libuv binds with SO_REUSEADDR, as toolgate does: the
 * connections the last run left in TIME_WAIT do not count). */
function taken(host: string, port: number): Promise<boolean> {
  const server = createServer();
  return new Promise((resolve) => {
    server.once("error", () => resolve(true));
    server.listen({ host, port, exclusive: true }, () => server.close(() => resolve(false)));
  });
}

function exited(proc: ChildProcess): Promise<void> {
  return new Promise((resolve) => {
    if (proc.exitCode !== null || proc.signalCode !== null) {
      resolve();
    } else {
      proc.once("exit", () => resolve());
    }
  });
}

async function stopProcess(proc: ChildProcess): Promise<void> {
  if (proc.exitCode !== null || proc.signalCode !== null) {
    return;
  }
  const done = exited(proc);
  proc.kill("SIGTERM");
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<"late">((resolve) => {
    timer = setTimeout(() => resolve("late"), 15_000);
  });
  if ((await Promise.race([done, late])) === "late") {
    proc.kill("SIGKILL");
    await done;
  }
  clearTimeout(timer);
}

/** The repository root: the nearest directory above the package holding Cargo.toml. */
function repoRoot(): string {
  for (let dir = PACKAGE; ; ) {
    if (existsSync(join(dir, "Cargo.toml"))) {
      return dir;
    }
    const up = dirname(dir);
    if (up === dir) {
      throw new Error("no Cargo.toml above the package: run the tests inside the checkout");
    }
    dir = up;
  }
}

/** `toolgate demo` on its fixed ports, with the README's admin token, once it answers. */
async function startDemo(workdir: string): Promise<ChildProcess> {
  const busy: string[] = [];
  for (const [host, port] of DEMO_PORTS) {
    if (await taken(host, port)) {
      busy.push(`${host}:${port}`);
    }
  }
  if (busy.length > 0) {
    throw new Error(
      `toolgate demo needs ${busy.join(", ")}, which something else listens on ` +
        "(another `toolgate demo`?): stop it and run the tests again",
    );
  }
  const toolgate = process.env.TOOLGATE_BIN || join(repoRoot(), "target/debug/toolgate");
  if (!existsSync(toolgate)) {
    throw new Error(
      `${toolgate} is missing: run \`cargo build --bin toolgate\` at the repository root, ` +
        "or set TOOLGATE_BIN",
    );
  }
  const log = join(workdir, "toolgate-demo.log");
  const out = openSync(log, "w");
  const proc = spawn(toolgate, ["demo"], {
    cwd: repoRoot(),
    stdio: ["ignore", out, out],
    env: { ...process.env, TOOLGATE_ADMIN_TOKEN: "demo-admin-token", TOOLGATE_LOG: "warn" },
  });
  closeSync(out);
  const deadline = Date.now() + READY_MS;
  for (;;) {
    if (proc.exitCode !== null || proc.signalCode !== null) {
      throw new Error(
        `toolgate demo exited with ${proc.exitCode ?? proc.signalCode}:\n${readFileSync(log, "utf8")}`,
      );
    }
    try {
      // Any answer (a 401 without a token): the admin listener serves.
      const response = await fetch(ADMIN_URL, { signal: AbortSignal.timeout(2000) });
      await response.arrayBuffer();
      return proc;
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) {
      await stopProcess(proc);
      throw new Error(`toolgate demo did not answer on ${ADMIN_URL} within ${READY_MS} ms`);
    }
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

/**
 * The directory the examples run in: a project of its own under build/, whose
 * node_modules/@toolgate/client is the package as compiled to build/src.
 */
function project(): string {
  const dir = mkdtempSync(join(PACKAGE, "build", "readme-"));
  writeFileSync(join(dir, "package.json"), '{ "private": true, "type": "module" }\n');
  const client = join(dir, "node_modules", "@toolgate", "client");
  mkdirSync(client, { recursive: true });
  const manifest = JSON.parse(readFileSync(join(PACKAGE, "package.json"), "utf8"));
  const { name, version, type, exports } = manifest;
  writeFileSync(join(client, "package.json"), JSON.stringify({ name, version, type, exports }));
  // The exports map names ./dist/*.js: here dist is the test build of src/.
  symlinkSync(join(PACKAGE, "build", "src"), join(client, "dist"), "dir");
  return dir;
}

interface Done {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
}

/** Runs `node script` in `cwd` to its end (killed after RUN_MS), as a reader would. */
function runNode(script: string, cwd: string): Promise<Done> {
  // No trace export, whatever the calling environment says: nothing leaves the host. And no
  // trace of this test runner: the script is not one of its tests.
  const env: NodeJS.ProcessEnv = { ...process.env, OPENAI_AGENTS_DISABLE_TRACING: "1" };
  delete env.NODE_TEST_CONTEXT;
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [script], {
      cwd,
      stdio: ["ignore", "pipe", "pipe"],
      env,
    });
    const stdout: Buffer[] = [];
    const stderr: Buffer[] = [];
    child.stdout.on("data", (chunk: Buffer) => stdout.push(chunk));
    child.stderr.on("data", (chunk: Buffer) => stderr.push(chunk));
    const timer = setTimeout(() => child.kill("SIGKILL"), RUN_MS);
    child.once("error", (err) => {
      clearTimeout(timer);
      reject(err);
    });
    child.once("close", (code, signal) => {
      clearTimeout(timer);
      resolve({
        code,
        signal,
        stdout: Buffer.concat(stdout).toString("utf8"),
        stderr: Buffer.concat(stderr).toString("utf8"),
      });
    });
  });
}

describe("README examples", () => {
  const workdir = project();
  let demo: ChildProcess | undefined;

  before(async () => {
    demo = await startDemo(workdir);
  });

  after(async () => {
    if (demo !== undefined) {
      await stopProcess(demo);
    }
    rmSync(workdir, { recursive: true, force: true });
  });

  it("marks every example this test runs, and no other", () => {
    const found = [...examples().keys()].sort();
    const missing = Object.keys(EXPECTED).filter((name) => !found.includes(name));
    assert.deepEqual(missing, [], "README.md has no `<!-- example: NAME -->` ```js block for them");
    assert.deepEqual(
      found,
      Object.keys(EXPECTED).sort(),
      "a README example this test does not run",
    );
  });

  for (const name of Object.keys(EXPECTED)) {
    it(`runs the ${name} example as pasted, twice`, { timeout: 4 * RUN_MS }, async () => {
      const example = examples().get(name);
      assert.ok(example !== undefined, `README.md has no \`<!-- example: ${name} -->\` block`);
      for (const id of IDS[name] ?? []) {
        assert.ok(
          example.code.includes(`"${id}"`),
          `the ${name} example does not make the call ${id}`,
        );
      }
      const script = join(workdir, `${name}.mjs`);
      writeFileSync(script, example.code);
      // Pasted twice: the second run gets a new run id and works the same.
      for (const paste of [1, 2]) {
        const done = await runNode(script, workdir);
        const output = `stdout:\n${done.stdout}\nstderr:\n${done.stderr}`;
        assert.equal(
          done.code,
          0,
          `paste ${paste} exited ${done.code ?? done.signal} (README example ${name}):\n${output}`,
        );
        for (const line of EXPECTED[name] ?? []) {
          assert.ok(done.stdout.includes(line), `paste ${paste} did not print ${line}:\n${output}`);
        }
        for (const id of IDS[name] ?? []) {
          assert.ok(done.stdout.includes(id), `paste ${paste} did not print ${id}:\n${output}`);
        }
        if (example.prints !== null) {
          assert.equal(done.stdout, example.prints, `paste ${paste}: not what the README prints`);
        }
      }
    });
  }
});
