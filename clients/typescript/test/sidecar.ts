// The SDK tests' sidecar: a real `toolgate serve` on the memory store, with the integration
// tests' fake tool behind it, all on free loopback ports.
//
// The binaries come from the repository's debug build (`cargo build --bin toolgate --example
// fake_tool` at its root); TOOLGATE_BIN and FAKE_TOOL_BIN name others. A missing binary fails
// the test with the command that builds it: nothing here is ever skipped.

import { type ChildProcess, spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { closeSync, existsSync, mkdtempSync, openSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

/** The admin token every test sidecar is started with. */
export const ADMIN_TOKEN = "sdk-test-admin-token";

const READY_MS = 60_000;
const BUILD = "cargo build --bin toolgate --example fake_tool";

// The tools every SDK test may use (the Python SDK's tests use the same set). The fake tool's
// routes: /scenario/search answers search results, /scenario/fail HTTP 500, /scenario/slow after
// 3 s, /scenario/big about 2 MiB, /echo what it was sent.
const toolsYaml = (tool: string): string => `tools:
  - name: search
    description: Search the sample index.
    upstream: ${tool}/scenario/search
    read_only: true
    timeout_ms: 5000
    input_schema: {type: object, required: [q], properties: {q: {type: string, maxLength: 512}}}
    projection: {select: /results, max_items: 5, fields: [title, url, snippet]}
  - name: echo
    description: Echo the input.
    upstream: ${tool}/echo
    read_only: true
    projection: {select: /results/input}
  - name: fail
    description: Always fails upstream.
    upstream: ${tool}/scenario/fail
    read_only: true
  - name: slow
    description: Answers after its timeout.
    upstream: ${tool}/scenario/slow
    read_only: true
    timeout_ms: 500
  - name: big
    description: Answers more than raw_bytes.
    upstream: ${tool}/scenario/big
    read_only: true
  - name: read_file
    description: Read a file of the workspace.
    upstream: ${tool}/echo
    read_only: true
    input_schema: {type: object, required: [path], properties: {path: {type: string}}}
    projection: {select: /results/input}
    params: {/path: path}
  - name: write_note
    description: Writes, so toolgate refuses it.
    upstream: ${tool}/echo
    read_only: false
`;

/** A running toolgate: its listeners' base URLs, its admin token, and how to stop it. */
export interface Sidecar {
  agentUrl: string;
  adminUrl: string;
  telemetryUrl: string;
  adminToken: string;
  /** The directory holding the config and the logs (removed by `stop()`). */
  workdir: string;
  /** Stops toolgate and the fake tool and removes the work directory. */
  stop(): Promise<void>;
}

/** A fresh safe id (run ids and tool call ids alike). */
export function newId(prefix = "t"): string {
  return `${prefix}-${randomUUID().replaceAll("-", "").slice(0, 16)}`;
}

/** The repository root: the nearest directory above this file holding Cargo.toml. */
function repoRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (;;) {
    if (existsSync(join(dir, "Cargo.toml"))) {
      return dir;
    }
    const up = dirname(dir);
    if (up === dir) {
      throw new Error("no Cargo.toml above the test directory: run the tests inside the checkout");
    }
    dir = up;
  }
}

function binary(env: string, relative: string): string {
  const path = process.env[env] || join(repoRoot(), relative);
  if (!existsSync(path)) {
    throw new Error(`${path} is missing: run \`${BUILD}\` at the repository root, or set ${env}`);
  }
  return path;
}

/** A TCP port that was free on 127.0.0.1 a moment ago. */
export async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, "127.0.0.1", resolve);
  });
  const address = server.address();
  await new Promise<void>((resolve) => server.close(() => resolve()));
  if (address === null || typeof address === "string") {
    throw new Error("no port");
  }
  return address.port;
}

