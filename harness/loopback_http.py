"""A threaded HTTP server on loopback for scripted origins: bound to a free port, served on a
daemon thread until `close`."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class LoopbackHttp:
    """Serves `handler` on 127.0.0.1 (a free port) with `server` (a ThreadingHTTPServer)."""

    def __init__(self, handler: type[BaseHTTPRequestHandler],
                 server: type[ThreadingHTTPServer] = ThreadingHTTPServer) -> None:
        self.server = server(("127.0.0.1", 0), handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
