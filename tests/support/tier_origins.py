"""Two loopback HTTP origins, primary and secondary, that answer 200 and count each request by
(origin, the `x-ballast-tier` Envoy sent it with): what reached an origin, and in which tier. A
request whose path contains `/held/` is counted at once and answered only once `release()` is
called (it holds a slot of its tier's pool meanwhile)."""

from __future__ import annotations

import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType


class Origins:
    """Two loopback HTTP origins that count (origin, x-ballast-tier) per request."""

    def __init__(self) -> None:
        self.seen: Counter[tuple[str, str]] = Counter()
        self.held = threading.Event()
        self.servers = {name: self._server(name) for name in ("primary", "secondary")}

    def release(self) -> None:
        """Answer every held request (and those to come)."""
        self.held.set()

    def _server(self, name: str) -> ThreadingHTTPServer:
        seen, held = self.seen, self.held

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                seen[(name, self.headers.get("x-ballast-tier", ""))] += 1
                if "/held/" in self.path:
                    held.wait(30)
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                return

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server

    def port(self, name: str) -> int:
        return int(self.servers[name].server_address[1])

    def __enter__(self) -> Origins:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self.release()
        for server in self.servers.values():
            server.shutdown()
            server.server_close()