async function distinctFreePorts(n: number): Promise<number[]> {
  const ports = new Set<number>();
  while (ports.size < n) {
    ports.add(await freePort());
  }
  return [...ports];
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

/** The first stdout line of a helper that prints its base URL once it serves. */
function firstLine(proc: ChildProcess, what: string): Promise<string> {
  const stdout = proc.stdout;
  if (stdout === null) {
    return Promise.reject(new Error(`${what} has no stdout`));
  }
  return new Promise((resolve, reject) => {
    const lines = createInterface({ input: stdout });
    const timer = setTimeout(() => fail(`${what} printed nothing within ${READY_MS} ms`), READY_MS);
    const onExit = (code: number | null): void =>
      fail(`${what} exited with ${code} before it served`);
    function fail(message: string): void {
      clearTimeout(timer);
      lines.close();
      reject(new Error(message));
    }
    proc.once("exit", onExit);
    proc.once("error", (err) => fail(`${what} did not start: ${err.message}`));
    lines.once("line", (line) => {
      clearTimeout(timer);
      proc.off("exit", onExit);
      lines.close();
      // Keep draining stdout so the helper never blocks on a full pipe.
      stdout.resume();
      resolve(line.trim());
    });
  });
}

async function waitReady(proc: ChildProcess, telemetryUrl: string, log: string): Promise<void> {
  const deadline = Date.now() + READY_MS;
  for (;;) {
    if (proc.exitCode !== null || proc.signalCode !== null) {
      throw new Error(`toolgate exited with ${proc.exitCode ?? proc.signalCode}; see ${log}`);
    }
    try {
      const response = await fetch(`${telemetryUrl}/readyz`, { signal: AbortSignal.timeout(2000) });
      await response.arrayBuffer();
      if (response.status === 200) {
        return;
      }
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) {
      throw new Error(`toolgate not ready within ${READY_MS} ms; see ${log}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/**
 * Starts the fake tool and `toolgate serve` on the memory store, and waits until toolgate is
 * ready. Call `stop()` when done (in an `after` hook).
 */
export async function startSidecar(): Promise<Sidecar> {
  const toolgate = binary("TOOLGATE_BIN", "target/debug/toolgate");
  const fakeTool = binary("FAKE_TOOL_BIN", "target/debug/examples/fake_tool");
  const workdir = mkdtempSync(join(tmpdir(), "toolgate-sdk-ts-"));
  const procs: ChildProcess[] = [];
  const stop = async (): Promise<void> => {
    await Promise.all(procs.map(stopProcess));
    rmSync(workdir, { recursive: true, force: true });
  };
  try {
    const toolLog = openSync(join(workdir, "fake_tool.log"), "w");
    const tool = spawn(fakeTool, ["--listen", "127.0.0.1:0"], {
      stdio: ["ignore", "pipe", toolLog],
    });
    closeSync(toolLog);
    procs.push(tool);
    const toolUrl = await firstLine(tool, "fake_tool");

    const [agent, admin, telemetry] = await distinctFreePorts(3);
    const config = join(workdir, "toolgate.yaml");
    writeFileSync(
      config,
      `listen: {agent: "127.0.0.1:${agent}", admin: "127.0.0.1:${admin}", telemetry: "127.0.0.1:${telemetry}"}\n` +
        "store: {kind: memory, key_prefix: toolgate, record_ttl_ms: 3600000}\n" +
        "limits: {request_bytes: 65536, raw_bytes: 1048576, agent_bytes: 16384, record_bytes: 1179648}\n" +
        "runs: {default_timeout_ms: 600000, max_timeout_ms: 3600000, default_max_calls: 100}\n" +
        toolsYaml(toolUrl),
    );
    const log = join(workdir, "toolgate.log");
    const out = openSync(log, "w");
    const proc = spawn(toolgate, ["serve", "--config", config], {
      stdio: ["ignore", out, out],
      env: { ...process.env, TOOLGATE_ADMIN_TOKEN: ADMIN_TOKEN, TOOLGATE_LOG: "warn" },
    });
    closeSync(out);
    procs.push(proc);
    const telemetryUrl = `http://127.0.0.1:${telemetry}`;
    await waitReady(proc, telemetryUrl, log);
    return {
      agentUrl: `http://127.0.0.1:${agent}`,
      adminUrl: `http://127.0.0.1:${admin}`,
      telemetryUrl,
      adminToken: ADMIN_TOKEN,
      workdir,
      stop,
    };
  } catch (err) {
    // Keep the work directory (and its log) for a failed start: the error names the log.
    await Promise.all(procs.map(stopProcess));
    throw err;
  }
}
