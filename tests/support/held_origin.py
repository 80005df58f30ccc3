"""A real HTTP origin for Envoy tests whose answers the test holds and releases, and that names
itself in every answer (`x-origin`): how many requests it holds now is a condition to wait for,
never a sleep."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class HeldOrigin:
    """Answers 200 with `x-origin: <name>`; while `hold` is set, requests wait for `release`."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.held = 0
        self.served = 0
        self._changed = threading.Condition()
        self._open = threading.Event()
        self._open.set()
        origin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                with origin._changed:
                    origin.held += 1
                    origin._changed.notify_all()
                origin._open.wait(timeout=30)
                with origin._changed:
                    origin.held -= 1
                    origin.served += 1
                    origin._changed.notify_all()
                body = origin.name.encode()
                self.send_response(200)
                self.send_header("x-origin", origin.name)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def hold(self) -> None:
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    def wait_held(self, count: int, timeout: float = 10.0) -> None:
        with self._changed:
            if not self._changed.wait_for(lambda: self.held >= count, timeout=timeout):
                raise TimeoutError(f"{self.name}: {self.held} requests held, wanted {count}")

    def start(self) -> HeldOrigin:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.release()
        self._server.shutdown()
        self._server.server_close()


@contextmanager
def held_origins(*names: str) -> Iterator[dict[str, HeldOrigin]]:
    origins = {name: HeldOrigin(name).start() for name in names}
    try:
        yield origins
    finally:
        for origin in origins.values():
            origin.stop()
