#!/usr/bin/env python3
"""Sample tool services for the toolgate end-to-end scenario (standard library only).

Every tool answers POST with a JSON input object as its body:

  /search  {"results": [7 items of title, url, snippet, extra]}; an empty list when q == "nothing"
  /big     a JSON body of about 2 MiB (over a 1 MiB raw_bytes limit)
  /wide    a JSON body of about 64 KiB: within raw_bytes, but its projection exceeds a small
           agent_bytes
  /fail    HTTP 500 whose body holds RAW-SECRET-MARKER, which must never reach the agent
  /slow    sleeps --slow-seconds, then answers like /search

GET /healthz answers 200 for probes. The headers toolgate forwards (X-Run-Id, X-Tool-Call-Id,
traceparent) are echoed in each search item's `extra`, so a test can find them in the canonical
record's raw_response and check that the agent's projection dropped them.
"""

import argparse
import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SECRET_MARKER = "RAW-SECRET-MARKER"
MAX_INPUT_BYTES = 1 << 20


def search_results(query, headers):
    """Seven results, each with an `extra` field the projection is expected to drop."""
    if query == "nothing":
        return {"results": []}
    echo = {
        "run_id": headers.get("X-Run-Id"),
        "tool_call_id": headers.get("X-Tool-Call-Id"),
        "traceparent": headers.get("traceparent"),
    }
    return {
        "results": [
            {
                "title": f"Result {i} for {query}",
                "url": f"https://example.com/{i}",
                "snippet": f"Snippet {i} about {query}.",
                "extra": {"rank": i, "internal_score": 1.0 / i, "request": echo},
            }
            for i in range(1, 8)
        ]
    }


def big_body():
    """About 2 MiB of valid JSON."""
    return json.dumps({"blob": "x" * (2 * 1024 * 1024)}).encode()


def wide_body():
    """About 64 KiB of valid JSON: 525 rows of ~125 bytes."""
    rows = [{"id": i, "text": "w" * 100} for i in range(525)]
    return json.dumps({"rows": rows}).encode()


class ToolHandler(BaseHTTPRequestHandler):
    server_version = "sample-tools/1"
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        if self.path == "/healthz":
            self.reply(200, b'{"ok":true}')
        else:
            self.reply(404, b'{"error":"not found"}')

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_INPUT_BYTES:
            self.reply(413, b'{"error":"input too large"}')
            return
        raw = self.rfile.read(length) if length else b""
        try:
            data = json.loads(raw or b"{}")
        except ValueError:
            self.reply(400, b'{"error":"input is not JSON"}')
            return
        if not isinstance(data, dict):
            self.reply(400, b'{"error":"input is not an object"}')
            return

        path = self.path.split("?", 1)[0]
        if path == "/search":
            body = json.dumps(search_results(str(data.get("q", "")), self.headers)).encode()
            self.reply(200, body)
        elif path == "/big":
            self.reply(200, self.server.big)
        elif path == "/wide":
            self.reply(200, self.server.wide)
        elif path == "/fail":
            body = f"internal error: database password leaked {SECRET_MARKER}\n".encode()
            self.reply(500, body, "text/plain")
        elif path == "/slow":
            time.sleep(self.server.slow_seconds)
            body = json.dumps(search_results(str(data.get("q", "")), self.headers)).encode()
            self.reply(200, body)
        else:
            self.reply(404, b'{"error":"no such tool"}')

    def reply(self, status, body, content_type="application/json"):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            # The caller stopped reading (toolgate caps raw bodies); nothing to do.
            pass

    def log_message(self, fmt, *args):
        if self.server.verbose:
            sys.stderr.write("%s %s\n" % (self.address_string(), fmt % args))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=18080, help="port to bind (default 18080)")
    parser.add_argument("--slow-seconds", type=float, default=3.0,
                        help="how long /slow sleeps (default 3)")
    parser.add_argument("--verbose", action="store_true", help="log every request to stderr")
    args = parser.parse_args()

    server = ThreadingHTTPServer((args.host, args.port), ToolHandler)
    server.daemon_threads = True
    server.big = big_body()
    server.wide = wide_body()
    server.slow_seconds = args.slow_seconds
    server.verbose = args.verbose
    print(f"sample tools listening on {args.host}:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
