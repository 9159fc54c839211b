"""The official Python MCP client (`mcp`) against an MCP endpoint, for tests/integration/mcp/.

    client.py URL TOKEN MODE RUN_ID CALLS

MODE is `auto` (the SDK's default: probes `server/discover`, then falls back to the handshake)
or `legacy` (the `initialize` handshake). CALLS is a JSON list of
`{"name", "arguments", "tool_call_id", "traceparent"?}`. The client connects with
`Authorization: Bearer TOKEN`, lists the tools, then calls each tool in order with
`meta={"toolgate.dev/run_id": RUN_ID, "toolgate.dev/tool_call_id": ...}`. It prints one JSON line:

    {"protocol_version", "server_info", "tools": [<Tool as on the wire>],
     "calls": [{"isError", "structuredContent", "_meta", "content"}]}

Anything the SDK raises ends it with exit status 1 and the error on stderr.
"""

import asyncio
import json
import sys
import traceback

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client


def wire(model) -> dict:
    return model.model_dump(by_alias=True, exclude_none=True, mode="json")


async def run(url: str, token: str, mode: str, run_id: str, calls: list) -> dict:
    headers = {"Authorization": f"Bearer {token}"}
    timeout = httpx2.Timeout(30.0, read=60.0)
    async with httpx2.AsyncClient(headers=headers, timeout=timeout) as http:
        async with Client(streamable_http_client(url, http_client=http), mode=mode) as client:
            listed = await client.list_tools()
            out = {
                "protocol_version": client.protocol_version,
                "server_info": wire(client.server_info) if client.server_info else None,
                "tools": [wire(t) for t in listed.tools],
                "next_cursor": listed.next_cursor,
                "calls": [],
            }
            for call in calls:
                meta = {"toolgate.dev/run_id": run_id, "toolgate.dev/tool_call_id": call["tool_call_id"]}
                if "traceparent" in call:
                    meta["traceparent"] = call["traceparent"]
                result = await client.call_tool(call["name"], call.get("arguments"), meta=meta)
                r = wire(result)
                out["calls"].append(
                    {
                        "isError": bool(result.is_error),
                        "structuredContent": r.get("structuredContent"),
                        "_meta": r.get("_meta"),
                        "content": r.get("content"),
                    }
                )
            return out


def main() -> None:
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    url, token, mode, run_id, calls = sys.argv[1:]
    try:
        out = asyncio.run(run(url, token, mode, run_id, json.loads(calls)))
    except BaseException:  # the test reports whatever the SDK raised
        traceback.print_exc()
        sys.exit(1)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
