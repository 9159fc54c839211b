"""An MCP server built with the official Python SDK (`mcp`, MCPServer), the upstream of toolgate's
`protocol: mcp` tools in tests/integration/mcp/.

    upstream.py --mode json|sse --marker MARKER --token-file PATH --log PATH

It listens on a free loopback port, stateless (no Mcp-Session-Id), answering with
`application/json` (`--mode json`) or `text/event-stream` (`--mode sse`), and prints
`LISTENING <port>` on stdout once it accepts connections. Every HTTP request it receives is
appended to `--log` as one JSON line (method, path, the Authorization and MCP-Protocol-Version
headers, the JSON-RPC body), so the test sees exactly what toolgate sent. It exits when its
stdin closes, so it never outlives the test that started it.

Tools:
- `search(q)`: structuredContent `{"results": [7 items], "seen": {...}}`; each item carries MARKER
  in `extra`, a field toolgate's projection drops; `seen` holds the ids toolgate put in `_meta`.
- `broken()`: fails, so the result has `isError: true` (its text carries MARKER).
- `rpcerror()`: answers with a JSON-RPC error (its message carries MARKER), not a result.
- `whoami()`: `{"results": [{"authorized": bool}]}`: whether the Authorization header equals
  `Bearer <content of --token-file>`. It never echoes the header.
- `slow(ms)`: sleeps, reporting progress every 100 ms, then answers like `search`.
"""

import argparse
import asyncio
import json
import os
import socket
import sys
import threading
from typing import Any

import uvicorn
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["json", "sse"], required=True)
    p.add_argument("--marker", required=True)
    p.add_argument("--token-file", required=True)
    p.add_argument("--log", required=True)
    args = p.parse_args()
    with open(args.token_file, encoding="utf-8") as f:
        expected_auth = "Bearer " + f.read().strip()
    marker = args.marker

    mcp = MCPServer("toolgate-test-upstream", version="1.0.0")

    def meta_ids(ctx: Context) -> dict[str, Any]:
        meta = ctx.request_context.meta
        meta = meta.model_dump(by_alias=True) if hasattr(meta, "model_dump") else dict(meta or {})
        return {
            "run_id": meta.get("toolgate.dev/run_id"),
            "tool_call_id": meta.get("toolgate.dev/tool_call_id"),
        }

    def search_result(q: str, ctx: Context) -> dict[str, Any]:
        items = [
            {
                "title": f"Result {i} for {q}",
                "url": f"https://example.com/{i}",
                "snippet": f"Snippet {i} about {q}.",
                "extra": marker,
            }
            for i in range(1, 8)
        ]
        return {"results": items, "seen": meta_ids(ctx)}

    @mcp.tool()
    def search(q: str, ctx: Context) -> dict[str, Any]:
        """Searches the test corpus."""
        return search_result(q, ctx)

    @mcp.tool()
    def broken() -> dict[str, Any]:
        """Always fails."""
        raise ToolError(f"the backend failed: {marker}")

    @mcp.tool()
    def rpcerror() -> dict[str, Any]:
        """Fails with a JSON-RPC error instead of a result."""
        raise MCPError(-32603, f"internal failure {marker}")

    @mcp.tool()
    def whoami(ctx: Context) -> dict[str, Any]:
        """Tells whether the request carried the expected bearer token."""
        headers = ctx.headers or {}
        return {"results": [{"authorized": headers.get("authorization") == expected_auth}]}

    @mcp.tool()
    async def slow(ms: int, ctx: Context) -> dict[str, Any]:
        """Answers like search after `ms` milliseconds, with progress notifications meanwhile."""
        steps = max(1, ms // 100)
        for i in range(steps):
            await asyncio.sleep(ms / steps / 1000)
            await ctx.report_progress(i + 1, steps)
        return search_result("slow", ctx)

    inner = mcp.streamable_http_app(json_response=(args.mode == "json"), stateless_http=True)
    log = open(args.log, "a", encoding="utf-8")  # open for the server's lifetime

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return await inner(scope, receive, send)
        messages, body = [], b""
        while True:
            m = await receive()
            messages.append(m)
            body += m.get("body", b"")
            if not m.get("more_body"):
                break
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            parsed = json.loads(body) if body else None
        except ValueError:
            parsed = body.decode("utf-8", "replace")
        entry = {
            "http_method": scope["method"],
            "path": scope["path"],
            "authorization": headers.get("authorization"),
            "protocol_version": headers.get("mcp-protocol-version"),
            "session_id": headers.get("mcp-session-id"),
            "body": parsed,
        }
        log.write(json.dumps(entry) + "\n")
        log.flush()
        replay = iter(messages)

        async def replayed():
            try:
                return next(replay)
            except StopIteration:
                return await receive()

        await inner(scope, replayed, send)

    # The test holds this process's stdin open: at EOF its parent is gone, and so is this server.
    def exit_at_eof() -> None:
        sys.stdin.buffer.read()
        os._exit(0)

    threading.Thread(target=exit_at_eof, daemon=True).start()

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))

    async def serve() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            if task.done():
                task.result()
                sys.exit("the server stopped before it started")
            await asyncio.sleep(0.01)
        print(f"LISTENING {port}", flush=True)
        await task

    asyncio.run(serve())


if __name__ == "__main__":
    main()
