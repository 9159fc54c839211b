// The official TypeScript MCP client (@modelcontextprotocol/sdk 1.x) against an MCP endpoint, for
// tests/integration/mcp/. Same command line and output as client.py:
//
//     node client.mjs URL TOKEN MODE RUN_ID CALLS
//
// MODE must be `legacy`: the 1.x client only knows the `initialize` handshake. CALLS is a JSON
// list of {"name", "arguments", "tool_call_id", "traceparent"?}. The client connects with
// `Authorization: Bearer TOKEN`, lists the tools, then calls each tool in order with
// `_meta: {"toolgate.dev/run_id": RUN_ID, "toolgate.dev/tool_call_id": ...}`, and prints one JSON
// line: {"protocol_version", "server_info", "tools", "next_cursor", "calls": [{"isError",
// "structuredContent", "_meta", "content"}]}. Anything the SDK throws ends it with exit status 1.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

async function run(url, token, mode, runId, calls) {
  if (mode !== "legacy") {
    throw new Error(`the 1.x client has no mode ${mode}: only legacy`);
  }
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { Authorization: `Bearer ${token}` } },
  });
  const client = new Client({ name: "toolgate-interop", version: "1.0.0" });
  await client.connect(transport);
  try {
    const listed = await client.listTools();
    const out = {
      protocol_version: transport.protocolVersion ?? null,
      server_info: client.getServerVersion() ?? null,
      session_id: transport.sessionId ?? null,
      tools: listed.tools,
      next_cursor: listed.nextCursor ?? null,
      calls: [],
    };
    for (const call of calls) {
      const meta = { "toolgate.dev/run_id": runId, "toolgate.dev/tool_call_id": call.tool_call_id };
      if (call.traceparent !== undefined) {
        meta.traceparent = call.traceparent;
      }
      const r = await client.callTool({ name: call.name, arguments: call.arguments, _meta: meta });
      out.calls.push({
        isError: Boolean(r.isError),
        structuredContent: r.structuredContent ?? null,
        _meta: r._meta ?? null,
        content: r.content ?? null,
      });
    }
    return out;
  } finally {
    await client.close();
  }
}

const args = process.argv.slice(2);
if (args.length !== 5) {
  console.error("usage: node client.mjs URL TOKEN MODE RUN_ID CALLS");
  process.exit(2);
}
try {
  const out = await run(args[0], args[1], args[2], args[3], JSON.parse(args[4]));
  console.log(JSON.stringify(out));
} catch (e) {
  console.error(e && e.stack ? e.stack : String(e));
  process.exit(1);
}
