"""A canned-answer HTTP server on 127.0.0.1 for the scripts' unit tests (standard library only).

    with FakeHttp() as server:
        server.answer("/readyz", 200, b"ok")
        wait_http(server.url("/readyz"), 5)

Each path answers what was last set for it (status, body, headers), or a list of answers in turn,
the last one repeated; an unknown path answers 404. Every request is kept in `requests` as
(method, path, headers, body).
"""

import http.server
import threading


class FakeHttp:
    def __init__(self):
        self.answers, self.requests = {}, []
        self.lock = threading.Lock()
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def serve(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                with fake.lock:
                    fake.requests.append((self.command, self.path, dict(self.headers), body))
                    queue = fake.answers.get(self.path.split("?")[0])
                    status, data, headers = (queue.pop(0) if len(queue) > 1 else queue[0]) \
                        if queue else (404, b"", {})
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = serve  # noqa: N815 (http.server's hook names)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def url(self, path="/"):
        return f"http://127.0.0.1:{self.port}{path}"

    def answer(self, path, *answers):
        """Sets what `path` answers: each answer a (status, body[, headers]) tuple, or just a
        status for an empty body; a str body is sent as UTF-8."""
        queue = []
        for a in answers:
            status, body, headers = (a, b"", {}) if isinstance(a, int) else (*a, {})[:3]
            queue.append((status, body.encode() if isinstance(body, str) else body, headers))
        with self.lock:
            self.answers[path] = queue

    def close(self):
        """Stops serving (again is harmless) and closes the socket."""
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
